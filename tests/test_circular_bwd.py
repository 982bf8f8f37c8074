"""conv_bwd_fused and its one-pass formulation circular_bwd (Scherer et al. 2010's backward: dY loaded
once for the weight gradients and the error pushed back through a second circular buffer). On
the CPU: the problem type (validation, shapes, the reference equal to conv_bwd_data's and
conv_wgrad's, reduction lengths), the operation's plans, a NumPy model of the kernel that follows
its indexing (both buffers, both phases' thread mappings, the flushes, both ways of combining
partial weight gradients) against float64, and nvcc builds with ptxas reports; on the GPU (-m gpu),
every element of dx, dw and db against float64 on the scherer10 shapes and uneven ones."""
from __future__ import annotations

import dataclasses
import random

import numpy as np
import pytest

from autocnn.device import DeviceLimits
from autocnn.errors import InvalidProblemError
from autocnn.kernels import get_operation, reference
from autocnn.kernels.compiler import NvccCompiler, nvcc_path
from autocnn.kernels.conv_bwd_fused import ConvBwdFusedProblem
from autocnn.kernels.formulations.circular_bwd import ATOMIC, TWO_PASS, bwd_grid, bwd_parts, bwd_threads
from autocnn.kernels.formulations.cores.circular_rows import phase_len, strip_width
from autocnn.kernels.geometry import cdiv
from autocnn.kernels.problem import ConvBwdDataProblem, ConvWgradProblem, parse_shape, problem_from_dict
from autocnn.kernels.suite import odd_problems, seed_problems
from tests.formulation_checks import BUILD_ARCHES
from tests.test_circular import load_rows, scherer10_problems, uneven_problems

LIMITS = DeviceLimits.for_arch("sm_90")
OP = get_operation("conv_bwd_fused")


def fused(problem) -> ConvBwdFusedProblem:
    return ConvBwdFusedProblem(**problem.geometry(), bias=getattr(problem, "bias", True))


def configs(problem, rng: random.Random, count: int, **fixed) -> list:
    """The first default candidate that fits and ``count`` sampled configs (with ``fixed`` values)."""
    space = OP.space(problem, LIMITS)
    if fixed:
        space = space.restrict(fixed)
        default = []
    else:
        default = [OP.default_config(problem, LIMITS)]
    return [*default, *space.sample(rng, count, exclude=default)]


# -- the problem type --------------------------------------------------------------------------

def test_the_problem_is_registered_and_validated():
    p = ConvBwdFusedProblem(N=2, C=3, H=9, W=8, K=5, R=3, S=3, stride=2, padding=(1, 0, 1, 1))
    assert get_operation("conv_bwd_fused") is OP and OP.problem_type is ConvBwdFusedProblem
    assert problem_from_dict(p.to_dict()) == p
    assert parse_shape("conv_bwd_fused", p.shape_string()) == p
    assert p.shape_string().endswith("pad=1,0,1,1") and ",bias=0" in dataclasses.replace(p, bias=False).shape_string()
    assert p.with_op("conv_wgrad", bias=p.bias) == ConvWgradProblem(**p.geometry(), bias=True)
    with pytest.raises(InvalidProblemError, match="bias"):
        ConvBwdFusedProblem(N=2, C=3, H=9, W=8, K=5, R=3, S=3, bias=1)
    with pytest.raises(InvalidProblemError, match="padding"):
        ConvBwdFusedProblem(N=2, C=3, H=9, W=8, K=5, R=3, S=3, padding=3)
    assert reference.input_shapes(p) == {"x": (2, 3, 9, 8), "dy": p.y_shape, "w": (5, 3, 3, 3)}
    assert reference.output_shapes(p) == {"dx": (2, 3, 9, 8), "dw": (5, 3, 3, 3), "db": (5,)}
    assert "db" not in reference.output_shapes(dataclasses.replace(p, bias=False))


@pytest.mark.parametrize("label,problem", [*uneven_problems()[:3], *scherer10_problems(2)[2:]])
@pytest.mark.parametrize("bias", (True, False))
def test_the_reference_is_the_two_existing_references(label, problem, bias, rng):
    p = dataclasses.replace(fused(problem), bias=bias)
    inputs = {k: rng.standard_normal(s) for k, s in reference.input_shapes(p).items()}
    out = reference.run_problem(p, inputs)
    dx = reference.run_problem(ConvBwdDataProblem(**p.geometry()), {"dy": inputs["dy"], "w": inputs["w"]})
    wg = reference.run_problem(ConvWgradProblem(**p.geometry(), bias=bias), {"x": inputs["x"], "dy": inputs["dy"]})
    assert set(out) == {"dx", *wg}
    np.testing.assert_array_equal(out["dx"], dx["dx"])
    for name in wg:
        np.testing.assert_array_equal(out[name], wg[name])
    wgrad = ConvWgradProblem(**p.geometry(), bias=bias)
    assert reference.reduction_length(p, "dx") == reference.reduction_length(ConvBwdDataProblem(**p.geometry()), "dx")
    for name in wg:
        assert reference.reduction_length(p, name) == reference.reduction_length(wgrad, name)


def test_plans_zero_what_they_accumulate_and_reduce_in_a_second_pass():
    p = fused(uneven_problems()[1][1])
    space = OP.space(p, LIMITS)
    base = OP.default_config(p, LIMITS).as_dict()
    atomic = OP.plan(p, space.validate({**base, "COMBINE": ATOMIC}))
    assert atomic.zero_first == ("dx", "dw", "db") and not atomic.workspaces
    assert [l.kernel for l in atomic.launches] == ["conv_bwd_fused"]
    two = space.validate({**base, "COMBINE": TWO_PASS})
    plan = OP.plan(p, two)
    assert plan.zero_first == ("dx",)
    assert [l.kernel for l in plan.launches] == ["conv_bwd_fused", "conv_bwd_fused_reduce"]
    parts = bwd_parts(p, two)
    assert dict(plan.workspaces) == {"ws": parts * p.K * p.C * p.R * p.S, "ws_bias": parts * p.K}
    assert plan.inputs == ("x", "dy", "w") and OP.flops(p) == 4 * p.macs


def test_the_papers_configuration_is_in_the_space():
    """One source map, eight target maps of 8x8 filters: 512 threads, one per filter element."""
    p = fused(scherer10_problems()[1][1])
    config = OP.space(p, LIMITS).validate({"KB": 8, "KPT": 1, "SPT": 1, "CB": 1, "TQ": 32, "ROWS": 8, "PBLK": 64,
                                           "MSPLIT": 1, "PAD": 0, "UNROLL_Q": 1, "COMBINE": ATOMIC,
                                           "MINB": 1})
    assert OP.plan(p, config).launches[0].block == (512, 1, 1)


# -- a NumPy model of the kernel -------------------------------------------------------------------

def model_fused(p: ConvBwdFusedProblem, c, x, w, dy):
    """The circular_bwd_conv_bwd_fused.cu.j2 kernel block by block, threads vectorised; the source
    buffer and two-pass partials start as NaN, so reading what was never written shows."""
    KB, KPT, SPT, CB, TQ = c["KB"], c["KPT"], c["SPT"], c["CB"], c["TQ"]
    ROWS, PBLK, MSPLIT, PAD = c["ROWS"], c["PBLK"], c["MSPLIT"], c["PAD"]
    R, S, (SH, SW), (PT, PL) = p.R, p.S, p.stride, p.padding[:2]
    UMAX, PH = cdiv(S, SW), min(SW, S)
    IWT, MW = strip_width(TQ, S, SW), phase_len(TQ, S, SW)
    LDM = MW + PAD
    KG, SG = KB // KPT, cdiv(S, SPT)
    A, B = KG * CB * R * SG, CB * R * PH * MSPLIT
    THREADS = bwd_threads(p, KB, KPT, SPT, CB, MSPLIT)
    STRIPS, SEGS, KGROUPS = cdiv(p.Q, TQ), cdiv(p.P, PBLK), cdiv(p.K, KB)
    two_pass = c["COMBINE"] == TWO_PASS
    dx = np.zeros(p.x_shape)
    dw, db = np.zeros(p.w_shape), np.zeros(p.K)
    parts = bwd_parts(p, c)
    ws, ws_bias = np.full((parts, *p.w_shape), np.nan), np.full((parts, p.K), np.nan)
    tid = np.arange(THREADS)
    a_on = tid < A
    sg, ar, ac, kg = tid % SG, (tid // SG) % R, (tid // (SG * R)) % CB, tid // (SG * R * CB)
    b_on = tid < B
    mg, ph, br, bc = tid % MSPLIT, (tid // MSPLIT) % PH, (tid // (MSPLIT * PH)) % R, tid // (MSPLIT * PH * R)
    gx, gy, gz = bwd_grid(p, c)

    def flush(acc_s, n, c0, h0, w0, a, b):
        i, cc, xx = np.meshgrid(np.arange(a, b), np.arange(CB), np.arange(IWT), indexing="ij")
        cells = ((cc * R + i % R) * SW + xx % SW) * LDM + xx // SW
        v = acc_s[cells]
        acc_s[cells] = 0.0
        ci, h, ww = c0 + cc, h0 + i, w0 + xx
        ok = (ci < p.C) & (h >= 0) & (h < p.H) & (ww >= 0) & (ww < p.W)
        np.add.at(dx[n], (ci[ok], h[ok], ww[ok]), v[ok])

    for bx in range(gx):
        strip, seg = bx % STRIPS, bx // STRIPS
        q0, p0 = strip * TQ, seg * PBLK
        h0, w0 = p0 * SH - PT, q0 * SW - PL
        steps = min(PBLK, p.P - p0)
        total = (steps - 1) * SH + R
        for by in range(gy):
            kgrp, cgrp = by % KGROUPS, by // KGROUPS
            k0, c0 = kgrp * KB, cgrp * CB
            bias_thread = p.bias & a_on & (cgrp == 0) & (ac == 0) & (ar == 0) & (sg == 0)
            u, k = np.arange(UMAX)[None, :, None], np.arange(KB)[None, None, :]
            s_w, kk, ci = ph[:, None, None] + u * SW, k0 + k, (c0 + bc)[:, None, None]
            valid = b_on[:, None, None] & (kk < p.K) & (ci < p.C) & (s_w < S)
            wreg = np.where(valid, w[np.minimum(kk, p.K - 1), np.minimum(ci, p.C - 1), br[:, None, None],
                                     np.minimum(s_w, S - 1)], 0.0)
            for n in range(gz):
                dy_s = np.zeros((TQ + 2 * (UMAX - 1), KB))
                acc_s = np.zeros(CB * R * SW * LDM)
                buf = np.full(CB * ROWS * SW * LDM, np.nan)
                dwacc, bacc = np.zeros((THREADS, KPT, SPT)), np.zeros((THREADS, KPT))
                loaded = base_slot = acc_base = 0
                for t in range(steps):
                    pr = p0 + t
                    if loaded < t * SH + R:
                        load_rows(buf, x[n], p, c0, h0, w0, loaded, t * SH + R, CB, ROWS, LDM, IWT, SH, R)
                        loaded = t * SH + R
                    gq, gk = q0 + np.arange(TQ)[:, None], k0 + np.arange(KB)[None, :]
                    dy_s[UMAX - 1:UMAX - 1 + TQ] = np.where((gk < p.K) & (gq < p.Q),
                                                            dy[n, np.minimum(gk, p.K - 1), pr, np.minimum(gq, p.Q - 1)], 0.0)
                    pre = min(t * SH + ROWS, total)
                    if loaded < pre:   # before the reads here: a prefetch into a read slot shows
                        load_rows(buf, x[n], p, c0, h0, w0, loaded, pre, CB, ROWS, LDM, IWT, SH, R)
                        loaded = pre
                    # phase A
                    xrow = (ac * ROWS + (base_slot + ar) % ROWS) * SW * LDM
                    s_a = sg[:, None] * SPT + np.arange(SPT)[None, :]
                    for q in range(TQ):
                        dv = dy_s[UMAX - 1 + q][np.minimum(kg, KG - 1)[:, None] * KPT + np.arange(KPT)[None, :]]
                        xv = np.where(s_a < S, buf[np.where(s_a < S, xrow[:, None] + (s_a % SW) * LDM + q + s_a // SW, 0)], 0.0)
                        dwacc += np.where(a_on[:, None, None], dv[:, :, None] * xv[:, None, :], 0.0)
                        bacc += np.where(bias_thread[:, None], dv, 0.0)
                    # phase B
                    arow = ((bc * R + (acc_base + br) % R) * SW + ph) * LDM
                    for m in range(MW):
                        on = b_on & (mg == m % MSPLIT)
                        rows = UMAX - 1 + m - np.arange(UMAX)
                        part = np.einsum("uk,tuk->t", dy_s[rows], wreg)
                        cells = arow[on] + m
                        assert len(set(cells.tolist())) == len(cells), "two writers of one accumulator cell"
                        acc_s[cells] += part[on]
                    flush(acc_s, n, c0, h0, w0, t * SH, t * SH + min(SH, R))
                    base_slot, acc_base = (base_slot + SH) % ROWS, (acc_base + SH) % R
                flush(acc_s, n, c0, h0, w0, steps * SH, (steps - 1) * SH + R)
                assert not acc_s.any(), "rows left in the accumulator"
                part_index = (n * SEGS + seg) * STRIPS + strip
                for i in range(KPT):
                    for j in range(SPT):
                        kq, cq, sq = k0 + kg * KPT + i, c0 + ac, sg * SPT + j
                        ok = a_on & (kq < p.K) & (cq < p.C) & (sq < S)
                        if two_pass:
                            ws[part_index, kq[ok], cq[ok], ar[ok], sq[ok]] = dwacc[ok, i, j]
                        else:
                            np.add.at(dw, (kq[ok], cq[ok], ar[ok], sq[ok]), dwacc[ok, i, j])
                    kq = k0 + kg * KPT + i
                    ok = bias_thread & (kq < p.K)
                    if two_pass:
                        ws_bias[part_index, kq[ok]] = bacc[ok, i]
                    else:
                        np.add.at(db, kq[ok], bacc[ok, i])
    if two_pass:
        dw, db = ws.sum(axis=0), ws_bias.sum(axis=0)
    return {"dx": dx, "dw": dw, **({"db": db} if p.bias else {})}


MODEL_PROBLEMS = [*uneven_problems(),
                  ("scherer_mini", ConvBwdFusedProblem(N=1, C=3, H=40, W=36, K=9, R=8, S=8, stride=2, padding=3))]


@pytest.mark.parametrize("label,problem", MODEL_PROBLEMS)
@pytest.mark.parametrize("combine", (ATOMIC, TWO_PASS))
def test_the_kernel_model_computes_both_gradients(label, problem, combine, rng):
    """The default and sampled configs: the model of the kernel's indexing gives dx, dw and db of
    the float64 reference to rounding (every source pixel flushed once, every partial written)."""
    p = fused(problem)
    pyrng = random.Random(int(rng.integers(2**31)))
    chosen = configs(p, pyrng, 3, COMBINE=combine)
    if combine == ATOMIC:
        chosen.insert(0, OP.default_config(p, LIMITS))
    inputs = {k: rng.standard_normal(s) for k, s in reference.input_shapes(p).items()}
    expected = reference.run_problem(p, inputs)
    for config in chosen:
        got = model_fused(p, config, inputs["x"], inputs["w"], inputs["dy"])
        for name, ref in expected.items():
            assert not np.isnan(got[name]).any(), f"{label} {config}: {name} read or left unwritten memory"
            np.testing.assert_allclose(got[name], ref, rtol=1e-10, atol=1e-10, err_msg=f"{label} {config} {name}")


# -- nvcc ------------------------------------------------------------------------------------------

def build_problems() -> list[tuple[str, ConvBwdFusedProblem]]:
    seeds = [(n, fused(pr)) for n, pr in seed_problems("conv_wgrad") if n.startswith("scherer10")]
    return ([(n, fused(pr)) for n, pr in scherer10_problems()] + seeds
            + [(n, fused(pr)) for n, pr in uneven_problems()[:3]])


@pytest.mark.skipif(nvcc_path() is None, reason="nvcc is not installed")
@pytest.mark.parametrize("arch", BUILD_ARCHES)
def test_templates_build_without_spills(arch, tmp_path):
    """Each shape's default (no spills) and two sampled configs of each way of combining: every
    kernel of the plan reported by ptxas."""
    limits = DeviceLimits.for_arch(arch)
    compiler = NvccCompiler(arch, cache_dir=tmp_path)
    rng = random.Random()
    failures = []
    for label, problem in build_problems():
        space = OP.space(problem, limits)
        default = OP.default_config(problem, limits)
        chosen = [default, *space.restrict({"COMBINE": ATOMIC}).sample(rng, 1, exclude=[default]),
                  *space.restrict({"COMBINE": TWO_PASS}).sample(rng, 1)]
        for i, config in enumerate(chosen):
            plan = OP.plan(problem, config)
            module = compiler.compile(plan.source, config=config)
            missing = set(plan.kernel_names) - set(module.reports)
            spills = [str(r) for r in module.reports.values() if r.spills] if i == 0 else []
            if missing or spills:
                failures.append(f"{label} {config}: missing {missing}, spills {spills}")
    assert not failures, "\n".join(failures[:10])


# -- the GPU ---------------------------------------------------------------------------------------

def gpu_problems() -> list[tuple[str, ConvBwdFusedProblem]]:
    """The scherer10 layers at 60 and 1 images, the seed suite's, and uneven ones (batch 1 and 3,
    odd sizes, asymmetric padding, strides 1, 2 and 3, K and C not multiples of the maps per block)."""
    zoo = [(n, fused(pr)) for n, pr in scherer10_problems(60) + scherer10_problems(1)]
    seeds = [(n, fused(pr)) for n, pr in seed_problems("conv_wgrad") if n.startswith("scherer10")]
    odd = [(n, fused(pr)) for n, pr in uneven_problems()] + [(n, fused(pr)) for n, pr in odd_problems("conv_wgrad")]
    return zoo + seeds + odd + [(n + "_nobias", dataclasses.replace(pr, bias=False)) for n, pr in odd[:2]]


@pytest.mark.gpu
@pytest.mark.parametrize("combine", (ATOMIC, TWO_PASS))
def test_circular_bwd_verifies_against_float64_on_the_gpu(combine):
    """Defaults and three sampled configs of each shape: dx, dw and db every element within the
    FP32 bound of their reduction lengths, the workspace within the limit."""
    pytest.importorskip("cupy")
    from autocnn.device import current_device
    from autocnn.kernels.runtime import KernelLoader
    from autocnn.measurement.measure import check_candidate

    limits = current_device(0).limits()
    loader = KernelLoader()
    rng = random.Random()
    failures, checked = [], 0
    for label, problem in gpu_problems():
        space = OP.space(problem, limits)
        default = OP.space(problem, limits).validate({**OP.default_config(problem, limits).as_dict(), "COMBINE": combine})
        for config in [default, *space.restrict({"COMBINE": combine}).sample(rng, 3, exclude=[default])]:
            plan = OP.plan(problem, config)
            checked += 1
            if plan.workspace_bytes > limits.workspace_bytes:
                failures.append(f"{label} {config}: {plan.workspace_bytes} bytes of workspace")
                continue
            check = check_candidate(loader.load(plan), problem, time_it=False)
            if not check.verification.passed:
                failures.append(f"{label} {config}: {check.verification.message}")
    assert checked >= 4 * len(gpu_problems()), f"only {checked} configs ran"
    assert not failures, f"{len(failures)} of {checked} failed:\n" + "\n".join(failures[:8])
