"""winograd_fused: Winograd F(2x2, 3x3) in one kernel, the points' products on tensor cores, for
3x3 stride-1 conv_fwd and conv_bwd_data.

The winograd formulation writes the transformed input V and the products M to global memory between
its steps; with 64 channels its GEMMs are too short for that traffic to pay (modern_56 forward:
V alone is 2.25 times the input per TF32 part, written and read again). Here a block takes KB output
channels of TB output tiles and loops over the input channels 8 at a time (one mma k-step). For each
chunk it transforms the chunk's input tiles (B^T d B) into shared memory, split into TF32 parts in
fp32, and multiplies them, point by point, by the chunk's transformed filters on mma.sync m16n8k8.
The filters are staged by cp.async, double-buffered; a small first kernel transforms and splits them
(U = G g G^T) and lays them out in mma A-fragment order, so that a stage is one contiguous copy and a
lane reads its fragment as one float4. The next chunk's raw input tiles are copied by cp.async into
each thread's own part of a raw stage while this chunk's products run (in registers they would take
the 16 that MT 4 needs). After the last chunk the block's products go through shared memory to the
output transform (A^T M A), with bias and activation fused. Nothing but the filters' transform
touches global memory between the input and the output.

Every block of output channels transforms the same input tiles again: with MT 1 (16 channels a
block; F(4x4) then) modern_56 forward ran 144 M instructions on an H100 (ncu), most of them the input
transform four times over, and took 342 us; F(2x2) with MT 4 (all 64 channels, 128 accumulators a
thread: the registers are why the raw tiles wait in shared memory) 94 M and 240 us, below the 252 us
of its best direct kernel. One block of 8 warps an SM (254 registers) leaves it latency-bound: ncu counted
an instruction issued in 46% of cycles.

Warp w takes points w, w + WARPS, ... of all the block's tiles and channels: each A fragment (16
output channels x 8 input channels of one point) serves TB/8 mma tiles. fp32 is 3xTF32: hi.hi +
lo.hi + hi.lo of each k-step summed in fresh registers and added to the totals in FP32 (the tensor
cores' own accumulation does not round to nearest); tf32 is one mma per product, operands rounded to
nearest.

conv_bwd_data at stride 1 is the forward correlation of dY with the filters flipped and transposed,
padded by R-1-pad (winograd.view).

F(4x4,3x3) (36 points) was served until the input stage was double-buffered: on modern_56 forward
(H100) its best config took 342 us in fp32 against 240 for F(2x2) with 64 output channels a block,
its TF32 rounding failed the tf32 bound (0.00317 against 0.00195), and with two input stages no fp32
config fits in shared memory. The helpers keep m as an argument; the formulation serves m = 2.

WF_CROSS=1 (fp32) runs each k-step's two cross products, hi.lo + lo.hi, as one m16n8k16 BF16 mma
(as tc's CROSS): a k-step costs two tensor-core steps instead of three. The operands are packed where
they are made, not in the products' loop: the filters' kernel writes each lane's four BF16 A
registers (values and remainders, pairs exchanged by shuffles) in place of its TF32 remainders, and
the input transform writes each element's BF16 value and remainder as the halves of the words that
a lane reads as its two B registers (channels c and c + 4 of one word), again in the remainders'
place: the same bytes, the same reads.

WF_ACCUM=tensor (fp32) lets the mmas accumulate into the totals, as tf32 does, instead of summing each
k-step's products in fresh registers and adding them to the totals in FP32 (4 FP32 adds a 16 x 8 tile
and k-step, as many instructions as the products' fragment reads). The tensor cores' accumulation
truncates; with the few k-steps of a point (CIN / 8) the tuner's verification says where that keeps
within the FP32 bound, and only there is it stored.

Parameters: TB (output tiles a block), MT (16-row mma tiles of output channels a warp: KB = 16 MT a
block), WARPS (the points shared among them), CROSS (fp32's cross products as one BF16 mma), ACCUM
(fp32: fresh registers a k-step, or the mmas' own accumulation).

Where it wins: modern_56's and sweep_3x3's fp32 forward and backward-data on the H100; on the H200
wgmma (and tma for the backward-data) beat it there but for sweep_3x3's fp32 forward, which it runs
with WF_CROSS and WF_ACCUM=tensor (MEASUREMENTS.md).
"""
from __future__ import annotations

from typing import Any

from autocnn.device import DeviceLimits
from autocnn.kernels.formulations.base import Buffers, Formulation, OpFormulation, choices_upto
from autocnn.kernels.formulations.cores.mma_rules import arch_violation
from autocnn.kernels.formulations.cores.winograd_transforms import (TRANSFORMS, WinogradView, sandwich, tiles, unserved,
                                                                    view)
from autocnn.kernels.geometry import cdiv, next_pow2
from autocnn.kernels.rules import (GRID_X_LIMIT, GRID_YZ_LIMIT, sixteen_bit_rule, smem_rule, threads_rule,
                                   workspace_rule)
from autocnn.kernels.space import Config, Constraint, Param
from autocnn.kernels.steps import WORKSPACE_ELEMENT, Launch
from autocnn.precision import FLOAT32

NAME = "winograd_fused"
M = 2                  # F(2x2,3x3): 16 points (F(4x4) is not served: see the module's docstring)
CHUNK = 8              # input channels a step: one mma k-step
PAD_B = 8              # a staged point's row of tiles is TB + 8 floats: conflict-free B fragment reads
PAD_M = 4              # the products' rows in the output stage
FILTER_THREADS = 256
ACCUMS = ("fresh", "tensor")   # fp32: where a k-step's products are summed (WF_ACCUM)
MAX_REGISTERS = 255
REGISTERS_PER_BLOCK = 65536   # sm_80 to sm_90


def points(m: int) -> int:
    return (m + 2) ** 2


def parts(problem: Any) -> int:
    """TF32 parts of each operand: 2 (hi, lo) for fp32's 3xTF32, 1 for tf32."""
    return 2 if problem.precision.tf32x3 else 1


def padded(v: WinogradView, mt: int) -> tuple[int, int]:
    """(COUTP, CINP): the filters' transform padded with zeros to whole blocks of output channels
    and whole chunks of input channels, so that no staging of it needs a bounds check."""
    return cdiv(v.COUT, 16 * mt) * 16 * mt, cdiv(v.CIN, CHUNK) * CHUNK


def u_elements(problem: Any, m: int, mt: int) -> int:
    coutp, cinp = padded(view(problem), mt)
    return parts(problem) * points(m) * coutp * cinp


def all_tiles(v: WinogradView, m: int) -> int:
    th, tw = tiles(v, m)
    return v.N * th * tw


def smem_floats(problem: Any, m: int, tb: int, mt: int, warps: int) -> tuple[int, int, int, int]:
    """(U stages, V stages, raw stage, output stage) in floats: two stages of the filters' chunk, two
    of the transformed input's (one read by the products while the next chunk is transformed into the
    other), the raw input tiles of the next chunk (each thread's own), and the products for the output
    transform, which reuses the stages' memory."""
    e, k = points(m), parts(problem)
    u = 2 * k * e * 16 * mt * CHUNK
    v = 2 * k * e * CHUNK * (tb + PAD_B)
    raw = patches_per_thread(tb, warps) * e * 32 * warps
    out = e * 16 * mt * (tb + PAD_M)
    return u, v, raw, out


def smem_bytes(problem: Any, m: int, tb: int, mt: int, warps: int) -> int:
    u, v, raw, out = smem_floats(problem, m, tb, mt, warps)
    return FLOAT32.size * max(u + v + raw, out)   # the TF32 pipeline's stages and outputs: FP32 values


def patches_per_thread(tb: int, warps: int) -> int:
    return cdiv(CHUNK * tb, 32 * warps)


def registers_needed(problem: Any, m: int, tb: int, mt: int, warps: int) -> int:
    """A thread's registers, roughly as ptxas allots them (sm_90, nvcc 13, fitted to modern_56's
    forward configs in both precisions): the accumulators of its points, half its input tiles' values
    (the transform holds a patch and its result a part at a time), 24 a TF32 part for fragments and
    24 for addresses and state. Of the 38 configs compiled for the fit, every one it admits built
    without spills except three that spilled 4 to 16 bytes (fp32 F(2x2) 32 tiles MT 2 4 warps; tf32
    64 tiles 4 warps, 128 tiles 8 warps), and every one it rejects spilled. fp32 F(2x2), 32 tiles,
    64 output channels, 8 warps: 216 by the rule, 255 used, no spill. The tuner's compile step
    rejects whatever spills anyway."""
    acc = cdiv(points(m), warps) * mt * (tb // 8) * 4
    transform = patches_per_thread(tb, warps) * points(m) * parts(problem) // 2
    return acc + transform + 24 * parts(problem) + 24


class _WinogradFused(OpFormulation):
    formulation = NAME
    summary = "Winograd F(2x2) transforms and tensor-core products in one kernel"

    def __init__(self, op: str, src: str, dst: str):
        self.op, self.src, self.dst = op, src, dst
        self.templates = (f"winograd_fused_{op}.cu.j2", "_winograd_fused.cuh.j2", "_mma_sync.cuh.j2",
                          "_wgmma_ops.cuh.j2", "_winograd_correlation.cuh.j2")

    def params(self, problem: Any) -> list[Param]:
        v = view(problem)
        return [Param("WF_TB", choices_upto((32, 64, 128), max(32, next_pow2(all_tiles(v, 2)))), "output tiles a block"),
                Param("WF_MT", choices_upto((1, 2, 4), max(1, next_pow2(cdiv(v.COUT, 16)))),
                      "16-row mma tiles of output channels a warp (KB = 16 MT a block)"),
                # At most 16 warps: F(2x2)'s 16 points, one or more a warp.
                Param("WF_WARPS", (4, 8, 16), "warps a block, the transform's points shared among them"),
                # 0 first: the three TF32 mmas, the code of configs written before the parameter.
                *([Param("WF_CROSS", (0, 1), "3xTF32's cross products as one BF16 mma (m16n8k16) per k-step, "
                         "operands packed by the transforms (0: two TF32 mmas)"),
                   # "fresh" first: the code of configs written before the parameter.
                   Param("WF_ACCUM", ACCUMS, "fp32's products summed in fresh registers a k-step and added to the "
                         "totals in FP32, or accumulated by the mmas into the totals")] if parts(problem) == 2 else [])]

    def constraints(self, problem: Any, limits: DeviceLimits) -> list[Constraint]:
        p = problem
        why = unserved(p, NAME)
        if why:
            return [Constraint(("WF_TB",), lambda _: why)]
        v = view(p)

        def arch(_):
            return arch_violation(limits)

        def tiles_rule(tb):
            n = all_tiles(v, M)
            if tb > max(32, next_pow2(n)):
                return f"TB={tb} exceeds the {n} output tiles"
            return None if cdiv(n, tb) <= GRID_YZ_LIMIT else f"{cdiv(n, tb)} blocks of tiles exceed {GRID_YZ_LIMIT}"

        def registers(tb, mt, warps):
            need = registers_needed(p, M, tb, mt, warps)
            have = min(MAX_REGISTERS, REGISTERS_PER_BLOCK // (32 * warps))
            return None if need <= have else f"about {need} registers a thread, more than the {have} of a {32 * warps}-thread block"

        def channel_blocks(mt):
            n = cdiv(v.COUT, 16 * mt)
            return None if n <= GRID_X_LIMIT else f"{n} blocks of output channels exceed {GRID_X_LIMIT}"

        return [Constraint(("WF_TB",), arch),
                sixteen_bit_rule(p, NAME, "WF_TB", "its Winograd tiles are float32 and its mma.sync products TF32"),
                Constraint(("WF_TB",), tiles_rule),
                Constraint(("WF_MT",), channel_blocks),
                Constraint(("WF_TB", "WF_MT", "WF_WARPS"), registers),
                # The filters' transform is the one workspace (--workspace-limit).
                workspace_rule(limits.workspace_bytes, ("WF_MT",), lambda mt: WORKSPACE_ELEMENT.size * u_elements(p, M, mt)),
                threads_rule(limits, ("WF_WARPS",), lambda warps: 32 * warps),
                smem_rule(limits, ("WF_TB", "WF_MT", "WF_WARPS"),
                          lambda tb, mt, warps: smem_bytes(p, M, tb, mt, warps))]

    def default_candidates(self, problem: Any) -> list[dict[str, Any]]:
        # F(2x2), 32 tiles, 8 warps of two points each, and as many output channels a block as the
        # layer has up to 64: each input tile is transformed once a block, and the fewer blocks of
        # output channels, the fewer times over (MT 4: 128 accumulators a thread).
        cross = {"WF_CROSS": 0, "WF_ACCUM": "fresh"} if parts(problem) == 2 else {}
        return [{"formulation": NAME, "WF_TB": 32, "WF_MT": mt, "WF_WARPS": 8, **cross} for mt in (4, 2, 1)]

    def context(self, problem: Any, config: Config) -> dict[str, Any]:
        m, tb, mt = M, config["WF_TB"], config["WF_MT"]
        bt, g, at = TRANSFORMS[m]
        v = view(problem)
        coutp, cinp = padded(v, mt)
        u, vs, raw, out = smem_floats(problem, m, tb, mt, config["WF_WARPS"])
        return {"wf_m": m, "wf_alpha": m + 2, "wf_pad_t": v.PAD_T, "wf_pad_l": v.PAD_L, "wf_coutp": coutp,
                "wf_cinp": cinp, "wf_split3": problem.precision.tf32x3, "wf_ppt": patches_per_thread(tb, config["WF_WARPS"]),
                "wf_u_floats": u, "wf_v_floats": vs, "wf_raw_floats": raw, "wf_pads": (PAD_B, PAD_M), "wf_chunk": CHUNK,
                "wf_filter_threads": FILTER_THREADS, "wf_cross": bool(config.get("WF_CROSS", 0)),
                "wf_accum_fresh": config.get("WF_ACCUM", "fresh") == "fresh",
                "wf_filter": sandwich("x", g, "g", 3, "part"), "wf_input": sandwich("x", bt, "dv", m + 2, "part"),
                "wf_output": sandwich("y", at, "mm", m + 2, "part")}

    def buffers(self, problem: Any, config: Config) -> Buffers:
        return (), (("wf_u", u_elements(problem, M, config["WF_MT"])),)

    def launches(self, problem: Any, config: Config) -> tuple:
        v, m, tb, mt = view(problem), M, config["WF_TB"], config["WF_MT"]
        coutp, cinp = padded(v, mt)
        return (Launch("winograd_fused_filter", (cdiv(coutp * cinp, FILTER_THREADS), 1, 1), (FILTER_THREADS, 1, 1), 0,
                       ("w", "wf_u")),
                # Blocks of one group of tiles, every block of output channels, side by side (x): they
                # read the same input tiles, from L2 after the first.
                Launch("winograd_fused", (coutp // (16 * mt), cdiv(all_tiles(v, m), tb), 1), (32 * config["WF_WARPS"], 1, 1),
                       smem_bytes(problem, m, tb, mt, config["WF_WARPS"]), (self.src, "wf_u", "bias", self.dst)))

    def code_helpers(self) -> tuple:
        return (points, parts, padded, u_elements, all_tiles, smem_floats, smem_bytes, patches_per_thread,
                registers_needed, CHUNK, PAD_B, PAD_M, FILTER_THREADS)


WINOGRAD_FUSED = Formulation(NAME, (_WinogradFused("conv_fwd", "x", "y"), _WinogradFused("conv_bwd_data", "dy", "dx")))
