"""The circular row buffer that Scherer, Schulz & Behnke (2010) slide down a source map, shared by
the "circular" forward (circular.py) and the one-pass backward (circular_bwd.py).

A block owns a strip of TQ output columns, PBLK output rows of it, and walks down those rows PPS
at a time (a step). Step t reads the input rows [t*E, t*E + NEED) of the block (relative to its
first input row), E = PPS*SH rows entering per step, NEED = (PPS-1)*SH + R. The buffer holds ROWS
>= NEED rows, row i in slot i % ROWS, so each step loads only the rows that enter it. Rows that
fit into slots no longer read (ROWS > NEED) are loaded while the current step computes
("prefetch"); rows the step needs that did not fit are loaded before it, behind a barrier. With
ROWS >= NEED + E every row is a prefetch and a step costs one barrier.

A buffer row holds the strip's IWT = (TQ-1)*SW + S input columns split by stride phase: column x
lives at phase x % SW, position x // SW (MW = TQ - 1 + ceil(S/SW) positions a phase), so the
threads of consecutive output columns read consecutive words (no bank conflicts at any stride).

``row_schedule`` is the kernels' loop in Python: the tests check on it that every row is loaded
once, only into a slot nobody reads until a barrier has passed, and that every output row sees
exactly its R source rows.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from autocnn.kernels.geometry import cdiv
from autocnn.kernels.space import Constraint


# Both kernels name the blocks per multiprocessor ptxas should keep registers for (the second
# argument of __launch_bounds__); with the block size alone, CUDA 13's ptxas aimed at full occupancy
# and spilled blocks of 64 threads at 32 registers.
MINB_CHOICES = (1, 2, 4)
MAX_THREADS_PER_SM = 2048   # compute capability 8.0 and 9.0


def minb_rule(threads_of: Callable[..., int], params: tuple[str, ...]) -> Constraint:
    """MINB blocks of the config's size must fit on a multiprocessor."""
    def check(minb, *values):
        n = minb * threads_of(*values)
        return None if n <= MAX_THREADS_PER_SM else \
            f"MINB={minb} blocks of {threads_of(*values)} threads exceed {MAX_THREADS_PER_SM} threads a multiprocessor"
    return Constraint(("MINB", *params), check)


@dataclass(frozen=True)
class RowWindow:
    """The buffer's geometry along rows: filter height, stride, output rows per step, slots."""

    R: int
    SH: int
    PPS: int
    ROWS: int

    @property
    def enter(self) -> int:
        """Rows entering the window each step."""
        return self.PPS * self.SH

    @property
    def need(self) -> int:
        """Rows one step reads."""
        return (self.PPS - 1) * self.SH + self.R

    def total(self, steps: int) -> int:
        """Rows a block of ``steps`` steps reads."""
        return (steps - 1) * self.enter + self.need

    def overlapped(self) -> bool:
        """Whether every row after the first step's is loaded while a step computes."""
        return self.ROWS >= self.need + self.enter


def strip_width(TQ: int, S: int, SW: int) -> int:
    """Input columns under TQ output columns."""
    return (TQ - 1) * SW + S


def phase_len(TQ: int, S: int, SW: int) -> int:
    """Positions of one stride phase of a buffer row (ceil(strip_width / SW))."""
    return TQ - 1 + cdiv(S, SW)


def block_steps(P: int, PBLK: int, PPS: int, p0: int) -> int:
    """Steps of the block whose first output row is p0 (the last block of a column may have fewer)."""
    return cdiv(min(PBLK, P - p0), PPS)


@dataclass(frozen=True)
class StepRows:
    """What one step of the kernels' loop does with the buffer."""

    before: tuple[int, ...]      # rows loaded before the step's barrier (it needs them)
    prefetch: tuple[int, ...]    # rows loaded after it, into slots the step does not read
    reads: tuple[int, ...]       # rows the step's compute reads
    extra_barrier: bool          # a barrier before the "before" loads (their slots were read last step)


def row_is_read(win: RowWindow, i: int) -> bool:
    """Whether some step reads relative row i: with a stride above the rows a step reads
    (enter > need), the rows between two steps' windows are read by none, and not loaded."""
    return win.enter <= win.need or i % win.enter < win.need


def row_schedule(win: RowWindow, steps: int) -> list[StepRows]:
    """The row loads of one block (one channel group), step by step, as the kernels do them."""
    total = win.total(steps)
    loaded = 0
    out = []
    for t in range(steps):
        hi = t * win.enter + win.need
        before: tuple[int, ...] = ()
        missing = loaded < hi
        if missing:
            before = tuple(i for i in range(loaded, hi) if row_is_read(win, i))
            loaded = hi
        pre_hi = min(t * win.enter + win.ROWS, total)
        prefetch = tuple(i for i in range(loaded, pre_hi) if row_is_read(win, i))
        loaded = max(loaded, pre_hi)
        reads = tuple(range(t * win.enter, t * win.enter + win.need))
        out.append(StepRows(before, prefetch, reads, extra_barrier=missing and t > 0))
    return out


def flush_rows(R: int, SH: int, t: int) -> tuple[int, ...]:
    """The backward's error accumulator: rows complete after step t (no later step touches them),
    which the kernel adds to dX and clears. Rows between windows (SH > R) are never touched."""
    return tuple(range(t * SH, t * SH + min(SH, R)))


def final_rows(R: int, SH: int, steps: int) -> tuple[int, ...]:
    """Rows still in the accumulator after the last step."""
    return tuple(range(steps * SH, (steps - 1) * SH + R))
