"""Convolution fused with averaging (kernels/conv_pool.py): problems, references (against naive
loops and finite differences), block geometry, rendering and nvcc builds of every formulation on
the zoo's layer pairs and odd shapes; on a GPU, every formulation verified against float64."""
from __future__ import annotations

import dataclasses
import random

import numpy as np
import pytest

from autocnn.device import DeviceLimits
from autocnn.errors import InvalidProblemError
from autocnn.kernels import OPERATIONS, problem_from_dict, reference
from autocnn.kernels.compiler import NvccCompiler, nvcc_path
from autocnn.kernels.conv_pool_problems import ConvPoolDzProblem, ConvPoolFwdProblem, odd_pairs, zoo_pairs
from autocnn.kernels.formulations.cores.pool_blocks import rectangle
from autocnn.kernels.geometry import cdiv
from tests.formulation_checks import compile_failures

FWD, DZ = OPERATIONS["conv_pool_fwd"], OPERATIONS["conv_pool_dz"]
LIMITS = DeviceLimits.for_arch("sm_90")
needs_nvcc = pytest.mark.skipif(nvcc_path() is None, reason="nvcc is not installed")


def odd(keep: bool) -> list[tuple[str, ConvPoolFwdProblem]]:
    return odd_pairs(keep)


def shapes(keep: bool) -> list[tuple[str, ConvPoolFwdProblem]]:
    return zoo_pairs(128, keep) + odd(keep)


# -- problems -------------------------------------------------------------------------------------

def test_pool_fields_are_normalised_and_round_trip():
    p = ConvPoolFwdProblem(N=2, C=3, H=8, W=8, K=4, R=3, S=3, padding=1, pool_window=3, pool_stride=2,
                           pool_padding=(0, 0, 1, 1), count_pad=False, keep_activation=True)
    assert p.pool_window == (3, 3) and p.pool_stride == (2, 2) and p.pool_padding == (0, 0, 1, 1)
    assert (p.PP, p.QQ) == (4, 4) and p.pool.y_shape == (2, 4, 4, 4)
    assert ConvPoolFwdProblem(N=1, C=1, H=8, W=8, K=1, R=3, S=3, pool_window=(2, 4)).pool_stride == (2, 4)
    assert problem_from_dict(p.to_dict()) == p
    assert "pool_window=3,3" in p.shape_string() and "count_pad=0" in p.shape_string()
    assert p.dz == ConvPoolDzProblem(N=2, C=4, H=8, W=8, window=3, stride=2, padding=(0, 0, 1, 1),
                                     count_pad=False, activation="none")
    assert problem_from_dict(p.dz.to_dict()) == p.dz


@pytest.mark.parametrize("fields, field", [
    ({"pool_window": 0}, "pool_window"),
    ({"pool_window": (2, 2, 2)}, "pool_window"),
    ({"pool_window": 9}, "pool_window"),                      # larger than the 8x8 convolution output
    ({"pool_window": 2, "pool_padding": 2}, "pool_padding"),  # padding not smaller than the window
    ({"pool_stride": (0, 1)}, "pool_stride"),
    ({"count_pad": 1}, "count_pad"),
    ({"keep_activation": "yes"}, "keep_activation"),
    ({"activation": "gelu"}, "activation"),
])
def test_bad_pool_fields_are_refused_by_name(fields, field):
    with pytest.raises(InvalidProblemError) as info:
        ConvPoolFwdProblem(N=1, C=1, H=8, W=8, K=1, R=1, S=1, **fields)
    assert info.value.field == field and info.value.op in ("conv_pool_fwd",)


def test_a_window_no_block_can_hold_is_refused_with_the_alternative():
    with pytest.raises(InvalidProblemError, match="conv_fwd then avgpool_fwd"):
        ConvPoolFwdProblem(N=1, C=1, H=40, W=40, K=1, R=1, S=1, pool_window=20)


def test_dz_problem_refuses_an_unknown_activation():
    with pytest.raises(InvalidProblemError, match="activation"):
        ConvPoolDzProblem(N=1, C=1, H=4, W=4, window=2, activation="softplus")


# -- references -----------------------------------------------------------------------------------

def naive_conv_pool(p: ConvPoolFwdProblem, x, w, b):
    """Loops over every output and window: independent of the references' shift-and-accumulate."""
    pt, pl = p.padding[0], p.padding[1]
    xp = np.zeros((p.N, p.C, p.H + p.padding[0] + p.padding[2], p.W + p.padding[1] + p.padding[3]))
    xp[:, :, pt:pt + p.H, pl:pl + p.W] = x
    z = np.zeros((p.N, p.K, p.P, p.Q))
    for i in range(p.P):
        for j in range(p.Q):
            patch = xp[:, :, i * p.stride[0]:i * p.stride[0] + p.R, j * p.stride[1]:j * p.stride[1] + p.S]
            z[:, :, i, j] = np.einsum("ncrs,kcrs->nk", patch, w) + (b if b is not None else 0)
    a = {"none": lambda v: v, "relu": lambda v: np.maximum(v, 0), "tanh": np.tanh,
         "logistic": lambda v: 1 / (1 + np.exp(-v))}[p.activation](z)
    (kh, kw), (sh, sw), (qt, ql) = p.pool_window, p.pool_stride, p.pool_padding[:2]
    y = np.zeros((p.N, p.K, p.PP, p.QQ))
    for i in range(p.PP):
        for j in range(p.QQ):
            h0, w0 = i * sh - qt, j * sw - ql
            rows, cols = slice(max(h0, 0), min(h0 + kh, p.P)), slice(max(w0, 0), min(w0 + kw, p.Q))
            inside = (rows.stop - rows.start) * (cols.stop - cols.start)
            y[:, :, i, j] = a[:, :, rows, cols].sum(axis=(2, 3)) / (kh * kw if p.count_pad else inside)
    return y, a


def _inputs(problem, rng):
    return {name: rng.standard_normal(shape) for name, shape in reference.input_shapes(problem).items()}


@pytest.mark.parametrize("label, problem", odd(True), ids=lambda v: v if isinstance(v, str) else "")
def test_reference_equals_naive_loops(label, problem, rng):
    inputs = _inputs(problem, rng)
    out = reference.run_problem(problem, inputs)
    y, a = naive_conv_pool(problem, inputs["x"], inputs["w"], inputs.get("bias"))
    np.testing.assert_allclose(out["y"], y, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(out["a"], a, rtol=1e-10, atol=1e-12)
    assert set(reference.output_shapes(problem)) == {"y", "a"}
    inference = dataclasses.replace(problem, keep_activation=False)
    assert set(reference.run_problem(inference, inputs)) == set(reference.output_shapes(inference)) == {"y"}


@pytest.mark.parametrize("label, problem", odd(True)[:4], ids=lambda v: v if isinstance(v, str) else "")
def test_split_backward_is_the_gradient_of_the_fused_forward(label, problem, rng):
    """dZ from conv_pool_dz, then conv_bwd_data and conv_wgrad on it (the split the training step
    would use), against central differences of <y, dy> along random directions, in float64."""
    inputs = _inputs(problem, rng)
    dy = rng.standard_normal(problem.pool.y_shape)
    a = reference.run_problem(problem, inputs)["a"]
    dz_in = {"dy": dy, **({"a": a} if problem.activation != "none" else {})}
    dz = reference.run_problem(problem.dz, dz_in)["dz"]
    geo = {"stride": problem.stride, "padding": problem.padding}
    grads = {"x": reference.conv_bwd_data(dz, inputs["w"], input_hw=(problem.H, problem.W), **geo)}
    grads["w"], db = reference.conv_wgrad(inputs["x"], dz, kernel_hw=(problem.R, problem.S), bias=True, **geo)
    if problem.bias:
        grads["bias"] = db

    def run(values):
        out = reference.run_problem(problem, values)
        # Which pre-activations are positive: a relu kink lies between patterns that differ.
        return float((out["y"] * dy).sum()), out["a"] > 0

    _, pattern = run(inputs)
    for name, grad in grads.items():
        eps = 1e-6
        for _attempt in range(5):
            direction = rng.standard_normal(grad.shape)
            (up, up_pattern), (down, down_pattern) = (run({**inputs, name: inputs[name] + sign * eps * direction})
                                                      for sign in (1, -1))
            # A central difference across a relu kink is not the derivative at the point (it was
            # seen: one pre-activation within 1e-6 of zero): draw another direction.
            if problem.activation != "relu" or (np.array_equal(up_pattern, pattern)
                                                 and np.array_equal(down_pattern, pattern)):
                break
        else:
            pytest.fail(f"{label}: 5 random directions for {name} all crossed a relu kink")
        np.testing.assert_allclose((up - down) / (2 * eps), (grad * direction).sum(), rtol=1e-5, atol=1e-7)


# -- block geometry -------------------------------------------------------------------------------

def _igemm_configs(problem, count):
    space = FWD.space(problem, LIMITS).restrict({"formulation": "igemm_pool"})
    default = FWD.default_config(problem, LIMITS, formulation="igemm_pool")
    return [default, *space.sample(random.Random(), count, exclude=[default])]


@pytest.mark.parametrize("keep", [False, True])
def test_igemm_blocks_hold_their_windows_and_own_each_output_once(keep):
    """Mirrors the kernel's indexing: every window of a pooled tile lies in its block's rectangle,
    and with keep_activation each convolution output is owned by exactly one block, inside it."""
    for label, problem in shapes(keep):
        (kh, kw), (sh, sw), (pt, pl) = problem.pool_window, problem.pool_stride, problem.pool_padding[:2]
        for config in _igemm_configs(problem, 3):
            tpp, tqq = config["TPP"], config["TQQ"]
            ch, cw = rectangle(problem, tpp, tqq)
            tiles_p, tiles_q = cdiv(problem.PP, tpp), cdiv(problem.QQ, tqq)
            for tp in range(tiles_p):
                for i in range(min(tpp, problem.PP - tp * tpp)):
                    assert i * sh + kh <= ch, (label, config)
            for tq in range(tiles_q):
                for j in range(min(tqq, problem.QQ - tq * tqq)):
                    assert j * sw + kw <= cw, (label, config)
            if keep:
                for h in range(problem.P):
                    tp = min((h + pt) // (tpp * sh), tiles_p - 1)
                    assert 0 <= h - (tp * tpp * sh - pt) < ch, (label, config, h)
                for w in range(problem.Q):
                    tq = min((w + pl) // (tqq * sw), tiles_q - 1)
                    assert 0 <= w - (tq * tqq * sw - pl) < cw, (label, config, w)


def test_every_shape_has_a_default_and_direct_pool_serves_only_windows_that_do_not_overlap():
    for keep in (False, True):
        for label, problem in shapes(keep):
            assert FWD.default_config(problem, LIMITS)["formulation"] in ("igemm_pool", "direct_pool")
            DZ.default_config(problem.dz, LIMITS)
            overlap = problem.pool_window[0] > problem.pool_stride[0] or problem.pool_window[1] > problem.pool_stride[1]
            if overlap:
                with pytest.raises(Exception, match="overlap"):
                    FWD.default_config(problem, LIMITS, formulation="direct_pool")
            if label in ("kriz09", "lenet5_1", "lenet5_2", "vgg_cifar_1", "padded_nonoverlap", "gaps"):
                assert _serves(problem, "direct_pool"), label


# -- rendering and nvcc ---------------------------------------------------------------------------

def _sampled(operation, problem, formulation, count):
    if formulation is None:
        default = operation.default_config(problem, LIMITS)
        space = operation.space(problem, LIMITS)
    else:
        default = operation.default_config(problem, LIMITS, formulation=formulation)
        space = operation.space(problem, LIMITS).restrict({"formulation": formulation})
    return [default, *space.sample(random.Random(), count, exclude=[default])]


def _jobs(samples: int):
    """(what, plan, is_default) of every formulation on the zoo pairs and odd shapes, keep_activation
    on for one half of the shapes and off for the other (both for the odd ones)."""
    jobs = []
    for keep in (False, True):
        for index, (label, problem) in enumerate(shapes(keep)):
            if label in dict(zoo_pairs()) and index % 2 != keep:
                continue
            for name in FWD.formulation_names:
                try:
                    configs = _sampled(FWD, problem, name, samples)
                except Exception:   # direct_pool does not serve overlapping windows (tested above)
                    continue
                jobs += [(f"{label} keep={keep} {c}", FWD.plan(problem, c), i == 0) for i, c in enumerate(configs)]
            if not keep:
                jobs += [(f"{label} dz {c}", DZ.plan(problem.dz, c), i == 0)
                         for i, c in enumerate(_sampled(DZ, problem.dz, None, samples))]
    return jobs


def test_every_formulation_renders_with_the_shape_as_constants():
    for what, plan, _ in _jobs(2):
        assert "{{" not in plan.source and "{%" not in plan.source, what
        assert f'extern "C" __global__' in plan.source and f"{plan.kernel_names[0]}(" in plan.source, what
        p = plan.problem
        if isinstance(p, ConvPoolFwdProblem):
            assert f"PP = {p.PP}, QQ = {p.QQ}" in plan.source and f"KEEP = {str(p.keep_activation).lower()}" in plan.source
            assert plan.outputs == (("y", "a") if p.keep_activation else ("y",))
        else:
            assert f"NC = {p.N * p.C}" in plan.source


@needs_nvcc
@pytest.mark.parametrize("arch", ["sm_90"])
def test_sampled_configs_compile_with_nvcc_and_defaults_do_not_spill(arch, tmp_path):
    jobs = _jobs(1)
    failures = compile_failures(jobs, arch, tmp_path)
    assert len(jobs) > 40
    assert not failures, "\n".join(failures[:8])


@needs_nvcc
def test_defaults_compile_for_sm_80(tmp_path):
    compiler = NvccCompiler("sm_80", cache_dir=tmp_path)
    limits = DeviceLimits.for_arch("sm_80")
    for label, problem in zoo_pairs(128, True)[:2]:
        for name in (n for n in FWD.formulation_names if _serves(problem, n)):
            config = FWD.default_config(problem, limits, formulation=name)
            assert compiler.compile(FWD.plan(problem, config).source).reports, (label, name)


# -- GPU ------------------------------------------------------------------------------------------

@pytest.mark.gpu
@pytest.mark.parametrize("keep", [False, True])
@pytest.mark.parametrize("formulation", ["igemm_pool", "direct_pool"])
def test_fused_forward_verifies_against_float64(formulation, keep):
    from tests.formulation_checks import assert_verifies_on_gpu

    cases = [(label, p) for label, p in shapes(keep) if _serves(p, formulation)]
    assert len(cases) >= 6
    # A fused forward has no workspace.
    assert_verifies_on_gpu(FWD, formulation, cases, samples=2, workspace_limit=0)


def _serves(problem, formulation) -> bool:
    try:
        FWD.default_config(problem, LIMITS, formulation=formulation)
    except Exception:
        return False
    return True


@pytest.mark.gpu
def test_dz_verifies_against_float64():
    from autocnn.kernels.runtime import KernelLoader
    from autocnn.measurement.measure import check_candidate

    loader = KernelLoader()
    results = {f"{label} {config}": check_candidate(loader.load(DZ.plan(p.dz, config)), p.dz, time_it=False)
               for label, p in shapes(False) for config in _sampled(DZ, p.dz, None, 2)}
    failed = {what: check.verification.message for what, check in results.items() if not check.verification.passed}
    assert len(results) >= 2 * len(shapes(False)) and not failed, failed


# -- the benchmark script -------------------------------------------------------------------------

def _bench_script():
    from tests.bench_module import load_script

    return load_script("bench_conv_pool")


def test_bench_script_refuses_bad_arguments_before_any_gpu_work(tmp_path, capsys):
    bench = _bench_script()
    with pytest.raises(SystemExit):
        bench.main(["--help"])
    assert "--search" in capsys.readouterr().out
    for bad in (["--pairs", "kriz09,alexnet"], ["--batch", "0"], ["--out", str(tmp_path / "f")]):
        (tmp_path / "f").write_text("")
        with pytest.raises(SystemExit):
            bench.main(bad)
        assert "error" in capsys.readouterr().err


def test_bench_table_shows_ratios_and_geometric_means():
    bench = _bench_script()
    rows = [{"pair": "kriz09", "fwd_us": {"pair": 200.0, "fused": 90.0, "fused_keep": 100.0, "torch": 150.0},
             "bwd_us": {"pair": 600.0, "split": 500.0}},
            {"pair": "lenet5_1", "fwd_us": {"pair": 40.0, "fused": 15.0, "fused_keep": 20.0},
             "bwd_us": {"pair": 90.0, "split": 100.0, "torch": 80.0}}]
    text = bench.table(rows)
    assert "2.00x" in text and "1.50x" in text and "0.90x" in text
    assert "forward, pair over fused (keep): 2.00x" in text       # sqrt(2 * 2)
    assert f"backward, pair over split: {((600 / 500) * 0.9) ** 0.5:.2f}x" in text
