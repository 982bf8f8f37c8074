"""CUDA-graph capture of a converted and an unconverted model in one process, in either order, after
both ran eagerly and the converted one ran under torch.compile (pytest -m gpu). Each order runs in a
fresh process: what one order leaves behind (CuPy's state, compiled kernels, streams) is exactly
what the other must not depend on."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="autocnn.torch needs PyTorch (pip install 'autocnn[torch]')")
torchvision = pytest.importorskip("torchvision", reason="the scenario's model is torchvision's ResNet-18")

pytestmark = pytest.mark.gpu
ROOT = Path(__file__).resolve().parent.parent


def scenario(first: str) -> None:
    """Convert a copy of ResNet-18, run both eagerly, the converted one compiled, then capture both
    training steps (``first`` captured first) and replay each graph against an eager twin's step."""
    import copy

    import autocnn.torch as at
    from tests.bench_module import load_bench

    bench = load_bench()
    torch.manual_seed(0)
    plain = torchvision.models.resnet18(num_classes=10).cuda()
    converted = copy.deepcopy(plain)
    at.convert(converted, verbose=False)
    x = torch.randn(4, 3, 32, 32, device="cuda")
    y = torch.randint(0, 10, (4,), device="cuda")
    for model in (plain, converted):
        step, _ = bench.torch_step(model, x, y)
        step()
    compiled = torch.compile(converted)
    compiled(x).square().mean().backward()
    torch.cuda.synchronize()
    order = [("plain", plain), ("converted", converted)]
    if first == "converted":
        order.reverse()
    for name, model in order:
        twin = copy.deepcopy(model)
        twin_step, twin_opt = bench.torch_step(twin, x, y, capturable=True)
        step, opt = bench.torch_step(model, x, y, capturable=True)
        graph = bench.capture_step(step, opt)
        # The replayed step against one eager step from the same state (weights, buffers and Adam's
        # moments, copied: loading a state dict on one device shares its tensors): the updates are
        # compared, not the weights, whose difference after a step is mostly the step's size; and
        # only one step, since Adam amplifies the last bits that a library's nondeterministic sums
        # leave in near-zero gradients, step after step.
        with torch.no_grad():
            twin.load_state_dict(model.state_dict())
        twin_opt.load_state_dict(copy.deepcopy(opt.state_dict()))
        before = [p.detach().clone() for p in model.parameters()]
        graph.replay()
        twin_step()
        torch.cuda.synchronize()
        with torch.no_grad():
            for (pname, p), q, b in zip(twin.named_parameters(), model.parameters(), before):
                update = float((p - b).norm())
                assert update > 0, f"{name}: the eager step left {pname} unchanged"
                err = float((q - p).norm()) / update
                assert err <= 1e-2, f"{name}, captured after the other ({first} first): {pname}'s update off by {err:.2e}"
        print(f"captured and replayed: {name}")


@pytest.mark.parametrize("first", ["plain", "converted"])
def test_converted_and_plain_models_capture_in_either_order(first):
    if not torch.cuda.is_available():
        pytest.skip("this PyTorch has no CUDA (a CPU build?): install a CUDA build of PyTorch for these tests")
    run = subprocess.run([sys.executable, __file__, first], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, f"{first} first: exit {run.returncode}\n{run.stdout[-3000:]}\n{run.stderr[-6000:]}"
    assert run.stdout.count("captured and replayed") == 2, run.stdout


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    scenario(sys.argv[1])
