"""The Winograd formulation F(2x2,3x3) / F(4x4,3x3) for 3x3 stride-1 conv_fwd, conv_bwd_data and
conv_wgrad: on the CPU, its transforms (the module's B^T, G, A^T, and the weight gradient's
G^T [(A dY A^T) . (B^T d B)] G) and plans run in NumPy against the float64 direct reference, F(4x4) and F(2x2) rounding in float32 measured against the FP32 bound, its
workspace against the limit, its templates through nvcc; on the GPU (-m gpu), every element
against float64."""
from __future__ import annotations

import dataclasses
import random
import shutil

import numpy as np
import pytest

from autocnn.device import DeviceLimits
from autocnn.errors import InfeasibleConfigError, InvalidConfigError
from autocnn.kernels import reference
from autocnn.kernels.compiler import nvcc_path
from autocnn.kernels.formulations.cores.workspaces import WORKSPACE_LIMIT_BYTES
from autocnn.kernels.formulations.winograd import NAME, WINOGRAD, config_splits, workspace_elements
from autocnn.kernels.formulations.winograd.winograd_products import products_gemm
from autocnn.kernels.formulations.cores.winograd_transforms import TRANSFORMS, tiles, view
from autocnn.kernels.geometry import next_pow2
from autocnn.kernels.problem import ConvFwdProblem
from autocnn.kernels.suite import seed_problems
from autocnn.measurement.measure import error_bound
from tests.formulation_checks import (BUILD_ARCHES, assert_verifies_on_gpu, build_failures, compile_failures,
                                      operations_with)
from tests.plan_numpy import check_plans, relative_errors, run_plan
from tests.test_precision import split_tf32

LIMITS = DeviceLimits.for_arch("sm_90")
OPERATIONS = operations_with(WINOGRAD)
OPS = tuple(OPERATIONS)
SEEDS = ("sweep_3x3", "modern_56", "modern_14")


def matrices(m: int, dtype=np.float64) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    return tuple(np.array([[float(c) for c in row] for row in mat], dtype=dtype) for mat in TRANSFORMS[m])


def odd_problems(op: str) -> list[tuple[str, object]]:
    """3x3 stride-1 shapes that divide no tile evenly: odd sizes, batch 1, asymmetric padding, no
    padding, an image smaller than one F(4x4) tile, and fused epilogues."""
    fwd = [("w_odd", ConvFwdProblem(N=3, C=5, H=13, W=11, K=7, R=3, S=3, padding=(0, 2, 1, 1))),
           ("w_batch1", ConvFwdProblem(N=1, C=4, H=7, W=9, K=3, R=3, S=3, padding=(2, 1, 0, 2))),
           ("w_nopad", ConvFwdProblem(N=2, C=3, H=5, W=6, K=4, R=3, S=3)),
           ("w_tiny", ConvFwdProblem(N=2, C=2, H=3, W=3, K=2, R=3, S=3, padding=1)),
           ("w_odd_relu", ConvFwdProblem(N=3, C=5, H=13, W=11, K=7, R=3, S=3, padding=1, bias=True,
                                         activation="relu")),
           ("w_tanh", ConvFwdProblem(N=2, C=6, H=10, W=5, K=9, R=3, S=3, padding=(1, 0, 2, 1), bias=True,
                                     activation="tanh"))]
    if op == "conv_fwd":
        return fwd
    if op == "conv_wgrad":      # with the bias gradient where the forward has a bias
        return [(name, p.with_op(op, bias=p.bias)) for name, p in fwd]
    return [(name, p.with_op(op)) for name, p in fwd if not p.bias]


class Kernels:
    """The formulation's generated kernels in NumPy, from the transforms' definition."""

    def __init__(self, problem, config, dtype=np.float64):
        self.p, self.v, self.m = problem, view(problem), config["TILE"]
        self.block = min(config["IMGS"], problem.N)
        self.bt, self.g, self.at = matrices(self.m, dtype)
        self.src, self.dst = ("dy", "dx") if problem.op == "conv_bwd_data" else ("x", "y")
        self.parts, self.dtype = config_splits(problem.op, config), dtype
        self.splitk = config.get("MMA_SPLITK", config.get("WGMMA_SPLITK", 1))
        self.bias_fused = config.get("BIAS_FUSED", 0)
        # PRODUCTS "wgmma" (conv_fwd, conv_bwd_data): V stored tiles x CIN, the products' K-major B
        self.v_transposed = config.get("PRODUCTS") == "wgmma" and problem.op != "conv_wgrad"

    def _parts(self, x):
        """GEMM_3XTF32's (hi, lo): cvt.rna.tf32's in float32; in float64 a split at float32 whose
        dropped lo·lo stays below the float64 check's tolerance, so the blocks' placement is checked."""
        if self.dtype == np.float32:
            return split_tf32(x)
        hi = x.astype(np.float32).astype(np.float64)
        return hi, x - hi

    def _point_major(self, buf, rows):
        a = self.m + 2
        th, tw = tiles(self.v, self.m)
        return buf[:a * a * rows * self.block * th * tw].reshape(a, a, rows, self.block, th, tw)

    def winograd_filter(self, b):
        v, a = self.v, self.m + 2
        w = b["w"].reshape(self.p.w_shape)
        g = w[:, :, ::-1, ::-1].transpose(1, 0, 2, 3) if v.FLIP else w   # (COUT, CIN, 3, 3)
        u = np.einsum("ij,ocjk,lk->iloc", self.g, g, self.g)
        if self.parts == 3:                   # (hi, lo, hi) along the reduction
            hi, lo = self._parts(u)
            u = np.concatenate([hi, lo, hi], axis=-1)
        b["wg_u"][:u.size] = u.ravel()

    def winograd_input(self, b, n0, nb):
        v, m, a = self.v, self.m, self.m + 2
        th, tw = tiles(v, m)
        src = b[self.src].reshape(v.N, v.CIN, v.HI, v.WI)[n0:n0 + nb]
        pad_b, pad_r = th * m + 2 - v.HI - v.PAD_T, tw * m + 2 - v.WI - v.PAD_L
        src = np.pad(src, ((0, 0), (0, 0), (v.PAD_T, pad_b), (v.PAD_L, pad_r)))
        d = np.empty((nb, v.CIN, th, tw, a, a), dtype=src.dtype)
        for i in range(th):
            for j in range(tw):
                d[:, :, i, j] = src[:, :, i * m:i * m + a, j * m:j * m + a]
        x = np.einsum("ij,bctsjk,lk->ilcbts", self.bt, d, self.bt)
        if self.v_transposed:                  # V[e][t][ci]
            ld = self.block * th * tw
            vt = b["wg_v"][:a * a * ld * v.CIN].reshape(a, a, self.block, th, tw, v.CIN)
            vt[:, :, :nb] = x.transpose(0, 1, 3, 4, 5, 2)
            return
        self._store(b["wg_v"], v.CIN, x, nb)

    def _store(self, buf, rows, x, nb):
        """A transform's (a, a, rows, nb, th, tw) result in the plan's layout."""
        if self.parts == 1:
            self._point_major(buf, rows)[:, :, :, :nb] = x
        elif self.parts == 3:                  # (hi, hi, lo) along the reduction
            hi, lo = self._parts(x)
            self._point_major(buf, 3 * rows)[:, :, :, :nb] = np.concatenate([hi, hi, lo], axis=2)
        else:                                  # conv_wgrad: the TF32 parts, then the remainders
            hi, lo = self._parts(x)
            size = hi.shape[0] * hi.shape[1] * rows * self.block * hi.shape[4] * hi.shape[5]
            self._point_major(buf[:size], rows)[:, :, :, :nb] = hi
            self._point_major(buf[size:], rows)[:, :, :, :nb] = lo

    def winograd_products(self, b, cols, accumulate):
        """PRODUCTS "mma": each point's GEMM over one block of images (``cols`` of its tiles), stored,
        added to M (a later block), or with MMA_SPLITK added into the M that winograd_clear zeroed."""
        v, a = self.v, (self.m + 2) ** 2
        th, tw = tiles(v, self.m)
        ld = self.block * th * tw
        if self.v_transposed:
            vt = b["wg_v"][:a * ld * v.CIN].reshape(a, ld, v.CIN)[:, :cols].transpose(0, 2, 1)
        else:
            vt = b["wg_v"][:a * v.CIN * ld].reshape(a, v.CIN, ld)[:, :, :cols]
        if self.p.op == "conv_wgrad":
            pg = b["wg_p"][:a * v.COUT * ld].reshape(a, v.COUT, ld)[:, :, :cols]
            mm = b["wg_m"][:a * v.COUT * v.CIN].reshape(a, v.COUT, v.CIN)
            prod = pg @ vt.transpose(0, 2, 1)
            if self.splitk > 1 or accumulate:
                mm += prod
            else:
                mm[...] = prod
        else:
            u = b["wg_u"][:a * v.COUT * v.CIN].reshape(a, v.COUT, v.CIN)
            b["wg_m"][:a * v.COUT * ld].reshape(a, v.COUT, ld)[:, :, :cols] = u @ vt

    def winograd_clear(self, b):
        b["wg_m"][...] = 0

    def winograd_grad(self, b, n0, nb):
        """P = A dY A^T of each m x m tile of dY (zero past the output)."""
        v, m = self.v, self.m
        th, tw = tiles(v, m)
        dy = b["dy"].reshape(v.N, v.COUT, v.HO, v.WO)[n0:n0 + nb]
        if self.bias_fused:                     # BIAS_FUSED: this block's share added into db
            b["db"] += dy.sum(axis=(0, 2, 3))
        dy = np.pad(dy, ((0, 0), (0, 0), (0, th * m - v.HO), (0, tw * m - v.WO)))
        tiles_ = dy.reshape(nb, v.COUT, th, m, tw, m).transpose(0, 1, 2, 4, 3, 5)     # (nb, K, th, tw, m, m)
        # P[i][l] = sum_jq A[i][j] dY[j][q] A[l][q], A = (A^T)^T
        self._store(b["wg_p"], v.COUT, np.einsum("ji,bktsjq,ql->ilkbts", self.at, tiles_, self.at), nb)

    def winograd_wgrad_output(self, b):
        v, a = self.v, self.m + 2
        mm = b["wg_m"][:a * a * v.COUT * v.CIN].reshape(a, a, v.COUT, v.CIN)
        dw = np.einsum("ji,jkoc,kl->ocil", self.g, mm, self.g)                        # G^T M G
        b["dw"][...] = dw.ravel()

    def conv_bias_grad(self, b):
        b["db"][...] = b["dy"].reshape(self.p.N, self.p.K, -1).sum(axis=(0, 2))

    def winograd_output(self, b, n0, nb):
        p, v, m = self.p, self.v, self.m
        th, tw = tiles(v, m)
        mm = self._point_major(b["wg_m"], v.COUT)[:, :, :, :nb]
        y = np.einsum("ij,jkobts,lk->botsil", self.at, mm, self.at)          # (nb, COUT, th, tw, m, m)
        y = y.transpose(0, 1, 2, 4, 3, 5).reshape(nb, v.COUT, th * m, tw * m)[:, :, :v.HO, :v.WO]
        if p.op == "conv_fwd":
            if p.bias:
                y = y + b["bias"].reshape(1, -1, 1, 1)
            y = reference.activation(y, p.activation)
        b[self.dst].reshape(v.N, v.COUT, v.HO, v.WO)[n0:n0 + nb] = y


def space(op, problem):
    return OPERATIONS[op].space(problem, LIMITS).restrict({"formulation": NAME})


@pytest.mark.parametrize("m", (2, 4))
def test_transforms_compute_a_tile_of_the_correlation(m, rng):
    """A^T [(G g G^T) . (B^T d B)] A is the m x m correlation of an (m+2)x(m+2) tile with g."""
    bt, g, at = matrices(m)
    d, f = rng.standard_normal((m + 2, m + 2)), rng.standard_normal((3, 3))
    direct = np.array([[np.sum(d[i:i + 3, j:j + 3] * f) for j in range(m)] for i in range(m)])
    assert np.allclose(at @ ((g @ f @ g.T) * (bt @ d @ bt.T)) @ at.T, direct, rtol=0, atol=1e-12)


@pytest.mark.parametrize("op", OPS)
def test_plans_compute_the_convolution_in_numpy(op, rng):
    """Both tiles, blocks that divide the batch and ones that do not, on odd shapes: the plan's
    transforms and batched GEMM views give the float64 reference's result to rounding."""
    pyrng = random.Random(int(rng.integers(2**31)))

    def configs(problem):
        sp = space(op, problem)
        return [*(sp.validate(c) for c in OPERATIONS[op].candidates(problem, NAME)), *sp.sample(pyrng, 4)]

    checked = check_plans(OPERATIONS[op], odd_problems(op), configs, Kernels, rng)
    assert checked >= 5 * len(odd_problems(op))


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("m", (2, 4))
@pytest.mark.parametrize("x3", (0, 1))
def test_float32_rounding_is_within_the_fp32_bound(op, m, x3, rng):
    """The plan in float32 (transforms and products rounded as on the GPU, up to the order of the
    GEMM's sums; with GEMM_3XTF32 the operands split by cvt.rna.tf32, each product of TF32 parts
    exact) on the channel counts of the seed 3x3 layers: both tiles pass the FP32 bound with
    either products, F(4x4,3x3) with less margin. The GPU test and the tuner's verification have
    the last word."""
    for name in SEEDS:
        problem = dataclasses.replace(dict(seed_problems(op))[name], N=2, H=12, W=12)
        inputs = {k: rng.standard_normal(s).astype(np.float32) for k, s in reference.input_shapes(problem).items()}
        expected = reference.run_problem(problem, {k: v.astype(np.float64) for k, v in inputs.items()})
        config = space(op, problem).validate({"formulation": NAME, "TILE": m, "IMGS": 2, "WG_THREADS": 128,
                                              "GEMM_3XTF32": x3, "PRODUCTS": "cublas", **unfused(op, problem)})
        plan = OPERATIONS[op].plan(problem, config)
        errors = relative_errors(run_plan(plan, inputs, Kernels(problem, config, np.float32), np.float32), expected)
        for out, err in errors.items():
            bound = error_bound(reference.reduction_length(problem, out))
            assert err <= bound / 2, f"{name} F({m}x{m},3x3): {out} error {err:.3g} against the bound {bound:.3g}"


@pytest.mark.parametrize("m", (2, 4))
def test_weight_gradient_transforms_give_a_tiles_share_of_the_gradient(m, rng):
    """G^T [(A dY A^T) . (B^T d B)] G is the 3x3 gradient of the tile's m x m outputs (dY) with
    respect to the filter: sum over outputs (i, j) of dY[i][j] d[i+r][j+s]."""
    bt, g, at = matrices(m)
    d, dy = rng.standard_normal((m + 2, m + 2)), rng.standard_normal((m, m))
    direct = np.array([[np.sum(dy * d[r:r + m, s:s + m]) for s in range(3)] for r in range(3)])
    assert np.allclose(g.T @ ((at.T @ dy @ at) * (bt @ d @ bt.T)) @ g, direct, rtol=0, atol=1e-12)


def test_only_3x3_stride_1_problems_are_served():
    strided = ConvFwdProblem(N=2, C=3, H=9, W=9, K=4, R=3, S=3, stride=2, padding=1)
    five = ConvFwdProblem(N=2, C=3, H=9, W=9, K=4, R=5, S=5)
    for problem in (strided, five):
        with pytest.raises(InfeasibleConfigError, match="winograd computes 3x3 stride-1 convolutions"):
            OPERATIONS["conv_fwd"].default_config(problem, LIMITS, formulation=NAME)
    with pytest.raises(InfeasibleConfigError, match="winograd computes 3x3 stride-1 convolutions"):
        OPERATIONS["conv_wgrad"].default_config(strided.with_op("conv_wgrad"), LIMITS, formulation=NAME)


def test_workspace_is_computed_and_never_above_the_limit():
    rng = random.Random()
    for op in OPS:
        for name, problem in [*((n, p) for n, p in seed_problems(op) if n in SEEDS), *odd_problems(op)]:
            sp = space(op, problem)
            for config in [OPERATIONS[op].default_config(problem, LIMITS, formulation=NAME), *sp.sample(rng, 8)]:
                plan = OPERATIONS[op].plan(problem, config)
                assert plan.workspace_bytes == 4 * sum(workspace_elements(
                    view(problem), config["TILE"], config["IMGS"], config_splits(op, config)).values())
                assert plan.workspace_bytes <= WORKSPACE_LIMIT_BYTES, f"{op} {name} {config}"
    big = dict(seed_problems("conv_fwd"))["modern_56"]    # 64 images of 56x56x64: V and M of all exceed 256 MiB
    with pytest.raises(InfeasibleConfigError, match="bytes of workspace exceed the limit"):
        space("conv_fwd", big).validate({"formulation": NAME, "TILE": 2, "IMGS": 64, "WG_THREADS": 128,
                                             "GEMM_3XTF32": 0, "PRODUCTS": "cublas", "WG_OUTPUT": "tiles"})


def test_plans_are_a_filter_transform_then_per_block_transforms_around_one_batched_gemm():
    problem = odd_problems("conv_bwd_data")[0][1]            # N = 3
    config = space("conv_bwd_data", problem).validate({"formulation": NAME, "TILE": 4, "IMGS": 2, "WG_THREADS": 64,
                                                        "GEMM_3XTF32": 0, "PRODUCTS": "cublas", "WG_OUTPUT": "tiles"})
    plan = OPERATIONS["conv_bwd_data"].plan(problem, config)
    assert [s.kernel for s in plan.steps] == ["winograd_filter"] + 2 * [
        "winograd_input", "cublasSgemmStridedBatched", "winograd_output"]
    gemms = plan.library_gemms
    assert all(g.batch == 36 and not g.tf32 for g in gemms) and [g.n for g in gemms] == [2 * 4 * 3, 4 * 3]
    assert "constexpr bool FLIP = true;" in plan.source
    assert "tf32_part" not in plan.source


def test_3xtf32_products_are_one_tf32_gemm_over_three_blocks_of_the_reduction():
    """GEMM_3XTF32: U is COUT x 3·CIN and V 3·CIN x tiles per point, and the one GEMM per block of
    images runs on TF32 tensor-op math over all three blocks; tf32 problems keep TF32_GEMM."""
    problem = odd_problems("conv_fwd")[0][1]                 # N = 3, C = 5, K = 7
    sp = space("conv_fwd", problem)
    config = sp.validate({"formulation": NAME, "TILE": 2, "IMGS": 2, "WG_THREADS": 64, "GEMM_3XTF32": 1, "PRODUCTS": "cublas",
                          "WG_OUTPUT": "tiles"})
    plan = OPERATIONS["conv_fwd"].plan(problem, config)
    v, (th, tw) = view(problem), tiles(view(problem), 2)
    gemms = plan.library_gemms
    assert [(g.m, g.k, g.batch, g.tf32) for g in gemms] == 2 * [(7, 15, 16, True)]
    assert gemms[0].a.ld == 15 and gemms[0].a.batch_stride == 7 * 15
    assert gemms[0].b.batch_stride == 15 * 2 * th * tw
    assert dict(plan.workspaces)["wg_v"] == 16 * 15 * 2 * th * tw == 3 * workspace_elements(v, 2, 2)["wg_v"]
    assert "tf32_part" in plan.source
    plain = OPERATIONS["conv_fwd"].plan(problem, sp.validate({**config.as_dict(), "GEMM_3XTF32": 0, "PRODUCTS": "cublas"}))
    assert not any(g.tf32 for g in plain.library_gemms) and plain.library_gemms[0].k == 5
    tf32 = dataclasses.replace(problem, precision="tf32")
    with pytest.raises(InvalidConfigError, match="GEMM_3XTF32"):
        space("conv_fwd", tf32).validate({"formulation": NAME, "TILE": 2, "IMGS": 2, "WG_THREADS": 64,
                                          "TF32_GEMM": 0, "GEMM_3XTF32": 1, "PRODUCTS": "cublas", "WG_OUTPUT": "tiles"})


@pytest.mark.parametrize("x3", (0, 1))
def test_weight_gradient_plans_accumulate_the_points_gemms_over_blocks_of_images(x3):
    """conv_wgrad: per block, X's and dY's transforms and the points' GEMMs M (K x C) += P V^T
    (three with GEMM_3XTF32: hi·hi, lo·hi, hi·lo on the parts), then dW's transform and db."""
    problem = odd_problems("conv_wgrad")[4][1]                # N = 3, C = 5, K = 7, bias
    config = space("conv_wgrad", problem).validate({"formulation": NAME, "TILE": 2, "IMGS": 2, "WG_THREADS": 64,
                                                    "GEMM_3XTF32": x3, "PRODUCTS": "cublas", "BIAS_FUSED": 0})
    plan = OPERATIONS["conv_wgrad"].plan(problem, config)
    gemms_per_block = 3 if x3 else 1
    assert [s.kernel for s in plan.steps] == 2 * ["winograd_input", "winograd_grad", *gemms_per_block * [
        "cublasSgemmStridedBatched"]] + ["winograd_wgrad_output", "conv_bias_grad"]
    gemms = plan.library_gemms
    (th, tw), ld = tiles(view(problem), 2), 2 * tiles(view(problem), 2)[0] * tiles(view(problem), 2)[1]
    assert all((g.m, g.n, g.batch, g.trans_b, g.tf32) == (7, 5, 16, True, bool(x3)) for g in gemms)
    assert [g.k for g in gemms] == gemms_per_block * [2 * th * tw] + gemms_per_block * [th * tw]
    assert [g.accumulate for g in gemms] == [False] + (2 * gemms_per_block - 1) * [True]
    if x3:
        assert [(g.a.offset, g.b.offset) for g in gemms[:3]] == [(0, 0), (16 * 7 * ld, 0), (0, 16 * 5 * ld)]


def unfused(op, problem):
    """The plan as before its optional kernels' parameters, where they exist: the bias gradient as
    its own kernel (BIAS_FUSED 0), each thread storing its own output tile (WG_OUTPUT "tiles")."""
    if op == "conv_wgrad":
        return {"BIAS_FUSED": 0} if problem.bias else {}
    return {"WG_OUTPUT": "tiles"}


def mma_config(op, problem, m=2, imgs=2, **mma):
    """A config with PRODUCTS "mma" (32 x 32 tiles over 2 x 2 warps unless ``mma`` says otherwise)."""
    flag = "GEMM_3XTF32" if problem.precision == "fp32" else "TF32_GEMM"
    values = {"formulation": NAME, "TILE": m, "IMGS": imgs, "WG_THREADS": 64, flag: 0, "PRODUCTS": "mma",
              "MMA_BM": 32, "MMA_BN": 32, "MMA_BK": 16, "MMA_WM": 2, "MMA_WN": 2, "MMA_STAGES": 2, "MMA_FRAG": "pair",
              **({"MMA_SPLITK": 1} if op == "conv_wgrad" else {}),
              **({"MMA_CROSS": 0} if problem.precision == "fp32" else {}),   # CROSS: tests/test_cross_products.py
              **unfused(op, problem), **mma}
    return space(op, problem).validate(values)


def fitted(problem, m, imgs, mma, small=False):
    """An mma variant held within the problem's products: its tiles no larger than the rows and
    columns (32 where ``small``), its warps within the tiles, its splits within the reduction."""
    gemm = products_gemm(problem, imgs, m)
    out = {"MMA_WM": 2, "MMA_WN": 2, "MMA_BK": 16, **mma}
    bm, bn = (min(32 if small else mma.get(k, 32), max(32, next_pow2(n)))
              for k, n in (("MMA_BM", gemm.GM), ("MMA_BN", gemm.GN)))
    out.update(MMA_BM=bm, MMA_BN=bn, MMA_WM=min(out["MMA_WM"], bm // 16), MMA_WN=min(out["MMA_WN"], bn // 8))
    if "MMA_SPLITK" in out:
        steps = -(-gemm.GK // out["MMA_BK"])
        out["MMA_SPLITK"] = max(s for s in (1, 2, 4) if s <= min(out["MMA_SPLITK"], steps))
    return out


@pytest.mark.parametrize("op", OPS)
def test_mma_products_are_one_generated_kernel_per_block_of_images(op, rng):
    """PRODUCTS "mma": winograd_products (the tc core) replaces the cuBLAS GEMMs, one launch per
    block of images over (row tiles, column tiles, points x splits), with every transform written
    once (no TF32 parts, whatever the precision); conv_wgrad's splits add into an M cleared first,
    without splits its later blocks add to M. The plans compute the convolution in NumPy, a short
    last block and split reductions included."""
    problem = odd_problems(op)[0][1]                          # N = 3: blocks of 2 images, then 1
    v = view(problem)
    th, tw = tiles(v, 2)
    for splitk in ((1, 2) if op == "conv_wgrad" else (1,)):
        config = mma_config(op, problem, **({"MMA_SPLITK": splitk} if op == "conv_wgrad" else {}))
        plan = OPERATIONS[op].plan(problem, config)
        products = [s for s in plan.steps if s.kernel == "winograd_products"]
        assert not plan.library_gemms and len(products) == 2
        assert [s.scalars for s in products] == [(2 * th * tw, 0), (th * tw, int(op == "conv_wgrad"))]
        rows, cols = (v.COUT, v.CIN) if op == "conv_wgrad" else (v.COUT, 2 * th * tw)
        assert products[0].grid == (-(-rows // 32), -(-cols // 32), 16 * splitk)
        assert products[0].shared_bytes == 4 * 2 * (32 * 20 + (32 * 20 if op == "conv_wgrad" else 16 * 40))
        assert (plan.steps[0].kernel == "winograd_clear") == (splitk > 1)
        assert "tf32_part" not in plan.source and "winograd_products" in plan.source
        assert dict(plan.workspaces) == workspace_elements(v, 2, 2)
        check_plans(OPERATIONS[op], [("odd", problem)], lambda _p, c=config: [c], Kernels, rng)
    with pytest.raises(InfeasibleConfigError, match="PRODUCTS=mma splits in registers"):
        mma_config(op, problem, GEMM_3XTF32=1)


def test_fused_bias_gradient_is_summed_by_the_gradient_transform(rng):
    """BIAS_FUSED: no conv_bias_grad; winograd_grad takes db, which is zeroed before the plan and
    receives each block of images' share by atomics (a short last block included); the plans
    compute the gradients in NumPy, with cuBLAS's products and the mma kernel's. Problems without
    a bias have no such parameter."""
    problem = odd_problems("conv_wgrad")[4][1]                # N = 3, C = 5, K = 7, bias
    for products in ("cublas", "mma"):
        config = (mma_config("conv_wgrad", problem, BIAS_FUSED=1) if products == "mma" else space(
            "conv_wgrad", problem).validate({"formulation": NAME, "TILE": 2, "IMGS": 2, "WG_THREADS": 64,
                                             "GEMM_3XTF32": 0, "PRODUCTS": "cublas", "BIAS_FUSED": 1}))
        plan = OPERATIONS["conv_wgrad"].plan(problem, config)
        kernels = [s.kernel for s in plan.steps]
        assert "conv_bias_grad" not in kernels and "conv_bias_grad" not in plan.source
        assert plan.zero_first == ("db",) and "atomicAdd(db + first, sum)" in plan.source
        assert [s.args for s in plan.steps if s.kernel == "winograd_grad"] == 2 * [("dy", "wg_p", "db")]
        check_plans(OPERATIONS["conv_wgrad"], [("odd", problem)], lambda _p, c=config: [c], Kernels, rng)
    plain = odd_problems("conv_wgrad")[0][1]
    assert not plain.bias and "BIAS_FUSED" not in {p.name for p in space("conv_wgrad", plain).params}


def wgmma_problems(op: str) -> list[tuple[str, object]]:
    """Shapes the wgmma products take that divide nothing else evenly: odd image sizes, batch 1
    and 3, asymmetric padding, channels that are multiples of 4 but not of 8 or 32 (conv_fwd and
    conv_bwd_data read the products' reduction, the channels, in float4s), and for conv_wgrad
    (whose reduction is each block's tiles, in float4s) odd channel counts with 4 | tiles per
    image; a fused epilogue and a bias gradient."""
    if op == "conv_wgrad":
        return [("wq_odd", ConvFwdProblem(N=3, C=5, H=16, W=12, K=7, R=3, S=3, padding=1).with_op(op)),
                ("wq_batch1", ConvFwdProblem(N=1, C=3, H=18, W=14, K=9, R=3, S=3, padding=(2, 1, 0, 2)).with_op(op)),
                ("wq_bias", ConvFwdProblem(N=2, C=6, H=8, W=8, K=10, R=3, S=3, padding=1).with_op(op, bias=True))]
    fwd = [("wq_odd", ConvFwdProblem(N=3, C=12, H=13, W=11, K=20, R=3, S=3, padding=(0, 2, 1, 1))),
           ("wq_batch1", ConvFwdProblem(N=1, C=4, H=7, W=9, K=36, R=3, S=3, padding=(2, 1, 0, 2))),
           ("wq_relu", ConvFwdProblem(N=3, C=20, H=9, W=5, K=12, R=3, S=3, padding=1, bias=True, activation="relu"))]
    return fwd if op == "conv_fwd" else [(name, p.with_op(op)) for name, p in fwd if not p.bias]


def wgmma_config(op, problem, m=2, imgs=2, **wgmma):
    """A config with PRODUCTS "wgmma" (one warpgroup, 32 columns, 3 stages unless ``wgmma`` says)."""
    flag = "GEMM_3XTF32" if problem.precision == "fp32" else "TF32_GEMM"
    values = {"formulation": NAME, "TILE": m, "IMGS": imgs, "WG_THREADS": 64, flag: 0, "PRODUCTS": "wgmma",
              "WGMMA_WGS": 1, "WGMMA_BN": 32, "WGMMA_STAGES": 3, "WGMMA_INFLIGHT": 0,
              **({"WGMMA_SPLITK": 1} if op == "conv_wgrad" else {}), **unfused(op, problem), **wgmma}
    return space(op, problem).validate(values)


def wgmma_feasible(op, problem, splits=(1,), **values):
    """The wgmma config, or None where the space rules it out (a tile whose blocks of images hold a
    number of tiles that is not a multiple of 4, say); conv_wgrad takes the first of ``splits`` its
    reduction allows."""
    for splitk in (splits if op == "conv_wgrad" else (None,)):
        try:
            return wgmma_config(op, problem, **values, **({"WGMMA_SPLITK": splitk} if splitk else {}))
        except (InfeasibleConfigError, InvalidConfigError):
            continue
    return None


@pytest.mark.parametrize("op", OPS)
def test_wgmma_products_plan_and_compute_the_convolution_in_numpy(op, rng):
    """PRODUCTS "wgmma": winograd_products is the wgmma core over (row tiles, column tiles, points x
    splits), 128 threads a warpgroup, compiled for sm_90a; conv_fwd and conv_bwd_data have V stored
    tiles x CIN by an input transform of 32 channels a block (a warp a tile); the plans compute the
    convolution in NumPy with both tiles, blocks that divide the batch and ones that do not, split
    reductions, the bias gradient fused."""
    checked = 0
    for name, problem in wgmma_problems(op):
        v = view(problem)
        for m in (2, 4):
            for imgs in (1, 2):
                for splitk in ((1, 2) if op == "conv_wgrad" else (None,)):
                    extra = {"BIAS_FUSED": 1} if op == "conv_wgrad" and problem.bias else {}
                    config = wgmma_feasible(op, problem, (splitk,), m=m, imgs=imgs, **extra)
                    if config is None:
                        continue
                    plan = OPERATIONS[op].plan(problem, config)
                    assert plan.target_suffix == "a" and plan.compile_arch("sm_90") == "sm_90a"
                    products = [s for s in plan.steps if s.kernel == "winograd_products"]
                    th, tw = tiles(v, m)
                    b = min(imgs, v.N)
                    assert len(products) == -(-v.N // b) and not plan.library_gemms
                    cols = v.CIN if op == "conv_wgrad" else b * th * tw
                    assert products[0].grid == (-(-v.COUT // 64), -(-cols // 32), (m + 2) ** 2 * (splitk or 1))
                    assert products[0].block == (128, 1, 1)
                    inputs = [s for s in plan.steps if s.kernel == "winograd_input"]
                    if op != "conv_wgrad":       # 2 warps: a tile row of 2 (or 1) tiles, and 1 (or 2) rows
                        wide = min(2, next_pow2(tw))
                        assert inputs[0].grid == (-(-tw // wide), b * -(-th // (2 // wide)), -(-v.CIN // 32))
                        assert "V[e][t][ci]" in plan.source
                    assert (plan.steps[0].kernel == "winograd_clear") == (splitk == 2)
                    check_plans(OPERATIONS[op], [(name, problem)], lambda _p, c=config: [c], Kernels, rng)
                    checked += 1
    assert checked >= 2 * len(wgmma_problems(op))


def test_wgmma_products_are_ruled_out_where_they_cannot_run():
    """Not before Hopper; conv_fwd / conv_bwd_data with input channels that are no multiple of 4
    (the K-major operands' float4s); conv_wgrad blocks of images whose tiles are no multiple of 4;
    cuBLAS's 3xTF32 flag set; 3xTF32 with more than 128 columns (the partial sums' registers)."""
    fwd = wgmma_problems("conv_fwd")[0][1]
    ampere = OPERATIONS["conv_fwd"].space(fwd, DeviceLimits.for_arch("sm_80")).restrict({"formulation": NAME})
    base = {"formulation": NAME, "TILE": 2, "IMGS": 2, "WG_THREADS": 64, "GEMM_3XTF32": 0, "PRODUCTS": "wgmma",
            "WGMMA_WGS": 1, "WGMMA_BN": 32, "WGMMA_STAGES": 3, "WGMMA_INFLIGHT": 0, "WG_OUTPUT": "tiles"}
    with pytest.raises(InfeasibleConfigError, match="runs on sm_90"):
        ampere.validate(base)
    odd = odd_problems("conv_fwd")[0][1]                    # C = 5
    with pytest.raises(InfeasibleConfigError, match="the 5 input channels, in float4s"):
        wgmma_config("conv_fwd", odd)
    wgrad = ConvFwdProblem(N=3, C=5, H=13, W=11, K=7, R=3, S=3, padding=1).with_op("conv_wgrad")   # 42 tiles an image
    with pytest.raises(InfeasibleConfigError, match="each block's tiles"):
        wgmma_config("conv_wgrad", wgrad, imgs=1)
    with pytest.raises(InfeasibleConfigError, match="each block's tiles"):
        wgmma_config("conv_wgrad", wgrad, imgs=2)           # 84, then the last image's 42
    assert wgmma_config("conv_wgrad", dataclasses.replace(wgrad, N=4), imgs=2)["IMGS"] == 2
    with pytest.raises(InfeasibleConfigError, match="PRODUCTS=wgmma splits in shared memory"):
        wgmma_config("conv_fwd", fwd, GEMM_3XTF32=1)
    with pytest.raises(InfeasibleConfigError, match="at most 128"):
        wgmma_config("conv_fwd", dict(seed_problems("conv_fwd"))["modern_14"], m=4, imgs=32, WGMMA_BN=256)
    tf32 = dataclasses.replace(dict(seed_problems("conv_fwd"))["modern_14"], precision="tf32")
    assert wgmma_config("conv_fwd", tf32, m=4, imgs=32, WGMMA_BN=256)["WGMMA_BN"] == 256


@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ is not installed (needed to emulate kernels)")
@pytest.mark.parametrize("op", OPS)
def test_wgmma_plans_transforms_compute_the_convolution_under_emulation(op, tmp_path):
    """The CUDA transforms of the wgmma products' plans, run by the CPU emulator of
    tests/cuda_emulator.py (g++, an OS thread per CUDA thread, barriers and atomics emulated):
    conv_fwd's and conv_bwd_data's input transform that writes V tiles x CIN through a shared-memory
    window (a warp a tile, a lane a channel), the filter, output and gradient transforms, the split
    reductions' clearing and the fused bias gradient, with the points' products (wgmma, which the
    emulator cannot run) done in NumPy on the same buffers: the FP32 bound against float64, every
    element written, on the odd shapes with both tiles, short blocks of images, and 2 to 8 warps a
    transform block."""
    from tests.cuda_emulator import emulated_failure

    seed = random.randrange(2**31)
    failures, checked = [], 0
    for name, problem in wgmma_problems(op):
        for m, imgs, threads in ((2, 2, 64), (4, 1, 128), (2, 1, 256), (4, 2, 64)):
            extra = {"WG_THREADS": threads, **({"BIAS_FUSED": 1} if op == "conv_wgrad" and problem.bias else {})}
            config = wgmma_feasible(op, problem, (2, 1) if imgs == 1 else (1,), m=m, imgs=imgs, **extra)
            if config is None:
                continue
            products = Kernels(problem, config, np.float32).winograd_products
            checked += 1
            why = emulated_failure(OPERATIONS[op], problem, config, tmp_path, seed + checked,
                                   host={"winograd_products": products})
            if why:
                failures.append(why)
    assert checked >= 2 * len(wgmma_problems(op))
    assert not failures, f"seed {seed}: {len(failures)} of {checked} failed:\n" + "\n".join(failures[:6])


@pytest.mark.skipif(nvcc_path() is None, reason="nvcc is not installed")
def test_wgmma_products_build_for_sm90a_without_spills_or_serialized_wgmmas(tmp_path):
    """The wgmma products of each op in both precisions, one to four warpgroups, 32 to 256 columns,
    2 to 5 stages, with and without a group of wgmmas in flight, split reductions: nvcc -cubin for
    sm_90a, no spills and no wgmma serialized by ptxas (C7514)."""
    from autocnn.kernels.compiler import NvccCompiler
    from tests.formulation_checks import target_build_failures

    compiler = NvccCompiler("sm_90", cache_dir=tmp_path)
    variants = ({"WGMMA_WGS": 2, "WGMMA_BN": 128, "WGMMA_STAGES": 3},
                {"WGMMA_WGS": 1, "WGMMA_BN": 64, "WGMMA_STAGES": 4, "WGMMA_INFLIGHT": 1},
                {"WGMMA_WGS": 2, "WGMMA_BN": 64, "WGMMA_STAGES": 4, "WGMMA_INFLIGHT": 1},
                {"WGMMA_WGS": 4, "WGMMA_BN": 64, "WGMMA_STAGES": 2},
                {"WGMMA_WGS": 1, "WGMMA_BN": 32, "WGMMA_STAGES": 3, "WGMMA_INFLIGHT": 1})
    jobs = []
    for op in OPS:
        problem = dict(seed_problems(op))["modern_14"]
        for precision in ("fp32", "tf32"):
            p = dataclasses.replace(problem, precision=precision)
            for m in (2, 4):
                for variant in variants:
                    extra = {"WGMMA_SPLITK": 4} if op == "conv_wgrad" else {}
                    config = wgmma_config(op, p, m=m, imgs=8, WG_THREADS=256, **variant, **extra)
                    jobs.append((f"{op} {precision}", config, OPERATIONS[op].plan(p, config)))
            wide = wgmma_config(op, p, m=4, imgs=32, WGMMA_BN=256) if precision == "tf32" else None
            if wide is not None:
                jobs.append((f"{op} {precision}", wide, OPERATIONS[op].plan(p, wide)))
    failures = target_build_failures(compiler, jobs)
    assert len(jobs) == 3 * (2 * 2 * len(variants) + 1) and not failures, "\n".join(failures[:8])


@pytest.mark.skipif(nvcc_path() is None, reason="nvcc is not installed")
@pytest.mark.parametrize("arch", BUILD_ARCHES)
def test_templates_build_without_spills(arch, tmp_path):
    problems = {op: [*((n, p) for n, p in seed_problems(op) if n in SEEDS[:1]), *odd_problems(op)[:3]] for op in OPS}
    failures = build_failures(OPERATIONS, NAME, problems, arch, tmp_path)
    # GEMM_3XTF32's transforms (each value split in two, three stores a point), each tile, spill-free.
    jobs = [(f"{op} {label} {config}", OPERATIONS[op].plan(problem, config), True)
            for op in OPS for label, problem in problems[op][:2]
            for config in (space(op, problem).validate({"formulation": NAME, "TILE": m, "IMGS": 2,
                                                         "WG_THREADS": 128, "GEMM_3XTF32": 1, "PRODUCTS": "cublas",
                                                         **unfused(op, problem)}) for m in (2, 4))]
    # The mma products in both precisions, small and large tiles, both fragment reads, splits.
    for op in OPS:
        label, problem = "modern_14", dict(seed_problems(op))["modern_14"]
        for precision in ("fp32", "tf32"):
            p = dataclasses.replace(problem, precision=precision)
            for mma in ({}, {"MMA_BM": 128, "MMA_BN": 64, "MMA_BK": 32, "MMA_WM": 2, "MMA_WN": 2, "MMA_STAGES": 4,
                             "MMA_FRAG": "quad", **({"MMA_SPLITK": 4} if op == "conv_wgrad" else {})},
                        {"MMA_BM": 64, "MMA_BN": 128, "MMA_WM": 1, "MMA_WN": 4, "MMA_STAGES": 3}):
                config = mma_config(op, p, m=4, imgs=8, **mma)
                jobs.append((f"{op} {label} {precision} {config}", OPERATIONS[op].plan(p, config), True))
    # The bias gradient fused into dY's transform, each tile, with either products.
    wgrad = [(n, p) for n, p in problems["conv_wgrad"] if p.bias][:1] + [("modern_14", dict(seed_problems(
        "conv_wgrad"))["modern_14"])]
    for label, problem in wgrad:
        for m in (2, 4):
            for config in (mma_config("conv_wgrad", problem, m=m, BIAS_FUSED=1), space("conv_wgrad", problem).validate(
                    {"formulation": NAME, "TILE": m, "IMGS": 2, "WG_THREADS": 128, "GEMM_3XTF32": 1,
                     "PRODUCTS": "cublas", "BIAS_FUSED": 1})):
                jobs.append((f"conv_wgrad {label} {config}", OPERATIONS["conv_wgrad"].plan(problem, config), True))
    failures += compile_failures(jobs, arch, tmp_path)
    assert not failures, "\n".join(failures[:10])


def gpu_problems(op: str) -> list[tuple[str, object]]:
    return [(n, p) for n, p in seed_problems(op) if n in SEEDS] + odd_problems(op)


def rows_problems(op: str) -> list[tuple[str, object]]:
    """Shapes for WG_OUTPUT "rows" in each of its block shapes: several whole planes a block (small
    images), bands of tile rows of one plane (a plane's tiles more than the block's threads, the last
    band short), and a row of tiles wider than the block (its threads loop); odd sizes, asymmetric
    padding, a fused epilogue, a short last block of images."""
    fwd = [("wr_planes", ConvFwdProblem(N=5, C=8, H=9, W=7, K=12, R=3, S=3, padding=(1, 0, 2, 1))),
           ("wr_bands", ConvFwdProblem(N=3, C=8, H=23, W=19, K=12, R=3, S=3, padding=1, bias=True,
                                       activation="relu")),
           ("wr_wide", ConvFwdProblem(N=2, C=4, H=5, W=141, K=8, R=3, S=3, padding=(0, 1, 1, 0)))]
    return fwd if op == "conv_fwd" else [(name, p.with_op(op)) for name, p in fwd if not p.bias]


def test_staged_output_blocks_take_planes_bands_or_rows_and_fit_static_shared_memory():
    """output_rows: whole planes while a plane's tiles fit the threads (no more than the block of
    images), else bands of tile rows, at least one; its staging past 48 KB of static shared memory
    is ruled out by name, and the launch covers every plane and band."""
    from autocnn.kernels.formulations.winograd import output_rows

    fwd = dict(rows_problems("conv_fwd"))
    assert output_rows(fwd["wr_planes"], 4, 4, 128) == {"planes": 4, "band": 3, "bands": 1, "smem": 4 * 4 * 12 * 6}
    assert output_rows(fwd["wr_planes"], 4, 64, 256)["planes"] == 5          # capped at the batch
    bands = output_rows(fwd["wr_bands"], 2, 2, 64)                             # 12 x 10 tiles: 6 rows of 10
    assert (bands["planes"], bands["band"], bands["bands"]) == (1, 6, 2)
    wide = output_rows(fwd["wr_wide"], 2, 2, 64)                               # 2 rows of 70 tiles
    assert (wide["planes"], wide["band"], wide["bands"]) == (1, 1, 2)
    big = ConvFwdProblem(N=1, C=4, H=8, W=8000, K=4, R=3, S=3, padding=1)
    with pytest.raises(InfeasibleConfigError, match="WG_OUTPUT=rows stages 4 output rows of 8000"):
        space("conv_fwd", big).validate({"formulation": NAME, "TILE": 4, "IMGS": 1, "WG_THREADS": 64,
                                         "GEMM_3XTF32": 0, "WG_OUTPUT": "rows", "PRODUCTS": "cublas"})
    for op in ("conv_fwd", "conv_bwd_data"):
        for name, problem in rows_problems(op):
            v = view(problem)
            for m, imgs, threads in ((2, 2, 64), (4, 4, 256)):
                imgs = min(imgs, next_pow2(problem.N))
                config = space(op, problem).validate({"formulation": NAME, "TILE": m, "IMGS": imgs,
                                                      "WG_THREADS": threads, "GEMM_3XTF32": 0, "WG_OUTPUT": "rows",
                                                      "PRODUCTS": "cublas"})
                rows = output_rows(problem, m, imgs, threads)
                outs = [s for s in OPERATIONS[op].plan(problem, config).steps if s.kernel == "winograd_output"]
                blocks = [v.COUT * -(-min(imgs, v.N - n0) // rows["planes"]) * rows["bands"]
                          for n0 in range(0, v.N, min(imgs, v.N))]
                assert [s.grid for s in outs] == [(b, 1, 1) for b in blocks], name
    assert "WG_OUTPUT" not in {p.name for p in space("conv_wgrad", fwd["wr_planes"].with_op("conv_wgrad")).params}


@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ is not installed (needed to emulate kernels)")
@pytest.mark.parametrize("op", ("conv_fwd", "conv_bwd_data"))
def test_staged_output_rows_compute_the_convolution_under_emulation(op, tmp_path):
    """WG_OUTPUT "rows" run by the CPU emulator (the products, which it cannot run, in NumPy): whole
    planes, bands and rows wider than the block, both tiles, 2 to 8 warps, short blocks of images:
    the FP32 bound against float64, every element written."""
    from tests.cuda_emulator import emulated_failure

    seed = random.randrange(2**31)
    failures, checked = [], 0
    for name, problem in rows_problems(op):
        for m, imgs, threads in ((2, 2, 64), (4, 2, 128), (2, 4, 256), (4, 1, 64)):
            config = wgmma_feasible(op, problem, m=m, imgs=imgs, WG_THREADS=threads, WG_OUTPUT="rows")
            if config is None:
                continue
            checked += 1
            why = emulated_failure(OPERATIONS[op], problem, config, tmp_path, seed + checked,
                                   host={"winograd_products": Kernels(problem, config, np.float32).winograd_products})
            if why:
                failures.append(why)
    assert checked >= 3 * len(rows_problems(op))
    assert not failures, f"seed {seed}: {len(failures)} of {checked} failed:\n" + "\n".join(failures[:6])


@pytest.mark.gpu
@pytest.mark.parametrize("op", ("conv_fwd", "conv_bwd_data"))
def test_staged_output_rows_verify_on_every_shape(op):
    """WG_OUTPUT "rows" on the GPU with cuBLAS's products (FP32 and 3xTF32) and the wgmma ones: the
    seed 3x3 layers and the shapes of each block shape, both tiles, every element against float64."""
    pytest.importorskip("cupy")
    from autocnn.device import current_device
    from autocnn.kernels.runtime import KernelLoader
    from autocnn.measurement.measure import check_candidate

    limits = current_device(0).limits()
    loader = KernelLoader()
    failures, checked = [], 0
    problems = [(n, p) for n, p in seed_problems(op) if n in SEEDS] + rows_problems(op)
    for name, problem in problems:
        for m, imgs, threads, x3 in ((4, 16, 256, 1), (2, 2, 64, 0), (4, 4, 128, 0)):
            imgs = min(imgs, next_pow2(problem.N))
            config = space(op, problem).validate({"formulation": NAME, "TILE": m, "IMGS": imgs, "WG_THREADS": threads,
                                                  "GEMM_3XTF32": x3, "WG_OUTPUT": "rows", "PRODUCTS": "cublas"})
            configs = [config]
            wg = wgmma_feasible(op, problem, m=m, imgs=imgs, WG_THREADS=threads, WG_OUTPUT="rows")
            if wg is not None and limits.arch == "sm_90":
                configs.append(wg)
            for c in configs:
                check = check_candidate(loader.load(OPERATIONS[op].plan(problem, c)), problem, time_it=False)
                checked += 1
                if not check.verification.passed:
                    failures.append(f"{name} {c}: {check.verification.message}")
    assert checked >= 3 * len(problems)
    assert not failures, f"{len(failures)} of {checked} failed:\n" + "\n".join(failures[:8])


@pytest.mark.gpu
@pytest.mark.parametrize("op", OPS)
def test_winograd_verifies_against_float64_on_the_gpu(op):
    """Default candidates (F(4x4) and F(2x2)) and sampled configs of the seed 3x3 shapes and odd
    ones pass the FP32 bound, every element checked, the workspace within the limit."""
    pytest.importorskip("cupy")
    assert_verifies_on_gpu(OPERATIONS[op], NAME, gpu_problems(op), 4, WORKSPACE_LIMIT_BYTES)


@pytest.mark.gpu
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("m", (2, 4))
def test_each_tile_verifies_on_the_seed_shapes(op, m):
    """F(2x2,3x3) and F(4x4,3x3) each, on every seed 3x3 layer (the accuracy table of MEASUREMENTS.md)."""
    pytest.importorskip("cupy")
    from autocnn.device import current_device
    from autocnn.kernels.runtime import KernelLoader
    from autocnn.measurement.measure import check_candidate

    limits = current_device(0).limits()
    loader = KernelLoader()
    for name, problem in gpu_problems(op)[:len(SEEDS)]:
        default = OPERATIONS[op].default_config(problem, limits, formulation=NAME)
        config = OPERATIONS[op].space(problem, limits).validate({**default.as_dict(), "TILE": m, "IMGS": 1})
        check = check_candidate(loader.load(OPERATIONS[op].plan(problem, config)), problem, time_it=False)
        assert check.verification.passed, f"{name} F({m}x{m},3x3): {check.verification.message}"


@pytest.mark.gpu
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("precision", ("fp32", "tf32"))
def test_mma_products_verify_on_every_shape(op, precision):
    """PRODUCTS "mma" in both precisions, on the seed 3x3 layers and the odd shapes, blocks of
    images that divide the batch and ones that do not, tiles of 32 to 128, both fragment reads,
    split reductions: every element against float64. fp32 (3xTF32 split in registers) passes the
    one FP32 bound with both tiles. tf32 is held to F(2x2,3x3): F(4x4)'s larger transform constants
    with one TF32 product per term went past the tf32 bound on an H100 (sweep_3x3 forward 3.19e-3
    against 1.95e-3, as with cuBLAS's TF32 products), so there the tuner's verification decides."""
    pytest.importorskip("cupy")
    from autocnn.device import current_device
    from autocnn.kernels.runtime import KernelLoader
    from autocnn.measurement.measure import check_candidate

    limits = current_device(0).limits()
    loader = KernelLoader()
    variants = ({}, {"MMA_BM": 64, "MMA_BN": 64, "MMA_BK": 32, "MMA_STAGES": 3, "MMA_FRAG": "quad",
                     **({"MMA_SPLITK": 4} if op == "conv_wgrad" else {})},
                {"MMA_BM": 128, "MMA_BN": 64, "MMA_BK": 32, "MMA_WM": 4, "MMA_WN": 1, "MMA_STAGES": 4,
                 **({"MMA_SPLITK": 2} if op == "conv_wgrad" else {})})
    checked = 0
    for name, problem in gpu_problems(op):
        problem = dataclasses.replace(problem, precision=precision)
        seed = name in SEEDS     # the seeds take the large tiles, the odd shapes small ones and short blocks
        allowed = next(p.choices for p in OPERATIONS[op].space(problem, limits).params if p.name == "IMGS")
        for m in ((2, 4) if precision == "fp32" else (2,)):
            for imgs in sorted(set((16,) if seed else (1, 2)) & set(allowed)):
                for mma in (variants[1:] if seed else variants[:1] + variants[1:2] * (op == "conv_wgrad")):
                    config = mma_config(op, problem, m=m, imgs=imgs, **fitted(problem, m, imgs, mma, small=not seed))
                    check = check_candidate(loader.load(OPERATIONS[op].plan(problem, config)), problem,
                                            time_it=False)
                    assert check.verification.passed, f"{name} {config}: {check.verification.message}"
                    checked += 1
    assert checked >= len(gpu_problems(op))     # every problem, each tile: none is left out


@pytest.mark.gpu
@pytest.mark.parametrize("precision", ("fp32", "tf32"))
def test_fused_bias_gradient_verifies_on_every_shape(precision):
    """BIAS_FUSED on the GPU: the weight gradients with a bias (the seed 3x3 layers and the odd
    shapes with one), each tile (tf32: F(2x2)), blocks of 1, 2 and 16 images, with cuBLAS's products and
    the mma kernel's: dW and db, every element against float64."""
    pytest.importorskip("cupy")
    from autocnn.device import current_device
    from autocnn.kernels.runtime import KernelLoader
    from autocnn.measurement.measure import check_candidate

    limits = current_device(0).limits()
    loader = KernelLoader()
    flag = "GEMM_3XTF32" if precision == "fp32" else "TF32_GEMM"
    checked = 0
    for name, problem in gpu_problems("conv_wgrad"):
        if not problem.bias:
            continue
        problem = dataclasses.replace(problem, precision=precision)
        allowed = next(p.choices for p in OPERATIONS["conv_wgrad"].space(problem, limits).params if p.name == "IMGS")
        for m in ((2, 4) if precision == "fp32" else (2,)):
            for imgs in sorted(set((16,) if name in SEEDS else (1, 2)) & set(allowed)):
                mma = fitted(problem, m, imgs, {"MMA_SPLITK": 2}, small=name not in SEEDS)
                for config in (mma_config("conv_wgrad", problem, m=m, imgs=imgs, BIAS_FUSED=1, **mma),
                               space("conv_wgrad", problem).validate(
                                   {"formulation": NAME, "TILE": m, "IMGS": imgs, "WG_THREADS": 128, flag: 0,
                                    "PRODUCTS": "cublas", "BIAS_FUSED": 1})):
                    check = check_candidate(loader.load(OPERATIONS["conv_wgrad"].plan(problem, config)), problem,
                                            time_it=False)
                    assert check.verification.passed, f"{name} {config}: {check.verification.message}"
                    checked += 1
    assert checked >= 2 * len(SEEDS)


@pytest.mark.gpu
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("m", (2, 4))
def test_3xtf32_products_verify_on_every_shape(op, m):
    """GEMM_3XTF32 on the tensor cores, each tile, on the seed 3x3 layers and the odd shapes, with
    blocks of images that divide the batch and ones that do not: the one FP32 bound, every element."""
    pytest.importorskip("cupy")
    from autocnn.device import current_device
    from autocnn.kernels.runtime import KernelLoader
    from autocnn.measurement.measure import check_candidate

    limits = current_device(0).limits()
    loader = KernelLoader()
    for name, problem in gpu_problems(op):
        sp = OPERATIONS[op].space(problem, limits)
        allowed = next(p.choices for p in sp.params if p.name == "IMGS")
        for imgs in sorted({1, 2, 16} & set(allowed)):
            config = sp.validate({"formulation": NAME, "TILE": m, "IMGS": imgs, "WG_THREADS": 128, "GEMM_3XTF32": 1,
                                  "PRODUCTS": "cublas", **unfused(op, problem)})
            check = check_candidate(loader.load(OPERATIONS[op].plan(problem, config)), problem, time_it=False)
            assert check.verification.passed, f"{name} F({m}x{m},3x3) {config}: {check.verification.message}"


@pytest.mark.gpu
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("precision", ("fp32", "tf32"))
def test_wgmma_products_verify_on_every_shape(op, precision):
    """PRODUCTS "wgmma" in both precisions on the seed 3x3 layers and the odd shapes the products
    take, blocks of images that divide the batch and ones that do not, one to four warpgroups, 32
    to 256 columns, a group of wgmmas in flight or not, split reductions: every element against
    float64. fp32 (3xTF32 split in shared memory) passes the one FP32 bound with both tiles; tf32
    is held to F(2x2,3x3) as with the mma products (F(4x4)'s constants with one TF32 product per
    term went past the tf32 bound; the tuner's verification decides there)."""
    pytest.importorskip("cupy")
    from autocnn.device import current_device
    from autocnn.kernels.compiler import CompilePool
    from autocnn.kernels.runtime import KernelLoader
    from autocnn.measurement.measure import check_candidate

    device = current_device(0)
    limits = device.limits()
    loader = KernelLoader()
    seed_variants = ({"WGMMA_WGS": 2, "WGMMA_BN": 128, "WGMMA_STAGES": 3, "WG_THREADS": 256},
                     {"WGMMA_WGS": 1, "WGMMA_BN": 64, "WGMMA_STAGES": 4, "WGMMA_INFLIGHT": 1, "WG_THREADS": 128})
    odd_variants = ({}, {"WGMMA_BN": 64, "WGMMA_INFLIGHT": 1, "WGMMA_STAGES": 4})
    cases = []
    problems = [(n, p) for n, p in seed_problems(op) if n in SEEDS] + wgmma_problems(op)
    for name, problem in problems:
        problem = dataclasses.replace(problem, precision=precision)
        seed = name in SEEDS
        for m in ((2, 4) if precision == "fp32" else (2,)):
            for imgs in ((16,) if seed else (1, 2)):
                for variant in (seed_variants if seed else odd_variants):
                    extra = dict(variant)
                    if op == "conv_wgrad" and problem.bias:
                        extra["BIAS_FUSED"] = 1
                    config = wgmma_feasible(op, problem, (4, 2, 1) if seed else (2, 1), m=m, imgs=imgs, **extra)
                    if config is not None:
                        cases.append((name, problem, config, OPERATIONS[op].plan(problem, config)))
    assert len(cases) >= (2 if precision == "fp32" else 1) * len(problems)
    # Some hundred sm_90a builds: where nvcc is there they are built side by side (what the tuner
    # measures); the first case of each problem also goes through NVRTC, what the library loads.
    cubins = [None] * len(cases)
    if nvcc_path() is not None:
        with CompilePool(device.arch) as pool:
            cubins = [f.result().cubin_path for f in [pool.submit(plan) for *_, plan in cases]]
    first, failures, checked = set(), [], 0
    for (name, problem, config, plan), cubin in zip(cases, cubins):
        for path in ((cubin, None) if cubin is not None and name not in first else (cubin,)):
            first.add(name)
            check = check_candidate(loader.load(plan, path), problem, time_it=False)
            checked += 1
            if not check.verification.passed:
                how = "NVRTC" if path is None else "nvcc"
                failures.append(f"{name} {config} ({how}): {check.verification.message}")
    assert checked >= len(cases)
    assert not failures, f"{len(failures)} of {checked} failed:\n" + "\n".join(failures[:10])
