"""The rules of the mma.sync core (tcgemm.cuh.j2, _mma_sync.cuh.j2: m16n8k8 TF32 on sm_80 and later,
m16n8k16 on bf16 or fp16 operands) that every formulation running it shares: the tc formulation,
tc_rows, winograd's generated products, winograd_fused and fft's tensor-core multiply-accumulate.
"""
from __future__ import annotations

from autocnn.device import DeviceLimits
from autocnn.kernels.rules import arch_number
from autocnn.precision import Precision, TensorMath

# PTX's names of the 16-bit operand types of mma.sync.m16n8k16 (.bf16, .f16), by how a precision forms
# its products.
MMA16_OPERANDS = {TensorMath.BF16: "bf16", TensorMath.FP16: "f16"}


def mma16_operand(precision: Precision) -> str:
    """PTX's name of the 16-bit type an m16n8k16 mma takes a precision's operands as ("bf16",
    "f16"), or "" where it takes none: a precision that forms TF32 products, or one whose
    activations, filters and outputs are not of one 16-bit type (one mma multiplies one type)."""
    name = MMA16_OPERANDS.get(precision.tensor_math, "")
    one_type = precision.x == precision.w == precision.y and precision.x.size == 2
    return name if one_type else ""


MIN_ARCH = 80   # mma.sync with TF32 operands: Ampere and later


def arch_violation(limits: DeviceLimits) -> str | None:
    """Why the device cannot run the core's TF32 mma.sync, if it cannot."""
    n = arch_number(limits.arch)
    return None if n >= MIN_ARCH else f"tensor-core TF32 needs sm_{MIN_ARCH} or later, not {limits.arch}"


def warp_tile_violation(bm: int, bn: int, wm: int, wn: int) -> str | None:
    if bm % (16 * wm) or bn % (8 * wn):
        return f"a {bm}x{bn} block does not split into whole 16x8 mma tiles over {wm}x{wn} warps"
    return None


def accumulator_violation(bm: int, bn: int, wm: int, wn: int, split3: bool) -> str | None:
    tiles = (bm // (16 * wm)) * (bn // (8 * wn))
    # fp32 keeps a second fragment per tile (the per-tile sum) and split operands: half as many.
    cap = 16 if split3 else 32
    return None if tiles <= cap else f"{tiles} mma tiles per warp exceed {cap} (registers)"
