"""unrolled: the seed's method (Chellapilla et al. 2006): the input unrolled into a matrix by a
generated kernel (im2col), the product by cuBLAS SGEMM (a library GEMM step of the plan, see
operation.LibraryGemm), for the three convolutions as the seed writes them:

    conv_fwd       Y = W X_unrolled per image, then bias and activation
    conv_bwd_data  dX_unrolled = W^T dY per image, then folded back into dX (col2im, a gather:
                   every dX element sums the unrolled entries that came from it)
    conv_wgrad     dW = dY X_unrolled^T summed over images; db by a reduction kernel

Images are taken in blocks of IMGS, so the unrolled matrix (the workspace) holds one block and
stays within WORKSPACE_LIMIT_BYTES; the GEMMs of later blocks of conv_wgrad accumulate into dW.
A 1x1 stride-1 convolution (its padding is 0: padding must be smaller than the filter) is a GEMM
on X, dY or dX as they are, with no unrolling; a strided 1x1 unrolls into a strided gather.

Parameters: GEMM_MODE (conv_fwd: "batched", one GEMM per image writing Y, or "wide", one GEMM
over the block's images side by side, its result stored into Y with the epilogue; conv_wgrad:
"wide", the block's unrolled images and dY gathered side by side for one GEMM, or "per_image",
one accumulating GEMM per image), IMGS, COL_T (the unrolled matrix stored transposed, which
makes the GEMM's operand transposed), THREADS and ITEMS of the generated element-wise kernels,
and TF32_GEMM for tf32 problems (cuBLAS's TF32 tensor-op math; fp32 problems always run FP32).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from autocnn.device import DeviceLimits
from autocnn.kernels.formulations.base import Buffers, Formulation, OpFormulation, choices_upto
from autocnn.kernels.formulations.cores.workspaces import WORKSPACE_LIMIT_BYTES
from autocnn.kernels.geometry import cdiv, next_pow2
from autocnn.kernels.rules import sixteen_bit_rule, workspace_rule
from autocnn.kernels.space import Config, Constraint, Param
from autocnn.kernels.steps import WORKSPACE_ELEMENT, Launch, LibraryGemm, MatrixView

NAME = "unrolled"
BATCHED, WIDE, PER_IMAGE = "batched", "wide", "per_image"
MODES = {"conv_fwd": (BATCHED, WIDE), "conv_bwd_data": (BATCHED,), "conv_wgrad": (WIDE, PER_IMAGE)}
IMGS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
THREADS = (128, 256, 512)
ITEMS = (1, 2, 4)
# Layouts of the unrolled matrix (the im2col kernel's LAYOUT): per image CRS x PQ, per image
# PQ x CRS (COL_T), or the block's images side by side, CRS x (IMGS*PQ).
PER_IMAGE_ROWS, PER_IMAGE_T, SIDE_BY_SIDE = 0, 1, 2
# Defaults keep the workspace well under the limit: a quarter of it.
DEFAULT_WORKSPACE_BYTES = WORKSPACE_LIMIT_BYTES // 4
ARGS = {"im2col": ("x", "col"), "col2im": ("col", "dx"), "store": ("gemm_out", "bias", "y"),
        "bias_act": ("bias", "y"), "gather_dy": ("dy", "dy_side"), "bias_grad": ("dy", "db")}


@dataclass(frozen=True)
class Unrolling:
    """The GEMM view of one convolution: sizes, and whether the 1x1 stride-1 shortcut applies."""

    op: str
    N: int
    C: int
    K: int
    CRS: int
    PQ: int
    HW: int
    direct: bool        # 1x1 stride 1: X (conv_fwd, conv_wgrad) or dX (conv_bwd_data) is the unrolled matrix
    epilogue: bool      # conv_fwd with a bias or an activation; conv_wgrad with a bias gradient


def unrolling(p: Any) -> Unrolling:
    direct = p.R == 1 and p.S == 1 and tuple(p.stride) == (1, 1)
    if p.op == "conv_fwd":
        epilogue = p.bias or p.activation != "none"
    else:
        epilogue = p.op == "conv_wgrad" and p.bias
    return Unrolling(p.op, p.N, p.C, p.K, p.C * p.R * p.S, p.P * p.Q, p.H * p.W, direct, epilogue)


def block_images(u: Unrolling, imgs: int) -> int:
    """Images per block: IMGS, or all of them when there are fewer."""
    return min(imgs, u.N)


def unrolls(u: Unrolling, mode: str) -> bool:
    """Whether the plan runs the im2col kernel (or, for conv_bwd_data, the fold)."""
    return not u.direct or mode == WIDE


def workspace_elements(u: Unrolling, mode: str, imgs: int) -> dict[str, int]:
    """The workspaces (float32 elements) of a config: the unrolled block, and the side-by-side
    GEMM result (conv_fwd) or dY (conv_wgrad) of the wide mode."""
    b = block_images(u, imgs)
    out = {"col": b * u.CRS * u.PQ} if unrolls(u, mode) else {}
    if mode == WIDE:
        out["gemm_out" if u.op == "conv_fwd" else "dy_side"] = u.K * b * u.PQ
    return out


def layout(mode: str, col_t: int) -> int:
    if col_t:
        return PER_IMAGE_T
    return SIDE_BY_SIDE if mode == WIDE else PER_IMAGE_ROWS


def blocks(u: Unrolling, imgs: int) -> list[tuple[int, int]]:
    """(first image, images) of each block; the last may be short."""
    b = block_images(u, imgs)
    return [(n0, min(b, u.N - n0)) for n0 in range(0, u.N, b)]


def elementwise(kernel: str, count: int, c: Config, scalars: tuple[int, ...] = ()) -> Launch:
    per_block = c["THREADS"] * c["ITEMS"]
    return Launch(f"unrolled_{kernel}", (cdiv(count, per_block), 1, 1), (c["THREADS"], 1, 1), 0,
                  ARGS[kernel], scalars)


def col_operand(u: Unrolling, mode: str, col_t: int, n0: int, imgs: int, image: int = 0) -> tuple[MatrixView, bool]:
    """The unrolled matrix as a GEMM operand of rows CRS and columns PQ (or the block's PQs side by
    side), and whether it is stored transposed. ``image`` picks one image of a per-image block."""
    b = block_images(u, imgs)
    if not unrolls(u, mode):
        source = "dx" if u.op == "conv_bwd_data" else "x"
        return MatrixView(source, (n0 + image) * u.C * u.HW, u.HW, u.C * u.HW), False
    if col_t:
        return MatrixView("col", image * u.PQ * u.CRS, u.CRS, u.PQ * u.CRS), True
    if mode == WIDE:
        return MatrixView("col", 0, b * u.PQ), False
    return MatrixView("col", image * u.CRS * u.PQ, u.PQ, u.CRS * u.PQ), False


class _Unrolled(OpFormulation):
    formulation = NAME
    summary = "im2col kernel + cuBLAS SGEMM"

    def __init__(self, op: str):
        self.op = op
        self.templates = (f"unrolled_{op}.cu.j2", "_unrolled.cuh.j2", *(("_bias_grad.cuh.j2",) if op == "conv_wgrad" else ()))

    # -- the space ---------------------------------------------------------------------------
    def params(self, problem: Any) -> list[Param]:
        u = unrolling(problem)
        modes = MODES[self.op]
        out = []
        if len(modes) > 1:
            out.append(Param("GEMM_MODE", modes, "one GEMM per image (batched/per_image) or over a block of images side by side (wide)"))
        out.append(Param("IMGS", choices_upto(IMGS, next_pow2(u.N)), "images per block (the unrolled workspace holds one block)"))
        # Where a mode reads X or dX as it is (1x1 stride 1), the unrolled layout and the element-wise
        # kernels' sizes apply only in the modes that have them.
        col_when = () if not u.direct else ((("GEMM_MODE", (WIDE,)),) if WIDE in modes else None)
        kernels_when = () if (not u.direct or u.epilogue) else col_when
        if col_when is not None:
            out.append(Param("COL_T", (0, 1), "the unrolled matrix stored transposed (PQ x CRS)", col_when))
        if kernels_when is not None:
            out.append(Param("THREADS", THREADS, "threads per block of the generated element-wise kernels", kernels_when))
            out.append(Param("ITEMS", ITEMS, "elements per thread of the generated element-wise kernels", kernels_when))
        if problem.precision.tf32:
            out.append(Param("TF32_GEMM", (0, 1), "cuBLAS with TF32 tensor-op math (tf32 problems only)"))
        return out

    def constraints(self, problem: Any, limits: DeviceLimits) -> list[Constraint]:
        u = unrolling(problem)
        modes = MODES[self.op]
        refusal = sixteen_bit_rule(problem, NAME, "IMGS", "its GEMMs are cuBLAS calls on float32 buffers (SGEMM, or "
                                                          "TF32 tensor-op math)")
        if len(modes) > 1:
            return [refusal, workspace_rule(limits.workspace_bytes, ("GEMM_MODE", "IMGS"),
                                   lambda mode, imgs: WORKSPACE_ELEMENT.size * sum(workspace_elements(u, mode, imgs).values()))]
        return [refusal, workspace_rule(limits.workspace_bytes, ("IMGS",),
                               lambda imgs: WORKSPACE_ELEMENT.size * sum(workspace_elements(u, modes[0], imgs).values()))]

    def default_candidates(self, problem: Any) -> list[dict[str, Any]]:
        """Per mode, the largest block within a quarter of the workspace limit, then one image."""
        u = unrolling(problem)
        params = self.params(problem)
        imgs_choices = next(p for p in params if p.name == "IMGS").choices
        out = []
        for mode in MODES[self.op]:
            fits = [i for i in imgs_choices
                    if WORKSPACE_ELEMENT.size * sum(workspace_elements(u, mode, i).values()) <= DEFAULT_WORKSPACE_BYTES]
            for imgs in (max(fits, default=1), 1):
                values = {"formulation": NAME, "GEMM_MODE": mode, "IMGS": imgs, "COL_T": 0, "THREADS": 256,
                          "ITEMS": 2, "TF32_GEMM": 0}
                assigned = {"formulation": NAME}
                for p in params:
                    if p.is_active(assigned):
                        assigned[p.name] = values[p.name]
                if assigned not in out:
                    out.append(assigned)
        return out

    # -- code and launches ----------------------------------------------------------------------
    def context(self, problem: Any, config: Config) -> dict[str, Any]:
        u = unrolling(problem)
        mode = config.get("GEMM_MODE", MODES[self.op][0])
        # Only the kernels the plan launches are rendered (a 1x1 stride-1 GEMM may need none).
        kernels = sorted({s.kernel for s in self.launches(problem, config) if isinstance(s, Launch)})
        return {"u_block": block_images(u, config["IMGS"]), "u_layout": layout(mode, config.get("COL_T", 0)),
                "u_threads": config.get("THREADS", 32), "u_items": config.get("ITEMS", 1), "u_kernels": kernels}

    def buffers(self, problem: Any, config: Config) -> Buffers:
        u = unrolling(problem)
        mode = config.get("GEMM_MODE", MODES[self.op][0])
        return (), tuple(workspace_elements(u, mode, config["IMGS"]).items())

    @staticmethod
    def gemm(config: Config, **fields: Any) -> LibraryGemm:
        """A GEMM step; TF32 math only where a tf32 problem's config asks for it."""
        return LibraryGemm(tf32=bool(config.get("TF32_GEMM", 0)), **fields)

    def code_helpers(self) -> tuple:
        return (Unrolling, unrolling, block_images, unrolls, workspace_elements, layout, blocks,
                elementwise, col_operand, _Unrolled.gemm, ARGS, MODES)


class UnrolledConvFwd(_Unrolled):
    def __init__(self) -> None:
        super().__init__("conv_fwd")

    def launches(self, p: Any, c: Config) -> tuple:
        u = unrolling(p)
        mode, col_t = c.get("GEMM_MODE", BATCHED), c.get("COL_T", 0)
        w = MatrixView("w", 0, u.CRS)
        steps: list = []
        for n0, nb in blocks(u, c["IMGS"]):
            if unrolls(u, mode):
                count = u.CRS * block_images(u, c["IMGS"]) * u.PQ if layout(mode, col_t) == SIDE_BY_SIDE else nb * u.CRS * u.PQ
                steps.append(elementwise("im2col", count, c, (n0, nb)))
            col, trans = col_operand(u, mode, col_t, n0, c["IMGS"])
            if mode == BATCHED:
                y = MatrixView("y", n0 * u.K * u.PQ, u.PQ, u.K * u.PQ)
                steps.append(self.gemm(c, m=u.K, n=u.PQ, k=u.CRS, a=w, b=col, c=y, trans_b=trans, batch=nb))
            else:
                out = MatrixView("gemm_out", 0, block_images(u, c["IMGS"]) * u.PQ)
                steps.append(self.gemm(c, m=u.K, n=nb * u.PQ, k=u.CRS, a=w, b=col, c=out, trans_b=trans))
                steps.append(elementwise("store", nb * u.K * u.PQ, c, (n0, nb)))
        if mode == BATCHED and u.epilogue:
            steps.append(elementwise("bias_act", u.N * u.K * u.PQ, c))
        return tuple(steps)


class UnrolledConvBwdData(_Unrolled):
    def __init__(self) -> None:
        super().__init__("conv_bwd_data")

    def launches(self, p: Any, c: Config) -> tuple:
        u = unrolling(p)
        col_t = c.get("COL_T", 0)
        w = MatrixView("w", 0, u.CRS)
        steps: list = []
        for n0, nb in blocks(u, c["IMGS"]):
            dy = MatrixView("dy", n0 * u.K * u.PQ, u.PQ, u.K * u.PQ)
            col, trans = col_operand(u, BATCHED, col_t, n0, c["IMGS"])
            if trans:   # dX_unrolled^T = dY^T W, written PQ x CRS per image
                steps.append(self.gemm(c, m=u.PQ, n=u.CRS, k=u.K, a=dy, b=w, c=col, trans_a=True, batch=nb))
            else:       # dX_unrolled = W^T dY (into dX itself for 1x1 stride 1)
                steps.append(self.gemm(c, m=u.CRS, n=u.PQ, k=u.K, a=w, b=dy, c=col, trans_a=True, batch=nb))
            if unrolls(u, BATCHED):
                steps.append(elementwise("col2im", nb * u.C * u.HW, c, (n0, nb)))
        return tuple(steps)


class UnrolledConvWgrad(_Unrolled):
    def __init__(self) -> None:
        super().__init__("conv_wgrad")

    def launches(self, p: Any, c: Config) -> tuple:
        u = unrolling(p)
        mode, col_t = c["GEMM_MODE"], c.get("COL_T", 0)
        dw = MatrixView("dw", 0, u.CRS)
        b = block_images(u, c["IMGS"])
        steps: list = []
        for n0, nb in blocks(u, c["IMGS"]):
            if mode == WIDE:
                count = u.CRS * b * u.PQ if not col_t else nb * u.CRS * u.PQ
                steps.append(elementwise("im2col", count, c, (n0, nb)))
                steps.append(elementwise("gather_dy", u.K * b * u.PQ, c, (n0, nb)))
                col = MatrixView("col", 0, u.CRS) if col_t else MatrixView("col", 0, b * u.PQ)
                dy = MatrixView("dy_side", 0, b * u.PQ)
                # dW (+)= dY_side X_side^T: X_side is stored CRS x (nb*PQ), or transposed with COL_T.
                steps.append(self.gemm(c, m=u.K, n=u.CRS, k=nb * u.PQ, a=dy, b=col, c=dw, trans_b=not col_t,
                                       accumulate=n0 > 0))
                continue
            if unrolls(u, mode):
                steps.append(elementwise("im2col", nb * u.CRS * u.PQ, c, (n0, nb)))
            for image in range(nb):
                dy = MatrixView("dy", (n0 + image) * u.K * u.PQ, u.PQ)
                col, trans = col_operand(u, mode, col_t, n0, c["IMGS"], image)
                col = MatrixView(col.buffer, col.offset, col.ld)
                steps.append(self.gemm(c, m=u.K, n=u.CRS, k=u.PQ, a=dy, b=col, c=dw, trans_b=not trans,
                                       accumulate=n0 + image > 0))
        if u.epilogue:
            steps.append(Launch("conv_bias_grad", (u.K, 1, 1), (c["THREADS"], 1, 1), 0, ARGS["bias_grad"]))
        return tuple(steps)


UNROLLED = Formulation(NAME, (UnrolledConvFwd(), UnrolledConvBwdData(), UnrolledConvWgrad()))
