"""The training library's workspace buffers: one per operation, shared by its plans (NumPy stands
in for CuPy: the arenas only allocate and slice)."""
from __future__ import annotations

import numpy as np
import pytest

from autocnn.dispatch.workspace_arena import ALIGN_ELEMENTS, WorkspaceArenas, WorkspaceLayout


def test_a_layout_aligns_every_workspace():
    layout = WorkspaceLayout.of("conv_wgrad", (("ws", 100), ("ws_bias", 3), ("tail", 0)))
    offsets = [offset for _, offset, _ in layout.slots]
    assert offsets == [0, 2 * ALIGN_ELEMENTS, 3 * ALIGN_ELEMENTS]
    assert layout.elements == 4 * ALIGN_ELEMENTS
    assert WorkspaceLayout.of("conv_fwd", ()).elements == 0


def test_plans_of_one_operation_share_a_buffer_as_large_as_the_largest():
    arenas = WorkspaceArenas(np)
    arenas.reserve("layer1", "conv_wgrad", (("ws", 1000), ("ws_bias", 10)))
    arenas.reserve("layer2", "conv_wgrad", (("ws", 5000), ("ws_bias", 50)))
    arenas.reserve("layer3", "conv_wgrad", (("ws", 10),))
    arenas.reserve("fwd", "conv_fwd", (("xt", 300),))
    arenas.reserve("nothing", "avgpool_fwd", ())
    one, two, three = (arenas.views(k) for k in ("layer1", "layer2", "layer3"))
    assert np.shares_memory(one["ws"], two["ws"]) and np.shares_memory(two["ws"], three["ws"])
    assert not np.shares_memory(one["ws"], arenas.views("fwd")["xt"])
    assert arenas.views("nothing") == {}
    assert arenas.bytes_by_op() == {"conv_wgrad": 4 * WorkspaceLayout.of("conv_wgrad", (("ws", 5000), ("ws_bias", 50))).elements,
                                    "conv_fwd": 4 * WorkspaceLayout.of("conv_fwd", (("xt", 300),)).elements}
    assert arenas.total_bytes == sum(arenas.bytes_by_op().values())
    # Every view has its plan's size, and a plan's views never overlap one another.
    assert [one["ws"].size, one["ws_bias"].size, two["ws"].size, two["ws_bias"].size] == [1000, 10, 5000, 50]
    assert not np.shares_memory(two["ws"], two["ws_bias"])
    for view in (*one.values(), *two.values()):
        assert view.__array_interface__["data"][0] % (4 * ALIGN_ELEMENTS) == \
            arenas._buffers["conv_wgrad"].__array_interface__["data"][0] % (4 * ALIGN_ELEMENTS)


def test_growing_rebuilds_every_view_of_the_operation_on_the_new_buffer():
    arenas = WorkspaceArenas(np)
    arenas.reserve("small", "conv_wgrad", (("ws", 100),))
    before = arenas.views("small")["ws"]
    arenas.reserve("big", "conv_wgrad", (("ws", 10_000),))
    after = arenas.views("small")["ws"]
    assert not np.shares_memory(before, after)
    assert np.shares_memory(after, arenas.views("big")["ws"])
    assert arenas._retired == []    # nothing captured: the old buffer is released


def test_after_a_capture_a_grown_buffer_keeps_the_old_one_alive():
    arenas = WorkspaceArenas(np)
    arenas.reserve("small", "conv_fwd", (("xt", 100),))
    old = arenas._buffers["conv_fwd"]
    arenas.captured = True
    arenas.reserve("big", "conv_fwd", (("xt", 10_000),))
    assert any(b is old for b in arenas._retired)


def test_views_of_an_unprepared_plan_are_refused_by_name():
    arenas = WorkspaceArenas(np)
    arenas.reserve("p", "conv_fwd", (("xt", 10),))
    arenas.forget("p")
    with pytest.raises(KeyError, match="prepare its plan first"):
        arenas.views("p")
