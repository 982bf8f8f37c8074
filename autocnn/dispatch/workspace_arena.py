"""Scratch memory for a model's kernels, allocated once: one buffer per operation, shared by its plans.

A kernel plan may need workspaces (a two-pass weight gradient's split sums, an unrolled or NHWC copy
of an operand, transformed tiles); each is at most the workspace limit (autocnn.device). Giving
every layer's plan its own buffers makes a model's scratch memory the sum over its layers; but the
plans of one operation never run at the same time: the forward and backward-data kernels run one
after another on the main stream, the weight gradients one after another on the side stream
(CudaBackend.parameter_gradients). So the plans of one operation share one buffer, as large as the
largest of them needs, and a model's scratch memory is the sum over operations of that maximum.

A plan's workspaces are views into its operation's buffer, each starting at a multiple of
ALIGN_ELEMENTS (256 bytes: vector loads and cp.async need 16-byte alignment; 256 matches what
CUDA's allocator gives a buffer of its own). A buffer grows when a larger plan is prepared, and
every view of that operation is rebuilt on the new one. Once a CUDA graph has been captured, the old
buffer is kept alive: the graph may still write there until it is captured again.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Hashable

ALIGN_ELEMENTS = 64   # float32 elements: 256 bytes


def _aligned(n: int) -> int:
    return -(-max(1, n) // ALIGN_ELEMENTS) * ALIGN_ELEMENTS


@dataclass(frozen=True)
class WorkspaceLayout:
    """Where one plan's workspaces lie in its operation's buffer: (name, offset, elements) each."""

    op: str
    slots: tuple[tuple[str, int, int], ...]

    @staticmethod
    def of(op: str, workspaces: tuple[tuple[str, int], ...]) -> "WorkspaceLayout":
        slots, offset = [], 0
        for name, elements in workspaces:
            slots.append((name, offset, max(1, elements)))
            offset += _aligned(elements)
        return WorkspaceLayout(op, tuple(slots))

    @property
    def elements(self) -> int:
        """The buffer elements this plan needs (0: it has no workspace)."""
        return max((offset + _aligned(n) for _, offset, n in self.slots), default=0)


@dataclass
class WorkspaceArenas:
    """The workspace buffers of one backend: ``reserve`` a plan's workspaces when it is prepared,
    then ``views(key)`` are the arrays its launches take."""

    xp: Any                                   # CuPy (NumPy in CPU tests): empty(n, dtype=float32)
    captured: bool = False                    # set once a CUDA graph may hold pointers into the buffers
    _buffers: dict[str, Any] = field(default_factory=dict)
    _layouts: dict[Hashable, WorkspaceLayout] = field(default_factory=dict)
    _views: dict[Hashable, dict[str, Any]] = field(default_factory=dict)
    _retired: list[Any] = field(default_factory=list)

    def reserve(self, key: Hashable, op: str, workspaces: tuple[tuple[str, int], ...]) -> None:
        """Place the workspaces of the plan ``key`` (an operation ``op``'s) in that operation's buffer,
        growing it if they do not fit."""
        layout = WorkspaceLayout.of(op, tuple(workspaces))
        self._layouts[key] = layout
        if not layout.slots:
            self._views[key] = {}
            return
        have = self._buffers.get(op)
        if have is None or have.size < layout.elements:
            if have is not None and self.captured:
                self._retired.append(have)
            self._buffers[op] = self.xp.empty(layout.elements, dtype=self.xp.float32)
            for other, other_layout in self._layouts.items():
                if other_layout.op == op:
                    self._views[other] = self._slice(other_layout)
        else:
            self._views[key] = self._slice(layout)

    def _slice(self, layout: WorkspaceLayout) -> dict[str, Any]:
        buffer = self._buffers[layout.op]
        return {name: buffer[offset:offset + n] for name, offset, n in layout.slots}

    def views(self, key: Hashable) -> dict[str, Any]:
        try:
            return self._views[key]
        except KeyError:
            raise KeyError(f"no workspaces reserved for {key!r}: prepare its plan first") from None

    def forget(self, key: Hashable) -> None:
        """Drop a plan's views (its operation's buffer stays: the plans left may need it)."""
        self._layouts.pop(key, None)
        self._views.pop(key, None)

    @property
    def total_bytes(self) -> int:
        """The scratch memory the buffers hold now (retired ones not counted)."""
        return 4 * sum(int(b.size) for b in self._buffers.values())

    def bytes_by_op(self) -> dict[str, int]:
        return {op: 4 * int(b.size) for op, b in self._buffers.items()}
