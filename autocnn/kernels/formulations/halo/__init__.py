"""The halo GEMM ("halo"): conv_fwd (stride 1) and conv_bwd_data (per stride phase) on Hopper's
warpgroup tensor cores, with each filter tap a shift of one shared-memory tile instead of a gather.

The wgmma formulation gathers its A operand (the unrolled input) into shared memory once per filter
tap: a 3x3 layer copies every input pixel from L2 nine times, and those copies, not the tensor
cores, bound its main loop (modern_14 on an H100: 66 of 74 us with no wgmma at all). Its worst case
is a GEMM with few columns, where the weights are small and nothing else is reused: scherer10's
second backward-data (16 input channels, 4x4 taps a phase) ran at 0.58x cuDNN in fp32.

Here the input is staged once as NHWC on a zero-padded grid of HD x VD positions per image (the
data at rows UP.., columns VP..), and the GEMM's rows are the grid's positions m = (n, i, j): on that
grid, tap (jr, js) of output row m reads position m + shift(jr, js), a constant. A block of BM rows
copies, per 32 channels, the HALO = BM + (Ra - 1) * VD + Sb - 1 positions all its taps read, once;
each tap's A operand is that tile from offset rel(tap). A position is a 128-byte row of the tile,
swizzled as the wgmma formulation's operands (16-byte chunk c of row r at c ^ (r % 8), r counted in
the 1024-byte atom, which is the address's bits 7-9): the tensor cores read a tile starting at any
row through the same descriptor, as they read a k-step starting 32 bytes into a row. (A layout of
16-byte chunk planes, the non-swizzled descriptor's, verified too but ran 10-35% slower in 42 of 42
paired configs on an H100.) Grid positions past the
output's rows and columns (Ha x Wb of the phase) are computed and dropped: 64 x 64 outputs on a
68 x 68 grid for scherer10_l2's phases, 14 x 14 on 16 x 16 for modern_14.

The weights (B: the GEMM's columns by the reduction's 32 channels, 128-byte swizzled as the wgmma
formulation's) come TPS taps a pipeline step; the halo of a channel block lands with its first step,
in one of SLOTS buffers (as many as the copies ahead can reach). fp32 is 3xTF32 as in the wgmma
formulation: both operands are staged as TF32 parts followed by the remainders' TF32 parts, and each
tap's 32 products go to partial sums of their own that are added to the totals in FP32.

Parameters: WGS warpgroups (BM = 64 * WGS rows), WBN columns (the wgmma's N), WSTAGES weight stages,
TPS taps per step (a divisor of every phase's taps), MT row tiles per block (one pipeline over all of
them: a block's first copies wait for L2 once per MT tiles), INFLIGHT (tf32: a step's wgmmas run on
through the next step's barrier, as in the wgmma formulation). conv_fwd takes stride 1 only (a strided
forward's taps are not shifts of one grid).

It trades the per-tap gathers for the grid's dropped positions: it wins where the A operand is most
of the copies (few GEMM columns, many taps: scherer10_l2's backward-data) and loses on 3x3 layers
with many channels, where the weights are most of the copies.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from autocnn.device import DeviceLimits
from autocnn.kernels.formulations.base import Buffers, Formulation, OpFormulation
from autocnn.kernels.geometry import cdiv, next_pow2, stride_phases
from autocnn.kernels.rules import arch_number, at_most, grid_rule, sixteen_bit_rule, smem_rule, threads_rule
from autocnn.kernels.space import Config, Constraint, Param
from autocnn.kernels.steps import WORKSPACE_ELEMENT, Launch

FORMULATION_HALO = "halo"
ARCH = 90           # wgmma: sm_90a only
BK = 32             # channels of the reduction per step: 8 chunks of 16 bytes
ALIGN_SLACK = 1024  # the weights' swizzle needs 1024-byte aligned stages; the kernel aligns its dynamic smem
TPS_CHOICES = (1, 2, 3, 4, 8, 9, 16)
TILE_CHOICES = (1, 2, 4, 8)


def split(problem: Any) -> bool:
    """3xTF32 for fp32 problems (the wgmma formulation's scheme)."""
    return problem.precision.tf32x3


@dataclass(frozen=True)
class HaloPhase:
    """One GEMM of the launch (conv_bwd_data: a stride phase; conv_fwd: the only one). Its outputs
    are the grid's first HA rows and WB columns; tap (jr, js) of Ra x Sb reads the staged grid at the
    row's position plus HBASE + rel(jr, js), rel = (Ra-1-jr)*VD + (Sb-1-js) (flipped: conv_bwd_data)
    or jr*VD + js (conv_fwd)."""
    a: int
    b: int
    Ha: int
    Wb: int
    ilo: int
    jlo: int
    Ra: int
    Sb: int
    HBASE: int

    @property
    def taps(self) -> int:
        return self.Ra * self.Sb


@dataclass(frozen=True)
class HaloGrid:
    """The staged input's grid: HD x VD positions per image, the data (SP x SQ) from row UP and
    column VP, zeros around it; and the GEMMs over it."""
    HD: int
    VD: int
    UP: int
    VP: int
    SP: int
    SQ: int
    phases: tuple[HaloPhase, ...]

    @staticmethod
    def of(problem: Any) -> "HaloGrid":
        p = problem
        if p.op == "conv_fwd":   # stride 1: Y(p, q) reads X(p - PT + r, q - PL + s), X padded in place
            pt, pl, pb, pr = p.padding   # (top, left, bottom, right)
            phase = HaloPhase(0, 0, p.P, p.Q, 0, 0, p.R, p.S, 0)
            return HaloGrid(max(p.H + pt + pb, p.P + p.R - 1), max(p.W + pl + pr, p.Q + p.S - 1), pt, pl, p.H, p.W,
                            (phase,))
        phases = stride_phases(p)
        up = max([0] + [ph.Ra - 1 - ph.ilo for ph in phases])
        vp = max([0] + [ph.Sb - 1 - ph.jlo for ph in phases])
        hd = up + max([p.P] + [ph.ilo + ph.Ha for ph in phases])
        vd = vp + max([p.Q] + [ph.jlo + ph.Wb for ph in phases])
        out = tuple(HaloPhase(ph.a, ph.b, ph.Ha, ph.Wb, ph.ilo, ph.jlo, ph.Ra, ph.Sb,
                              (ph.ilo + up - max(ph.Ra - 1, 0)) * vd + ph.jlo + vp - max(ph.Sb - 1, 0))
                    for ph in phases)
        return HaloGrid(hd, vd, up, vp, p.P, p.Q, out)

    def halo(self, bm: int) -> int:
        """The positions a block of bm rows reads (the largest phase's)."""
        return max(bm + (ph.Ra - 1) * self.VD + ph.Sb - 1 for ph in self.phases if ph.taps)

    def pitch(self, bm: int) -> int:
        """A halo slot's positions: the halo rounded up to whole 1024-byte swizzle atoms (8 positions
        of 128 bytes), so that every slot starts on one."""
        return 8 * cdiv(self.halo(bm), 8)

    def steps_per_block(self, tps: int) -> int:
        """The fewest pipeline steps of one channel block over the phases with taps (at least 1: a TPS
        past the taps is rejected by its own rule)."""
        return max(1, min(ph.taps // tps for ph in self.phases if ph.taps))


def reduction_channels(problem: Any) -> int:
    return problem.C if problem.op == "conv_fwd" else problem.K


def gemm_columns(problem: Any) -> int:
    return problem.K if problem.op == "conv_fwd" else problem.C


def slots(grid: HaloGrid, stages: int, tps: int) -> int:
    """Halo buffers: the copies run STAGES - 1 steps ahead, so the halo of a channel block is written
    while the steps of up to (STAGES - 2) / steps_per_block earlier blocks may still read theirs."""
    return cdiv(stages - 1, grid.steps_per_block(tps)) + 1


def smem_bytes(grid: HaloGrid, wgs: int, wbn: int, stages: int, tps: int, split_: bool) -> int:
    """The weight stages (TPS taps of WBN rows of 128 bytes each) and the halo slots (PITCH positions
    of 128 bytes), twice with 3xTF32 (the small parts), and the alignment slack."""
    b = stages * tps * wbn * 128
    h = slots(grid, stages, tps) * grid.pitch(64 * wgs) * 128
    return (2 if split_ else 1) * (b + h) + ALIGN_SLACK


def stage_workspaces(problem: Any) -> tuple[tuple[str, int], ...]:
    """The staged input on the grid ("at": NHWC, zero-padded) and the weights ("wt": column, tap,
    channel), float32 elements, twice each with 3xTF32."""
    p, g, parts = problem, HaloGrid.of(problem), 2 if split(problem) else 1
    kred = reduction_channels(p)
    return (("at", parts * p.N * g.HD * g.VD * kred), ("wt", parts * gemm_columns(p) * p.R * p.S * kred))


class _HaloGemm(OpFormulation):
    """What the two ops' halo GEMMs share: parameters, rules, staging and launches."""

    formulation = FORMULATION_HALO
    target_suffix = "a"
    source = ""   # the op's input that is staged on the grid
    ARGS: tuple[str, ...] = ()

    def params(self, problem: Any) -> list[Param]:
        return [
            Param("WGS", (1, 2, 4), "warpgroups along the GEMM's rows (64 grid positions each)"),
            Param("WBN", (64, 128, 256, 32, 16), "GEMM columns per block: the wgmma's N"),
            Param("WSTAGES", (3, 4, 2, 5, 6), "weight stages of the pipeline"),
            Param("TPS", TPS_CHOICES, "filter taps per pipeline step (their weights staged together; a divisor "
                  "of every phase's taps)"),
            Param("MT", TILE_CHOICES, "row tiles per block, one after another through one pipeline"),
            Param("INFLIGHT", (0, 1), "a step's group of wgmmas left in flight across the next step's barrier (tf32)"),
        ]

    def constraints(self, problem: Any, limits: DeviceLimits) -> list[Constraint]:
        p = problem
        grid = HaloGrid.of(p)
        kred, cols = reduction_channels(p), gemm_columns(p)
        rows = p.N * grid.HD * grid.VD
        taps = sorted({ph.taps for ph in grid.phases if ph.taps})

        def arch(_):
            n = arch_number(limits.arch)
            return None if n == ARCH else f"the halo GEMM runs on wgmma, sm_{ARCH} (Hopper) only, not {limits.arch}"

        def channels(_):
            name = "C (X's channels)" if p.op == "conv_fwd" else "K (dY's channels)"
            return None if kred % 4 == 0 else f"the staged grid moves 16-byte chunks: {name} must be a multiple of 4, not {kred}"

        def stride(_):
            return None if p.op != "conv_fwd" or tuple(p.stride) == (1, 1) else (
                f"the halo forward takes stride 1 only (its taps are shifts of one grid), not {tuple(p.stride)}")

        def divides_taps(tps):
            bad = [t for t in taps if t % tps]
            return None if not bad else f"TPS={tps} does not divide the taps of every phase ({', '.join(map(str, taps))})"

        def registers(wgs, wbn, tps):
            # fp32 keeps each of a step's TPS taps' partial sums beside the totals
            acc = wbn // 2 * (1 + (tps if split(p) else 0))
            cap = 64 if wgs == 4 else 128
            return None if acc <= cap else (
                f"WGS={wgs}, WBN={wbn}, TPS={tps} hold {acc} accumulator registers per thread (at most {cap}"
                + ("; fp32 keeps each tap's partial sums beside the totals)" if split(p) else ")"))

        def pipelined(stages, inflight):
            if not inflight:
                return None
            if split(p):
                return "INFLIGHT=1 is tf32 only: fp32 adds each tap's partial sums once its wgmmas completed"
            return None if stages >= 3 else (
                f"INFLIGHT=1 needs at least 3 stages (one for the copies ahead, one for the wgmmas in flight), not {stages}")

        def workspace(_):
            need = WORKSPACE_ELEMENT.size * sum(n for _, n in stage_workspaces(p))
            return None if need <= limits.workspace_bytes else (
                f"the halo grid's staged copies ({need} bytes) exceed the workspace limit of {limits.workspace_bytes} bytes")

        def addressable(_):
            return None if rows < 2 ** 31 - 2 ** 20 else f"the grid's {rows} positions are past 32-bit indexing"

        return [
            sixteen_bit_rule(p, self.formulation, "WGS", "its wgmma products take FP32 operands as TF32 (one product "
                                                         "a term, or 3xTF32), not BF16 or FP16 ones"),
            Constraint(("WGS",), arch),
            Constraint(("WGS",), channels),
            Constraint(("WGS",), stride),
            Constraint(("WGS",), workspace),
            Constraint(("WGS",), addressable),
            Constraint(("TPS",), divides_taps),
            Constraint(("WGS", "WBN", "TPS"), registers),
            Constraint(("WSTAGES", "INFLIGHT"), pipelined),
            threads_rule(limits, ("WGS",), lambda wgs: 128 * wgs),
            at_most("WBN", max(16, next_pow2(cols)), f"only {cols} GEMM columns"),
            Constraint(("WGS",), lambda wgs: None if wgs == 1 or 64 * wgs <= max(64, next_pow2(rows))
                       else f"only {rows} grid positions"),
            grid_rule(("WBN",), lambda wbn: cdiv(cols, wbn)),
            smem_rule(limits, ("WGS", "WBN", "WSTAGES", "TPS"),
                      lambda wgs, wbn, st, tps: smem_bytes(grid, wgs, wbn, st, tps, split(p))),
        ]

    def default_candidates(self, problem: Any) -> list[dict[str, Any]]:
        grid = HaloGrid.of(problem)
        taps = [ph.taps for ph in grid.phases if ph.taps] or [1]
        tps = [t for t in TPS_CHOICES if all(n % t == 0 for n in taps)]
        narrow = max(16, next_pow2(gemm_columns(problem)))
        widths = [w for w in (narrow, 64, 128) if w <= max(16, narrow)] if narrow < 64 else [128, 64]
        out, base = [], {"formulation": FORMULATION_HALO, "MT": 1, "INFLIGHT": 0}
        for wbn in dict.fromkeys(widths):
            for t in sorted(tps, key=lambda t: (abs(t - 4), t))[:2]:
                out.append({**base, "WGS": 2, "WBN": wbn, "WSTAGES": 3, "TPS": t})
        out.append({**base, "WGS": 1, "WBN": min(64, narrow), "WSTAGES": 3, "TPS": 1})
        return out

    def context(self, problem: Any, config: Config) -> dict[str, Any]:
        g = HaloGrid.of(problem)
        bm = 64 * config["WGS"]
        return {"BK": BK, "ALIGN_SLACK": ALIGN_SLACK, "SPLIT": split(problem), "HD": g.HD, "VD": g.VD, "UP": g.UP,
                "VP": g.VP, "SP": g.SP, "SQ": g.SQ, "halo_phases": g.phases, "PITCH": g.pitch(bm),
                "SLOTS": slots(g, config["WSTAGES"], config["TPS"]), "KRED": reduction_channels(problem),
                "COLS": gemm_columns(problem), "op_name": problem.op, "MT": config["MT"], "INFLIGHT": config["INFLIGHT"]}

    def launches(self, problem: Any, config: Config) -> tuple[Launch, ...]:
        p, c, g = problem, config, HaloGrid.of(problem)
        threads = (128 * c["WGS"], 1, 1)
        kred, cols = reduction_channels(p), gemm_columns(p)
        stage_a = Launch(f"{p.op}_stage_a", (g.HD, cdiv(kred, 32), p.N), threads, 0, (self.source, "at"))
        stage_w = Launch(f"{p.op}_stage_w", (min(1024, cdiv(cols * p.R * p.S * kred, threads[0])), 1, 1), threads, 0,
                         ("w", "wt"))
        tiles = cdiv(p.N * g.HD * g.VD, 64 * c["WGS"])
        main = Launch(p.op, (cdiv(tiles, c["MT"]), cdiv(cols, c["WBN"]), len(g.phases)), threads,
                      smem_bytes(g, c["WGS"], c["WBN"], c["WSTAGES"], c["TPS"], split(p)), self.ARGS)
        return stage_a, stage_w, main

    def buffers(self, problem: Any, config: Config) -> Buffers:
        return (), stage_workspaces(problem)

    def code_helpers(self) -> tuple:
        return (HaloGrid, HaloPhase, split, slots, smem_bytes, stage_workspaces, reduction_channels, gemm_columns,
                stride_phases, BK, ALIGN_SLACK, ARCH, TILE_CHOICES, self.ARGS)


class HaloConvFwd(_HaloGemm):
    op = "conv_fwd"
    summary = "Hopper tensor-core GEMM whose filter taps are shifts of one staged halo tile (stride 1; fp32 as 3xTF32)"
    templates = ("halo_conv_fwd.cu.j2", "_halo_gemm.cuh.j2", "_wgmma_ops.cuh.j2")
    source = "x"
    ARGS = ("at", "wt", "bias", "y")


class HaloConvBwdData(_HaloGemm):
    op = "conv_bwd_data"
    summary = "Hopper tensor-core GEMM per stride phase whose filter taps are shifts of one staged halo tile " \
              "(fp32 as 3xTF32)"
    templates = ("halo_conv_bwd_data.cu.j2", "_halo_gemm.cuh.j2", "_wgmma_ops.cuh.j2")
    source = "dy"
    ARGS = ("at", "wt", "dx")


HALO = Formulation(FORMULATION_HALO, (HaloConvFwd(), HaloConvBwdData()))
