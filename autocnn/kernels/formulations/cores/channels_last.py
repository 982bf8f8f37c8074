"""The channel runs of channels-last (NHWC) kernels (window_gather, depthwise, direct; their loads
and stores in _channels_last.cuh.j2): a thread owns V consecutive channels of a pixel.

Vector width and padding rule, for any channel count C: a run is moved as one or more 16-byte (or
narrower: V elements of V * size bytes, at most 16 a piece) accesses only where C % V == 0, so that
every run of every pixel starts on a multiple of V elements (the buffer itself is 256-byte aligned)
and holds V channels; otherwise the kernel rounds the channels up to whole runs (cdiv(C, V) runs a
pixel, nothing padded in memory) and moves the last, partial run element by element, reading zeros
past C and writing only the channels it holds. V is a tuning parameter; a V above the channel
count's next power of two is not offered, as all but one of its lanes would idle.
"""
from __future__ import annotations

from autocnn.kernels.geometry import next_pow2

RUNS = (1, 2, 4, 8)   # channels per thread


def run_choices(channels: int) -> tuple[int, ...]:
    """The channels a thread may own for a channel count: up to its next power of two."""
    return tuple(v for v in RUNS if v == 1 or v <= next_pow2(channels))


def whole_runs(channels: int, run: int) -> bool:
    """Whether every run of ``run`` channels is whole and aligned (vector accesses)."""
    return channels % run == 0
