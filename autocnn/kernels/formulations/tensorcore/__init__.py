"""The tensor-core implicit GEMM ("tc"): warp-level mma.sync, m16n8k8 on TF32 operands (fp32, tf32)
or m16n8k16 on 16-bit ones (bf16, fp16).

It serves the three convolutions through the same GEMM views as the igemm formulation (conv_fwd:
M = output pixels, N = filters; conv_bwd_data: one GEMM per stride phase; conv_wgrad: M = filters,
N = C*R*S with a split reduction). Its templates sit beside this module: the core tcgemm.cuh.j2,
the operand gathers gemm_operands_<op>.cuh.j2 and the kernels tc_<op>.cu.j2.

Precision comes from the problem: fp32 renders 3xTF32 (FP32-accurate; each tile's products are
summed into the total in FP32, because the tensor cores' own accumulation does not round to
nearest), tf32 one product per term, its operands rounded to nearest or truncated (TF32_ROUND).
In fp32, CROSS=1 (with paired or quad fragment reads) runs 3xTF32's two cross products as one
m16n8k16 BF16 mma per k-step instead of two TF32 ones, each lane forming the BF16 registers from its
own fragments (_mma_sync.cuh.j2's mma_cross): each product stays within about 2**-17 of itself.
The same split serves winograd's generated products (MMA_CROSS) and fft's tensor-core
multiply-accumulate (MAC_CROSS).

bf16 and fp16 (one 16-bit type for activations, filters and outputs) run m16n8k16 mmas
(.bf16 / .f16) on the values as stored, one product a term, exact in FP32, FP32 accumulators, each
output rounded once as it is stored (the shared epilogues), conv_wgrad's split sums through the FP32
workspace (TWO_PASS; 16-bit outputs take no atomics). Operands move as 16-bit patterns from global to
shared memory and into the fragments (cores/_mma16_fragments.cuh.j2), every operand staged along
the reduction; the k-step is 16 and BK a multiple of it. VEC and PAD count 32-bit words in every
precision: VEC=4 is a 16-byte load, 8 elements of 16 bits, so conv_fwd's filters take it where
C*R*S % 8 == 0 and its NHWC input where C % 8 == 0 as well (the runs of 8 then start aligned at
k % 8 == 0 and never cross a tap); any other channel count moves single elements (VEC=1), and the
tiles' ragged edges and the gathers' padding read as zeros either way. A single 16-bit element is
copied by its thread (cp.async moves no fewer than 4 bytes).

Parameters: block tile BM x BN x BK, warps WM x WN (the warp tile is BM/WM x BN/WN), FRAG (how
fragments are read from shared memory and rounded to TF32: see tcgemm.cuh.j2), pipeline
STAGES with CP_ASYNC (cp.async global->shared copies; without it, a register double buffer),
shared-memory padding PAD_A/PAD_B (bank conflicts of the fragment reads), TABLE_A (the A gather's
per-k context tabulated in shared memory), UNROLL_K; for conv_fwd VEC (16-byte loads of the
operands contiguous along the reduction) and NHWC (X and W staged as NHWC / KRSC in a workspace by
two small kernels first, so that both operands are contiguous along the reduction k = (r,s,c):
the gather's index work per element becomes per float4); and for conv_wgrad SPLITK with TWO_PASS (the
splits' partial sums combined by atomics, or written to a workspace and summed in a fixed order by
the second pass igemm runs too (cores/workspaces.py): deterministic results, no zeroing of the
outputs).

Channel groups and dilation, for the three: a GEMM per group (igemm's views over C/groups channels
and K/groups filters), the groups blocks along z (conv_fwd; conv_bwd_data's group * phases +
phase, its phases those of geometry.tap_phases) or x (conv_wgrad, whose z holds the splits), each
block offsetting its indices to its group's channels and filters (cores/_conv_groups.cuh.j2, the
operands igemm shares), taps the dilation apart. It takes groups of at least one mma k-step of
channels (8 for the TF32 mmas, 16 for the 16-bit ones: ResNeXt-50 32x4d's later stages; igemm
serves the smaller ones) and reads a grouped conv_fwd's filters as stored (NHWC=0: the staging
kernels copy dense filters); a dilated one may stage.

In fp32 and tf32 the operations' heuristic defaults do not prefer it (they list the FP32 cores
first): its speed against the other formulations is for the tuner to find. For bf16 and fp16 they
list its defaults first, where the tensor cores run at twice the TF32 rate (the SIMT cores follow,
the fallback where tc's defaults do not fit: before sm_80, a rule of the shape).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from autocnn.device import DeviceLimits
from autocnn.kernels.formulations.base import (Buffers, Formulation, OpFormulation, choices_upto, grouping_text,
                                               pragma_unroll)
from autocnn.kernels.formulations.cores.mma_rules import (accumulator_violation, arch_violation, mma16_operand,
                                                           warp_tile_violation)
from autocnn.kernels.formulations.cores.staging import nhwc_stage_launches, nhwc_stage_workspaces
from autocnn.kernels.formulations.cores.workspaces import WORKSPACE_LIMIT_BYTES, wgrad_reduce_launch
from autocnn.kernels.geometry import cdiv, next_pow2, tap_phases, tap_steps
from autocnn.kernels.rules import GRID_YZ_LIMIT, at_most, grid_rule, sixteen_bit_rule, smem_rule, threads_rule
from autocnn.kernels.space import Config, Constraint, Param
from autocnn.kernels.steps import WORKSPACE_ELEMENT, Launch
from autocnn.precision import FLOAT32

# 16-bit elements, bytes.
HALF_SIZE = 2

FORMULATION_TC = "tc"
TC_OPS = ("conv_fwd", "conv_bwd_data", "conv_wgrad")
# Which operands are contiguous along the reduction in global memory (decides the shared layouts).
KMAJOR = {"conv_fwd": (False, True), "conv_bwd_data": (False, False), "conv_wgrad": (True, True)}
TABLE_ENTRY_BYTES = 16
SPLITS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
# Fragment reads (tcgemm.cuh.j2): "pair" and "quad" permute the reduction inside each mma so that
# a thread's fragment elements of a k-major operand are adjacent (one LDS.64 / LDS.128), and convert
# to TF32 with integer operations; "quad" covers two mma k-steps per read.
FRAGS = ("scalar", "pair", "quad")
# How tf32 operands become TF32: rounded to nearest (cvt.rna), or truncated ("zero": the float's bits
# go to the mma unchanged and the tensor cores ignore the low 13). Truncation costs no instruction
# and about twice the error; both must pass the tf32 bound, and the tuner chooses.
TF32_ROUNDS = ("nearest", "zero")


@dataclass(frozen=True)
class TcGemm:
    """The GEMM one tc kernel runs (the largest phase's, for conv_bwd_data)."""

    op: str
    GM: int
    GN: int
    GK: int
    grid_z: int       # blocks along z: stride phases (conv_bwd_data), groups (conv_fwd); splits: the config's
    split3: bool      # fp32: 3xTF32
    C: int = 0        # conv_fwd: input channels (the NHWC float4 runs)
    staged_floats: int = 0   # conv_fwd: X and W as staged for NHWC
    mma16: str = ""   # bf16, fp16: the m16n8k16 operand type ("bf16", "f16"); "" for the TF32 mmas
    groups: int = 1   # channel groups: a GEMM each (conv_wgrad: the groups' blocks along x)

    @property
    def element_size(self) -> int:
        """Bytes of an operand element as the GEMM stages it."""
        return HALF_SIZE if self.mma16 else FLOAT32.size

    @property
    def k_step(self) -> int:
        """The reduction terms of one mma."""
        return 16 if self.mma16 else 8


def vector_widths(gemm: TcGemm, vec: int, nhwc: int) -> tuple[int, int]:
    """(VEC_A, VEC_B), elements per load: conv_fwd's B (W along c,r,s or Wt along r,s,c) is
    contiguous along k; its A only once X is NHWC. Other ops move single elements. ``vec`` counts
    32-bit words (VEC=4: 16 bytes, 4 floats or 8 16-bit elements)."""
    if gemm.op != "conv_fwd" or vec == 1:
        return 1, 1
    elements = vec * FLOAT32.size // gemm.element_size
    return (elements if nhwc else 1), elements


def kmajor(op: str, nhwc: int = 0) -> tuple[bool, bool]:
    """Which operands are contiguous along the reduction; conv_fwd's A is too once X is NHWC."""
    a, b = KMAJOR[op]
    return (a or bool(nhwc), b)


def smem_bytes(op: str, BM: int, BN: int, BK: int, STAGES: int, PAD_A: int, PAD_B: int, TABLE_A: int,
               table_k: int, nhwc: int = 0, sixteen: bool = False) -> int:
    table = TABLE_ENTRY_BYTES * cdiv(table_k, BK) * BK if TABLE_A else 0
    if sixteen:
        # 16-bit stages: every operand [row][BK + 2 * PAD] (PAD in 32-bit words), 2 bytes an element.
        return HALF_SIZE * STAGES * (BM * (BK + 2 * PAD_A) + BN * (BK + 2 * PAD_B)) + table
    a_kmajor, b_kmajor = kmajor(op, nhwc)
    fa = BM * (BK + PAD_A) if a_kmajor else BK * (BM + PAD_A)
    fb = BN * (BK + PAD_B) if b_kmajor else BK * (BN + PAD_B)
    return FLOAT32.size * STAGES * (fa + fb) + table   # the TF32 core stages FP32 values, whatever the tensors


def params(gemm: TcGemm) -> list[Param]:
    out = [
        Param("BM", choices_upto((32, 64, 128, 256), max(32, next_pow2(gemm.GM))), "GEMM rows per block"),
        Param("BN", choices_upto((32, 64, 128), max(32, next_pow2(gemm.GN))), "GEMM columns per block"),
        Param("BK", choices_upto((8, 16, 32), max(gemm.k_step, next_pow2(gemm.GK))), "reduction step staged in shared memory"),
        Param("WM", (1, 2, 4), "warps along the block's rows"),
        Param("WN", (1, 2, 4), "warps along the block's columns"),
        Param("STAGES", (2, 3, 4), "shared-memory pipeline stages"),
        Param("CP_ASYNC", (0, 1), "cp.async copies global->shared (else a register double buffer)"),
        Param("PAD_A", (0, 4, 8), "floats of padding per shared-memory row of A (bank conflicts)"),
        Param("PAD_B", (0, 4, 8), "floats of padding per shared-memory row of B (bank conflicts)"),
        Param("UNROLL_K", (1, 0), "unrolling of the k-steps of a tile (0: complete)"),
        # "scalar" first: the code every config had before the parameter (see SearchSpace.complete).
        Param("FRAG", FRAGS, "fragment reads: single floats with cvt, or k-permuted 8/16-byte loads with integer rounding"),
    ]
    if gemm.op == "conv_fwd":
        out.append(Param("VEC", (1, 4), "floats per load of the operands contiguous along the reduction"))
        out.append(Param("NHWC", (0, 1), "X and W staged as NHWC / KRSC first (both operands k-contiguous)"))
    # 16-bit operands go to the mmas as stored: neither rounded (TF32_ROUND) nor split (CROSS).
    if gemm.split3:
        # 0 first: the three TF32 mmas, the code of configs written before the parameter
        out.append(Param("CROSS", (0, 1), "3xTF32's cross products big x small + small x big as one BF16 mma "
                         "(m16n8k16) per k-step (0: two TF32 mmas)"))
    elif not gemm.mma16:
        # "nearest" first: the rounding every tf32 config had before the parameter.
        out.append(Param("TF32_ROUND", TF32_ROUNDS, "tf32 operands rounded to nearest (cvt) or truncated by the tensor cores"))
    if gemm.op == "conv_wgrad":
        out.append(Param("SPLITK", SPLITS, "blocks sharing one output tile's reduction"))
        out.append(Param("TWO_PASS", (0, 1), "splits combined by a second pass over a workspace (else atomics)"))
    else:
        out.append(Param("TABLE_A", (0, 1), "the A gather's per-k context tabulated in shared memory"))
    return out


def constraints(gemm: TcGemm, limits: DeviceLimits) -> list[Constraint]:
    op = gemm.op

    def arch(_):
        return arch_violation(limits)

    warp_tiles = warp_tile_violation

    def accumulators(bm, bn, wm, wn):
        return accumulator_violation(bm, bn, wm, wn, gemm.split3)

    def even_loads(bm, bn, bk, wm, wn):
        n = 32 * wm * wn
        if (bm * bk) % n or (bn * bk) % n:
            return f"a {bm}x{bk} / {bn}x{bk} tile does not split evenly over {n} threads"
        return None

    def even_vectors(bm, bn, bk, wm, wn, vec, nhwc):
        va, vb = vector_widths(gemm, vec, nhwc)
        n = 32 * wm * wn
        if (bm * bk) % (n * va) or (bn * bk) % (n * vb):
            return f"a {bm}x{bk} / {bn}x{bk} tile does not split into float4s over {n} threads"
        return None

    def quad_steps(frag, bk):
        step = 2 * gemm.k_step
        return None if frag != "quad" or bk % step == 0 else f"quad fragment reads need BK % {step} == 0, not BK={bk}"

    def whole_steps(bk):
        return None if bk % gemm.k_step == 0 else \
            f"16-bit operands take m16n8k16 mmas: BK must be a multiple of 16, not {bk}"

    def cross_fragments(cross, frag):
        # the scalar reads keep the code written before FRAG (records' digests hold it to that text)
        return None if not cross or frag != "scalar" else "CROSS=1 takes paired or quad fragment reads, not FRAG=scalar"

    def pipeline(stages, cp_async):
        return None if cp_async or stages == 2 else "a register-staged pipeline has 2 stages"

    out = [
        Constraint(("WM",), arch),   # of the device, not of a parameter: any one carries it
        Constraint(("BM", "BN", "WM", "WN"), warp_tiles),
        Constraint(("BM", "BN", "WM", "WN"), accumulators),
        Constraint(("BM", "BN", "BK", "WM", "WN"), even_loads),
        Constraint(("STAGES", "CP_ASYNC"), pipeline),
        Constraint(("FRAG", "BK"), quad_steps),
        *([Constraint(("CROSS", "FRAG"), cross_fragments)] if gemm.split3 else []),
        threads_rule(limits, ("WM", "WN"), lambda wm, wn: 32 * wm * wn),
        at_most("BM", max(32, next_pow2(gemm.GM)), f"only {gemm.GM} GEMM rows"),
        at_most("BN", max(32, next_pow2(gemm.GN)), f"only {gemm.GN} GEMM columns"),
        at_most("BK", max(gemm.k_step, next_pow2(gemm.GK)), f"a reduction of only {gemm.GK} terms"),
        grid_rule(("BN",), lambda bn: cdiv(gemm.GN, bn)),
    ]
    if gemm.mma16:
        out.append(Constraint(("BK",), whole_steps))
    # A 16-byte load: 4 floats, or 8 16-bit elements.
    per_vector = 4 * FLOAT32.size // gemm.element_size
    vector = "float4 loads" if per_vector == 4 else "16-byte loads of 8 16-bit elements"
    if op == "conv_fwd":
        out += [
            Constraint(("VEC",), lambda v: None if v == 1 or gemm.GK % per_vector == 0
                       else f"{vector} need C*R*S % {per_vector} == 0, not {gemm.GK}"),
            Constraint(("NHWC", "VEC"), lambda nhwc, v: None if not (nhwc and v == 4) or gemm.C % per_vector == 0
                       else f"{vector} of NHWC input need C % {per_vector} == 0, not {gemm.C}"),
            Constraint(("BM", "BN", "BK", "WM", "WN", "VEC", "NHWC"), even_vectors),
            Constraint(("NHWC",), lambda nhwc: None if not nhwc or WORKSPACE_ELEMENT.size * gemm.staged_floats <= limits.workspace_bytes
                       else f"the NHWC staging workspace exceeds the workspace limit of {limits.workspace_bytes} bytes"),
            smem_rule(limits, ("BM", "BN", "BK", "STAGES", "PAD_A", "PAD_B", "TABLE_A", "NHWC"),
                      lambda bm, bn, bk, st, pa, pb, ta, nhwc: smem_bytes(op, bm, bn, bk, st, pa, pb, ta, gemm.GK, nhwc,
                                                                          bool(gemm.mma16))),
        ]
    elif op == "conv_wgrad":
        out += [
            smem_rule(limits, ("BM", "BN", "BK", "STAGES", "PAD_A", "PAD_B"),
                      lambda *v: smem_bytes(op, *v, 0, 0, sixteen=bool(gemm.mma16))),
            Constraint(("SPLITK", "BK"), lambda s, bk: None if s <= max(1, cdiv(gemm.GK, bk))
                       else f"SPLITK={s} exceeds the {cdiv(gemm.GK, bk)} reduction steps"),
            Constraint(("SPLITK",), lambda s: None if s <= GRID_YZ_LIMIT else "too many splits"),
            Constraint(("TWO_PASS", "SPLITK"), lambda t, s: None if not t or s >= 2 else "a second pass needs SPLITK >= 2"),
            # Partial sums of 16-bit gradients stay FP32 (the workspace): there are no atomics that
            # add into 16-bit outputs without rounding each partial sum.
            Constraint(("TWO_PASS", "SPLITK"), lambda t, s: None if t or s == 1 or not gemm.mma16
                       else f"16-bit gradients take SPLITK={s} splits through the FP32 workspace (TWO_PASS=1), not atomics"),
            Constraint(("TWO_PASS", "SPLITK"),
                       lambda t, s: None if not t or WORKSPACE_ELEMENT.size * s * gemm.groups * (gemm.GM * gemm.GN + gemm.GM)
                       <= limits.workspace_bytes
                       else f"the two-pass workspace exceeds the workspace limit of {limits.workspace_bytes} bytes"),
        ]
    else:
        out.append(smem_rule(limits, ("BM", "BN", "BK", "STAGES", "PAD_A", "PAD_B", "TABLE_A"),
                             lambda *v: smem_bytes(op, *v, gemm.GK, sixteen=bool(gemm.mma16))))
    return out


def default_candidates(gemm: TcGemm) -> list[dict[str, Any]]:
    """Tiles measured fastest on an H100 for 3x3 layers with 64-256 channels (fp32 and tf32),
    then smaller ones for smaller GEMMs; the last fits any problem on sm_80 and later."""
    # Paired fragment reads measured faster than single ones on every compute-bound seed row on an
    # H100 (forward 3x3 on 14x14, tf32: 206 -> 159 us); backward-data's m-major operands hold more
    # registers with them and spill on some shapes, so its defaults keep single reads.
    frag = "scalar" if gemm.op == "conv_bwd_data" else "pair"
    base = {"formulation": FORMULATION_TC, "STAGES": 2, "CP_ASYNC": 0, "UNROLL_K": 0, "FRAG": frag}
    a_kmajor, b_kmajor = KMAJOR[gemm.op]
    pads = {"PAD_A": 4 if a_kmajor else 8, "PAD_B": 4 if b_kmajor else 8}
    extra = {"SPLITK": 1, "TWO_PASS": 0} if gemm.op == "conv_wgrad" else {"TABLE_A": 1}
    if gemm.op == "conv_fwd":
        extra.update({"VEC": 1, "NHWC": 0})
    if not gemm.split3:
        extra["TF32_ROUND"] = "nearest"
    else:
        extra["CROSS"] = 0
    if gemm.mma16:
        return sixteen_bit_candidates(gemm, base)
    out = []
    for bm, bn, bk, wm, wn in ((128, 64, 16, 2, 2), (64, 64, 16, 2, 2), (64, 32, 16, 2, 2), (32, 32, 8, 2, 2)):
        cand = {**base, **pads, **extra, "BM": bm, "BN": bn, "BK": bk, "WM": wm, "WN": wn}
        if gemm.op == "conv_wgrad":
            cand["SPLITK"] = wgrad_splits(gemm, bm, bn, bk)
        out.append(cand)
    return out


def wgrad_splits(gemm: TcGemm, bm: int, bn: int, bk: int) -> int:
    """conv_wgrad's default splits: about two blocks per SM of an H100 (132), each split at least
    16 reduction steps."""
    tiles = gemm.groups * cdiv(gemm.GM, bm) * cdiv(gemm.GN, bn)
    want = max(1, min(2 * 132 // max(1, tiles), cdiv(gemm.GK, 16 * bk)))
    return max(s for s in SPLITS if s <= want)


def sixteen_bit_candidates(gemm: TcGemm, base: dict[str, Any]) -> list[dict[str, Any]]:
    """bf16 and fp16: the fp32 defaults' tiles with a k-step of 16, BK 32 (16 for the last, which
    fits any problem on sm_80 and later), paired fragment reads on every op (16-bit stages are all
    k-major, so backward-data's reads are 8-byte ones too) and the padding that makes them free of
    bank conflicts (rows of BK / 2 + PAD words, 8 or 24 mod 32: PAD 8 at BK 32, 0 at BK 16). conv_fwd
    loads its filters 16 bytes at a time where C*R*S % 8 == 0; conv_wgrad's splits meet in the FP32
    workspace."""
    out = []
    for bm, bn, bk, wm, wn in ((128, 64, 32, 2, 2), (64, 64, 32, 2, 2), (64, 32, 32, 2, 2), (32, 32, 16, 2, 2)):
        pad = 8 if bk == 32 else 0
        cand = {**base, "FRAG": "pair", "PAD_A": pad, "PAD_B": pad, "BM": bm, "BN": bn, "BK": bk, "WM": wm, "WN": wn}
        if gemm.op == "conv_wgrad":
            splits = wgrad_splits(gemm, bm, bn, bk)
            cand.update({"SPLITK": splits, "TWO_PASS": int(splits >= 2)})
        else:
            cand["TABLE_A"] = 1
        if gemm.op == "conv_fwd":
            cand.update({"VEC": 4 if gemm.GK % 8 == 0 else 1, "NHWC": 0})
        out.append(cand)
    return out


def gemm_for(problem: Any) -> TcGemm:
    p = problem
    split3 = p.precision.tf32x3
    mma16 = mma16_operand(p.precision)
    if p.op == "conv_fwd":
        # One group's GEMM (the whole problem's where groups = 1), the groups along z.
        cg = p.C // p.groups
        return TcGemm(p.op, p.N * p.P * p.Q, p.K // p.groups, cg * p.R * p.S, p.groups, split3, C=cg,
                      staged_floats=sum(n for _, n in nhwc_stage_workspaces(p)), mma16=mma16)
    if p.op == "conv_bwd_data":
        # The largest phase's GEMM of one group (geometry.tap_phases: the taps through the dilation).
        phases = tap_phases(p)
        return TcGemm(p.op, max(p.N * ph.Ha * ph.Wb for ph in phases), p.C // p.groups,
                      max(1, max(p.K // p.groups * ph.Ra * ph.Sb for ph in phases)), len(phases) * p.groups, split3,
                      mma16=mma16, groups=p.groups)
    return TcGemm(p.op, p.K // p.groups, p.C // p.groups * p.R * p.S, p.N * p.P * p.Q, 1, split3, mma16=mma16,
                  groups=p.groups)


# What each op's glue renders from besides the core: its operands and what they import (conv_fwd's
# NHWC staging kernel takes the TF32 split from _wgmma_ops), and the phase GEMMs and second-pass
# reduction it shares with igemm.
OPERAND_TEMPLATES = {
    "conv_fwd": ("gemm_operands_conv_fwd.cuh.j2", "_conv_fwd_operands.cuh.j2", "_operand_access.cuh.j2",
                 "nhwc_stage_conv_fwd.cuh.j2", "_wgmma_ops.cuh.j2", "_conv_groups.cuh.j2"),
    "conv_bwd_data": ("gemm_operands_conv_bwd_data.cuh.j2", "_bwd_data_operands.cuh.j2", "_operand_access.cuh.j2",
                      "_bwd_data_phases.cuh.j2", "_conv_groups.cuh.j2"),
    "conv_wgrad": ("_conv_wgrad_operands.cuh.j2", "_operand_access.cuh.j2", "igemm_conv_wgrad_reduce.cu.j2",
                   "_conv_groups.cuh.j2"),
}


class TcConv(OpFormulation):
    """The tensor-core GEMM of one convolution; the op template supplies the problem's constants."""

    formulation = FORMULATION_TC
    summary = "tensor-core implicit GEMM"
    ARGS = {"conv_fwd": ("x", "w", "bias", "y"), "conv_bwd_data": ("dy", "w", "dx"),
            "conv_wgrad": ("x", "dy", "dw", "db", "ws", "ws_bias")}

    def __init__(self, op: str):
        self.op = op
        self.templates = (f"tc_{op}.cu.j2", "tcgemm.cuh.j2", "_mma16_fragments.cuh.j2", "_gemm_row_sums.cuh.j2",
                          "_mma_sync.cuh.j2", "_mma_tiles.cuh.j2", *OPERAND_TEMPLATES[op])

    def params(self, problem: Any) -> list[Param]:
        return params(gemm_for(problem))

    def constraints(self, problem: Any, limits: DeviceLimits) -> list[Constraint]:
        gemm = gemm_for(problem)
        return [*self._grouping_constraints(problem, gemm), *self._precision_constraints(problem, gemm, limits)]

    def _grouping_constraints(self, problem: Any, gemm: TcGemm) -> list[Constraint]:
        """A grouped problem's groups are blocks along z (conv_fwd; conv_bwd_data's with its phases)
        or x (conv_wgrad, whose z holds the splits); a grouped conv_fwd's filters have no NHWC staging
        (the staging kernels copy dense filters). None for a dense problem: its space stays as it was."""
        if problem.groups == 1:
            return []
        if self.op == "conv_wgrad":
            return []   # groups * filter tiles along x: far below the grid's limit there
        out = [grid_rule(("BM",), lambda bm: gemm.grid_z, "z")]
        if self.op == "conv_fwd":
            out.append(Constraint(("NHWC",), lambda nhwc: None if not nhwc else
                                  "a grouped convolution's filters are read as stored (NCHW): NHWC=0"))
        return out

    def _precision_constraints(self, problem: Any, gemm: TcGemm, limits: DeviceLimits) -> list[Constraint]:
        if gemm.mma16:   # bf16, fp16: m16n8k16 on the values as stored
            return constraints(gemm, limits)
        return [sixteen_bit_rule(problem, self.formulation, "BM", "its mma.sync products take 16-bit operands only "
                                                                  "where activations, filters and outputs share one "
                                                                  "type, bf16 or fp16 (one m16n8k16 mma multiplies one "
                                                                  "type)"),
                *constraints(gemm, limits)]

    def default_candidates(self, problem: Any) -> list[dict[str, Any]]:
        return default_candidates(gemm_for(problem))

    def grouping_refusal(self, problem: Any) -> str | None:
        """Any dilation, and groups of at least one mma k-step of channels (a GEMM per group)."""
        if not problem.grouped_or_dilated:
            return None
        k_step, channels = gemm_for(problem).k_step, problem.C // problem.groups
        if problem.groups > 1 and channels < k_step:
            return (f"tc computes grouped convolutions of at least {k_step} channels a group, one k-step of its "
                    f"{problem.precision} mma ({grouping_text(problem)} with C={problem.C} gives {channels}; igemm "
                    "serves it)")
        return None

    def context(self, problem: Any, config: Config) -> dict[str, Any]:
        nhwc = config["NHWC"] if "NHWC" in config else 0
        vec_a, vec_b = vector_widths(gemm_for(problem), config["VEC"] if "VEC" in config else 1, nhwc)
        return {"split3": problem.precision.tf32x3, "mma16": mma16_operand(problem.precision),
                "UNROLL_K": pragma_unroll(config["UNROLL_K"]),
                "TABLE_A": config["TABLE_A"] if "TABLE_A" in config else 0,
                "NHWC": nhwc, "VEC_A": vec_a, "VEC_B": vec_b,
                "TF32_ROUND": config["TF32_ROUND"] if "TF32_ROUND" in config else "nearest",
                "cross": config["CROSS"] if "CROSS" in config else 0,
                "stage_threads": "tc::THREADS", "STAGE_SPLIT": 0, "ROW_VECTORS": 0,
                # conv_bwd_data's phases with the taps that reach them through the dilation (rendered
                # for a grouped or dilated problem; the op's own "phases" for the others).
                **({"tap_phases": tap_phases(problem), "tap_steps": tap_steps(problem)} if self.op == "conv_bwd_data"
                   else {})}

    def launches(self, problem: Any, config: Config) -> tuple[Launch, ...]:
        gemm, c = gemm_for(problem), config
        table = c["TABLE_A"] if "TABLE_A" in c else 0
        nhwc = c["NHWC"] if "NHWC" in c else 0
        smem = smem_bytes(gemm.op, c["BM"], c["BN"], c["BK"], c["STAGES"], c["PAD_A"], c["PAD_B"], table, gemm.GK,
                          nhwc, bool(gemm.mma16))
        z = c["SPLITK"] if gemm.op == "conv_wgrad" else gemm.grid_z
        # conv_wgrad's groups are blocks along x (the other ops' along z: grid_z).
        rows = cdiv(gemm.GM, c["BM"]) * (gemm.groups if gemm.op == "conv_wgrad" else 1)
        grid = (rows, cdiv(gemm.GN, c["BN"]), z)
        threads = (32 * c["WM"] * c["WN"], 1, 1)
        if nhwc:
            return (*nhwc_stage_launches(problem, threads),
                    Launch(gemm.op, grid, threads, smem, (*self.ARGS[gemm.op], "xt", "wt")))
        main = Launch(gemm.op, grid, threads, smem, self.ARGS[gemm.op])
        if gemm.op == "conv_wgrad" and c["TWO_PASS"]:
            return (main, wgrad_reduce_launch(problem))
        return (main,)

    def buffers(self, problem: Any, config: Config) -> Buffers:
        if self.op == "conv_fwd" and config["NHWC"]:
            return (), nhwc_stage_workspaces(problem)
        if self.op != "conv_wgrad":
            return (), ()
        if config["TWO_PASS"]:
            gemm = gemm_for(problem)
            splits = config["SPLITK"] * gemm.groups   # every group's split sums
            return (), (("ws", splits * gemm.GM * gemm.GN), ("ws_bias", splits * gemm.GM))
        if config["SPLITK"] > 1:
            return ("dw", "db"), ()   # the splits' atomics add into zeroed outputs
        return (), ()

    def code_helpers(self) -> tuple:
        return (gemm_for, TcGemm, smem_bytes, kmajor, vector_widths, pragma_unroll, KMAJOR, TABLE_ENTRY_BYTES, self.ARGS,
                wgrad_reduce_launch, WORKSPACE_LIMIT_BYTES, nhwc_stage_launches, nhwc_stage_workspaces, mma16_operand,
                sixteen_bit_candidates, wgrad_splits, tap_phases, tap_steps)


TENSOR_CORE = Formulation(FORMULATION_TC, tuple(TcConv(op) for op in TC_OPS))
