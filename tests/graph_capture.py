"""PyTorch's CUDA-graph recipe for a loaded plan, shared by the GPU tests that capture one: run once
on a side stream (the warm-up), then captured on a second stream."""
from __future__ import annotations

from typing import Any


def warm_up_then_capture(cp: Any, loaded: Any, buffers: dict[str, Any], output: Any) -> tuple[Any, Any, Any]:
    """(what the warm-up wrote to ``output``, the captured graph, the capturing stream). ``output``
    is NaN when this returns: the capture recorded the plan without running it (checked here)."""
    side, capture = cp.cuda.Stream(non_blocking=True), cp.cuda.Stream(non_blocking=True)
    with side:
        loaded(buffers, stream=side)
    side.synchronize()
    eager = output.copy()
    output.fill(cp.nan)
    cp.cuda.Device().synchronize()
    with capture:
        capture.begin_capture()
        loaded(buffers, stream=capture)
        graph = capture.end_capture()
    assert bool(cp.isnan(output).all()), "the capture ran the plan instead of recording it"
    return eager, graph, capture
