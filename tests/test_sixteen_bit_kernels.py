"""bf16 and fp16 end to end on the CPU: which formulations serve them (the others refuse with their
reason), the buffers verification gives their kernels (16-bit storage, the reference from the 16-bit
values, NaN-poisoned outputs), lookups that never cross element types, nvcc for sm_90, and the
generated kernels run by the CPU emulator against float64 on shapes that divide nothing evenly, with
NaN and Inf reaching the outputs they touch and fp16 overflowing to Inf as cuDNN's FP16 output does."""
from __future__ import annotations

import dataclasses
import math
import random
import shutil

import numpy as np
import pytest

from autocnn.device import DeviceLimits
from autocnn.errors import InfeasibleConfigError
from autocnn.kernels import OPERATIONS, get_operation
from autocnn.kernels.problem import AvgPoolBwdProblem, AvgPoolFwdProblem, ConvFwdProblem, ConvWgradProblem
from autocnn.kernels.steps import WORKSPACE_ELEMENT
from autocnn.kernels.suite import odd_problems
from autocnn.measurement import element_arrays
from autocnn.measurement.measure import output_buffers, random_inputs, reference_outputs, tensor_values, verify_outputs
from autocnn.precision import BF16, FLOAT32, FP16, FP32, TF32
from autocnn.store.lookup import shape_distance
from tests.cuda_emulator import needs_gxx
from tests.test_sixteen_bit_bounds import to_bf16, to_fp16

LIMITS = DeviceLimits.for_arch("sm_90")
SIXTEEN = ("bf16", "fp16")
# The formulations (values of "formulation") that serve 16-bit tensors; every other one refuses them.
SERVING = {"conv_fwd": {"direct", "igemm", "tc"}, "conv_bwd_data": {"direct", "igemm", "tc"},
           "conv_wgrad": {"atomic", "two_pass", "tc"},
           "avgpool_fwd": {"window_gather"}, "avgpool_bwd": {"window_gather"}}


def _at(problem, precision):
    return dataclasses.replace(problem, precision=precision)


# -- which formulations serve them --------------------------------------------------------------

# Shapes each formulation serves in float32: an odd one, a 3x3 stride-1 one (winograd, halo, tma ...),
# a 5x5 one (fft), so that what refuses a 16-bit problem is its precision and not its shape.
EXTRA = (dict(N=3, C=5, H=13, W=11, K=7, R=3, S=3, padding=(1, 1, 1, 1)),
         dict(N=2, C=6, H=19, W=17, K=12, R=5, S=5, padding=(2, 2, 2, 2)))


def _problems(op):
    first = odd_problems(op)[0][1]
    if not hasattr(first, "K"):
        return [first]
    out = [first]
    for geometry in EXTRA:
        try:
            out.append(dataclasses.replace(first, **geometry))
        except ValueError:
            continue
    return out


@pytest.mark.parametrize("precision", SIXTEEN)
@pytest.mark.parametrize("op", sorted(OPERATIONS))
def test_only_the_converted_formulations_serve_sixteen_bit_tensors_and_the_others_say_why(op, precision):
    operation = get_operation(op)
    reasons: dict[str, list[str]] = {}
    for problem in _problems(op):
        problem = _at(problem, precision)
        space = operation.space(problem, LIMITS)
        several = "formulation" in {p.name for p in space.params}
        for value in operation.formulation_names:
            if operation.formulation(value).grouping_refusal(problem):
                continue   # depthwise: these dense shapes are not its (tests/test_depthwise.py runs it at 16 bits)
            held = {"formulation": value} if several else {}
            sub = space.restrict(held) if several else space
            configs = sub.sample(random.Random(0), 3, max_attempts=400)
            if value in SERVING.get(op, ()):
                assert configs, f"{op} {value} serves {precision}, yet no config of it is feasible"
                continue
            assert not configs, f"{op} {value} does not serve {precision} but offers {configs[0]}"
            with pytest.raises(InfeasibleConfigError) as refused:
                sub.complete(held)
            reasons.setdefault(value, []).extend(refused.value.reasons)
    for value, said in reasons.items():   # on some shape it serves in float32, its precision is the reason
        formulation = operation.formulation(value).formulation
        assert any(why.startswith(f"{formulation} cannot compute {precision} (16-bit tensors): ") for why in said), \
            (value, said)
    if not SERVING.get(op):
        with pytest.raises(InfeasibleConfigError, match="cannot compute"):
            operation.default_config(_at(odd_problems(op)[0][1], precision), LIMITS)


def test_the_refusals_leave_fp32_and_tf32_as_they_were():
    for op in SERVING:
        operation = get_operation(op)
        for precision in (FP32, TF32):
            problem = _at(odd_problems(op)[0][1], precision) if op.startswith("conv") else odd_problems(op)[0][1]
            space = operation.space(problem, LIMITS)
            for config in space.sample(random.Random(1), 20):
                assert not any("16-bit" in why for why in space.violations(config.as_dict()))


def test_sixteen_bit_weight_gradients_take_their_split_sums_through_the_fp32_workspace():
    operation = get_operation("conv_wgrad")
    problem = ConvWgradProblem(N=4, C=6, H=15, W=13, K=10, R=3, S=3, padding=1, precision="bf16")
    space = operation.space(problem, LIMITS)
    tc = operation.default_config(problem, LIMITS)                    # the tensor cores first
    assert tc["formulation"] == "tc" and tc["SPLITK"] >= 2 and tc["TWO_PASS"] == 1
    assert operation.plan(problem, tc).workspaces
    with pytest.raises(InfeasibleConfigError, match="through the FP32 workspace .TWO_PASS=1., not atomics"):
        space.validate({**tc.as_dict(), "TWO_PASS": 0})
    assert space.validate({**tc.as_dict(), "SPLITK": 1, "TWO_PASS": 0})["SPLITK"] == 1
    default = operation.default_config(problem, LIMITS, formulation="igemm")
    assert default["formulation"] == "two_pass" and default["SPLITK"] >= 2
    plan = operation.plan(problem, default)
    assert plan.workspaces and WORKSPACE_ELEMENT is FLOAT32          # partial sums of FP32, never 16 bits
    atomic = {**default.as_dict(), "formulation": "atomic"}
    with pytest.raises(InfeasibleConfigError, match="adds its partial sums in the FP32 workspace"):
        space.validate(atomic)
    assert space.validate({**atomic, "SPLITK": 1})["SPLITK"] == 1   # one split: stored once, no atomics


def test_pooling_takes_the_storage_precisions_and_keeps_its_keys():
    p = AvgPoolFwdProblem(N=2, C=3, H=8, W=8)
    assert p.precision is FP32 and "precision" not in p.to_dict() and "precision" not in p.shape_string()
    b = _at(p, "bf16")
    assert b.to_dict()["precision"] == "bf16" and b.shape_string().endswith(",precision=bf16")
    assert b.with_op("avgpool_bwd") == AvgPoolBwdProblem(N=2, C=3, H=8, W=8, precision="bf16")
    with pytest.raises(ValueError, match="one of fp32, bf16, fp16 .pooling forms no products, so tf32 is fp32"):
        _at(p, "tf32")


def test_a_lookup_never_hands_a_config_across_element_types():
    fp32 = ConvFwdProblem(N=8, C=16, H=14, W=14, K=32, R=3, S=3, padding=1)
    bf16, fp16, tf32 = (_at(fp32, p) for p in ("bf16", "fp16", "tf32"))
    for a, b in ((fp32, bf16), (bf16, fp32), (tf32, bf16), (bf16, fp16), (fp16, bf16), (fp16, tf32)):
        assert shape_distance(a, b) == math.inf, (a.precision, b.precision)
    assert shape_distance(bf16, _at(ConvFwdProblem(N=16, C=16, H=14, W=14, K=32, R=3, S=3, padding=1), "bf16")) == 1
    assert bf16.to_dict() != fp32.to_dict() != fp16.to_dict()       # exact keys differ too
    pool = AvgPoolFwdProblem(N=2, C=3, H=8, W=8)
    assert shape_distance(pool, _at(pool, "fp16")) == math.inf


def test_a_formulation_that_cannot_serve_a_sixteen_bit_problem_is_refused_before_any_gpu_work(no_gpu_source, capsys):
    from autocnn import cli
    from autocnn.search.tuner import problems_offering

    fwd = ConvFwdProblem(N=4, C=8, H=10, W=10, K=8, R=3, S=3, padding=1, precision="bf16")
    wgrad = ConvWgradProblem(N=4, C=8, H=10, W=10, K=8, R=3, S=3, padding=1, precision="bf16")
    refusals = get_operation("conv_fwd").refusals(fwd, LIMITS)
    # Every formulation but direct, igemm and tc, less fft, which refuses a 3x3 filter for its size first.
    assert set(refusals) == set(get_operation("conv_fwd").formulation_names) - SERVING["conv_fwd"] - {"fft"}
    assert refusals["wgmma"].startswith("wgmma cannot compute bf16 (16-bit tensors): its wgmma products")
    assert set(get_operation("conv_fwd").refusals(_at(fwd, "fp32"), LIMITS)) == {"depthwise"}   # its groups, not its precision
    assert problems_offering({}, [fwd, wgrad]) == [fwd, wgrad]
    assert problems_offering({"formulation": "igemm"}, [fwd, wgrad]) == [fwd]   # conv_wgrad has no igemm value
    with pytest.raises(InfeasibleConfigError, match="wgmma cannot compute bf16 .16-bit tensors.: its wgmma products"):
        problems_offering({"formulation": "wgmma"}, [fwd, wgrad])
    pool = dataclasses.replace(odd_problems("conv_pool_fwd")[0][1], precision="fp16")   # no formulation serves it
    assert problems_offering({}, [fwd, pool]) == [fwd]
    with pytest.raises(InfeasibleConfigError, match="igemm_pool cannot compute fp16.*direct_pool cannot compute fp16"):
        problems_offering({}, [pool])
    # The command line: refused with the reason before a measurement source (a GPU) is opened.
    shape = "N=4,C=8,H=10,W=10,K=8,R=3,S=3,pad=1"
    assert cli.main(["tune", "--op", "conv_fwd", "--shape", shape, "--precision", "fp16", "--fix", "formulation=halo"]) != 0
    assert "halo cannot compute fp16 (16-bit tensors)" in capsys.readouterr().err
    with pytest.raises(no_gpu_source):   # a formulation that serves it goes on to the GPU
        cli.main(["tune", "--op", "conv_fwd", "--shape", shape, "--precision", "fp16", "--fix", "formulation=igemm"])


def test_tune_network_at_a_sixteen_bit_precision_takes_its_convolutions_and_pools(no_gpu_source, capsys, monkeypatch):
    from autocnn import cli

    seen = {}
    real = cli.tune._offering

    def spy(fixed, problems):
        seen["asked"], seen["kept"] = list(problems), real(fixed, problems)
        return seen["kept"]

    monkeypatch.setattr(cli.tune, "_offering", spy)
    with pytest.raises(no_gpu_source):
        cli.main(["tune", "--network", "kriz09", "--precision", "fp16", "--trials", "1"])
    assert all(p.precision is FP16 for p in seen["asked"])
    # The model's own 16-bit problems: a 16-bit model offers no fused conv-pool kernels, so none is
    # asked for and none left out; its convolutions and pools are all kept.
    assert not {"conv_pool_fwd", "conv_pool_dz"} & {p.op for p in seen["asked"]}
    assert seen["kept"] == seen["asked"]
    assert {"conv_fwd", "conv_wgrad", "avgpool_fwd", "avgpool_bwd"} <= {p.op for p in seen["kept"]}


def test_the_lookup_hands_no_record_across_element_types(tmp_path):
    from autocnn.measurement.sources import ReplayFile
    from autocnn.store import RecordKey, TuningDatabase, TuningRecord, now_utc
    from tests.test_sound_lookup import REPLAY

    device = ReplayFile.load(REPLAY).device
    operation = get_operation("conv_fwd")
    fp32 = ConvFwdProblem(N=8, C=16, H=14, W=14, K=32, R=3, S=3, padding=1)
    db = TuningDatabase(user_dir=tmp_path / "db", shipped_dir=tmp_path / "none",
                        resource_check=lambda plan, device: [])
    for problem, kpt in ((fp32, 4), (_at(fp32, "bf16"), 2)):
        config = operation.space(problem, device.limits()).validate(
            {**operation.default_config(problem, device.limits(), formulation="direct").as_dict(), "KPT": kpt})
        db.put(TuningRecord(RecordKey.for_(device, problem, operation.config_fingerprint(config)), config.as_dict(),
                            10.0, 0.0, None, None, 5, now_utc(), "0", "tpe"))
    assert db.lookup(device, fp32).config["KPT"] == 4
    assert db.lookup(device, _at(fp32, "tf32")).source == "nearest_shape"   # fp32 serves tf32: the same storage
    assert db.lookup(device, _at(fp32, "bf16")).config["KPT"] == 2
    fp16 = db.lookup(device, _at(fp32, "fp16"))                               # neither bf16's nor fp32's record
    assert fp16.source == "default" and fp16.config == operation.default_config(_at(fp32, "fp16"), device.limits())
    near = _at(dataclasses.replace(fp32, N=16), "bf16")                       # a nearer shape of its own type only
    assert db.lookup(device, near).source == "nearest_shape" and db.lookup(device, near).config["KPT"] == 2


# -- what verification gives the kernels ----------------------------------------------------------

def test_sixteen_bit_buffers_round_to_nearest_and_read_back_exactly():
    r = np.random.default_rng(0).standard_normal(10_000).astype(np.float32) * 1000
    r[:4] = [np.nan, np.inf, -np.inf, 70000.0]
    for element, rounding, dtype in ((BF16.x, to_bf16, np.uint16), (FP16.x, to_fp16, np.float16)):
        stored = element_arrays.rounded(r, element, np)
        assert stored.dtype == dtype
        got = element_arrays.values(stored, element, np)
        assert np.array_equal(got, rounding(r), equal_nan=True)          # the NumPy emulation's rounding
        assert np.array_equal(element_arrays.values(element_arrays.rounded(got, element, np), element, np), got,
                              equal_nan=True)
    assert np.isposinf(element_arrays.values(element_arrays.rounded(np.float32([65520.0]), FP16.x, np), FP16.x, np))
    assert element_arrays.nans((2, 3), BF16.x, np).dtype == np.uint16
    assert np.isnan(element_arrays.values(element_arrays.nans((2,), BF16.x, np), BF16.x, np)).all()


@pytest.mark.parametrize("precision", SIXTEEN)
def test_verification_uses_the_sixteen_bit_values_and_fails_what_is_unwritten(precision):
    problem = _at(odd_problems("conv_fwd")[0][1], precision)
    inputs = random_inputs(problem, np, seed=3)
    assert {a.dtype for a in inputs.values()} == {np.dtype(element_arrays.storage_dtype(problem.precision.x))}
    ref = reference_outputs(problem, inputs)
    x = tensor_values(problem, "x", inputs["x"]).astype(np.float64)
    assert np.all(x == x.astype(np.float32))                           # the reference saw the 16-bit values
    unwritten = verify_outputs(problem, inputs, output_buffers(problem, np), ref)
    assert not unwritten.passed and "not finite" in unwritten.message
    exact = {"y": element_arrays.rounded(ref["y"].astype(np.float32), problem.precision.y, np)}
    assert verify_outputs(problem, inputs, exact, ref).passed           # one rounding of each output passes
    off = {"y": element_arrays.rounded(1.02 * ref["y"].astype(np.float32), problem.precision.y, np)}
    assert not verify_outputs(problem, inputs, off, ref).passed


# -- the kernels, compiled and run ----------------------------------------------------------------

def _cases() -> tuple[list, list]:
    """(op, formulation, problem) on shapes that divide no tile: each formulation's first odd shape
    with a default, and (the long run) its second and the pools' vector widths."""
    first, more = [], []
    for op, formulations in (("conv_fwd", ("direct", "igemm", "tc")), ("conv_bwd_data", ("direct", "igemm", "tc")),
                             ("conv_wgrad", ("igemm", "tc")), ("avgpool_fwd", ("window_gather",)),
                             ("avgpool_bwd", ("window_gather",))):
        for f in formulations:
            served = []
            for _, problem in odd_problems(op):
                try:
                    get_operation(op).default_config(problem, LIMITS, formulation=f)
                except InfeasibleConfigError:
                    continue
                served.append((op, f, problem))
            first += served[:1]
            more += served[1:2]
    # Vector loads and stores of 16-bit elements (VEC, VST): rows whose length the width divides.
    more += [("avgpool_fwd", "window_gather", AvgPoolFwdProblem(N=3, C=5, H=12, W=16, window=2)),
             ("avgpool_bwd", "window_gather", AvgPoolBwdProblem(N=3, C=5, H=12, W=16, window=3, stride=2))]
    return first, more


FIRST, MORE = _cases()


def _emulated_failures(cases, precision, cache) -> list[str]:
    from tests.cuda_emulator import emulated_failure

    failures = []
    for i, (op, formulation, problem) in enumerate(cases):
        problem = _at(problem, precision)
        operation = get_operation(op)
        config = operation.default_config(problem, LIMITS, formulation=formulation)
        why = emulated_failure(operation, problem, config, cache, seed=100 + i)
        if why:
            failures.append(why)
    return failures


@needs_gxx
@pytest.mark.parametrize("precision", SIXTEEN)
def test_every_sixteen_bit_default_verifies_under_emulation(precision, tmp_path):
    convs = {(op, f) for op in ("conv_fwd", "conv_bwd_data") for f in ("direct", "igemm", "tc")}
    assert {(op, f) for op, f, _ in FIRST} == convs | {("conv_wgrad", "igemm"), ("conv_wgrad", "tc"),
                                                       ("avgpool_fwd", "window_gather"), ("avgpool_bwd", "window_gather")}
    failures = _emulated_failures(FIRST, precision, tmp_path)
    assert not failures, "\n".join(failures)


@pytest.mark.slow
@needs_gxx
@pytest.mark.parametrize("precision", SIXTEEN)
def test_more_sixteen_bit_defaults_verify_under_emulation(precision, tmp_path):
    failures = _emulated_failures(MORE, precision, tmp_path)
    assert not failures, "\n".join(failures)


@needs_gxx
def test_the_vector_and_atomic_variants_verify_under_emulation(tmp_path):
    from tests.cuda_emulator import emulated_failure

    fwd = AvgPoolFwdProblem(N=3, C=5, H=12, W=16, window=2, precision="fp16")
    wgrad = ConvWgradProblem(N=3, C=5, H=9, W=11, K=7, R=3, S=2, padding=(1, 0, 1, 1), precision="bf16")
    checked = [(fwd, {"THREADS": 64, "QPT": 4, "IPT": 2, "VEC": 4}), (fwd, {"THREADS": 64, "QPT": 2, "IPT": 1, "VEC": 2}),
               (wgrad, {"formulation": "atomic", "SPLITK": 1, "BM": 16, "BN": 16, "BK": 8, "TM": 2, "TN": 2,
                        "PAD_A": 0, "PAD_B": 1, "UNROLL_K": 0})]
    for problem, values in checked:
        operation = get_operation(problem.op)
        config = operation.space(problem, LIMITS).validate(values)
        assert emulated_failure(operation, problem, config, tmp_path, seed=5) is None


@needs_gxx
def test_the_emulators_conversions_are_bit_for_bit_numpys_rounding(tmp_path):
    import ctypes

    from tests.cuda_emulator import PRELUDE, compile_library

    lib = compile_library(PRELUDE + r"""
extern "C" void to_half(const float* x, unsigned short* h, int n) {
    for (int i = 0; i < n; ++i) h[i] = __float2half_rn(x[i]).__x; }
extern "C" void to_bf16(const float* x, unsigned short* h, int n) {
    for (int i = 0; i < n; ++i) h[i] = __float2bfloat16_rn(x[i]).__x; }
extern "C" void from_half(const unsigned short* h, float* x, int n) {
    for (int i = 0; i < n; ++i) x[i] = __half2float(__half{h[i]}); }
""", tmp_path, "conversions")
    rng = np.random.default_rng(7)
    halves = np.arange(2**16, dtype=np.uint16)
    # Every half as a float32, and the midpoints between neighbours (ties, both ways), subnormals,
    # the overflow edge (65504, 65519.99, 65520) and random values over float32's range.
    exact = halves.view(np.float16).astype(np.float32)
    finite = np.sort(exact[np.isfinite(exact)])
    mid = ((finite[:-1].astype(np.float64) + finite[1:]) / 2).astype(np.float32)
    wide = (rng.standard_normal(20_000) * 10.0 ** rng.integers(-45, 38, 20_000)).astype(np.float32)
    x = np.concatenate([exact, mid, np.nextafter(mid, np.float32(np.inf)), wide,
                        np.float32([65504.0, 65519.99, 65520.0, -65520.0, 1e-8, 2.0**-25, 3 * 2.0**-26])])
    x = np.ascontiguousarray(x, dtype=np.float32)

    def call(fn, src, out):
        fn(src.ctypes.data_as(ctypes.c_void_p), out.ctypes.data_as(ctypes.c_void_p), ctypes.c_int(src.size))
        return out

    got = call(lib.to_half, x, np.empty(x.size, np.uint16))
    assert np.array_equal(got.view(np.float16), element_arrays.rounded(x, FP16.x, np), equal_nan=True)
    got = call(lib.to_bf16, x, np.empty(x.size, np.uint16))
    want = element_arrays.rounded(x, BF16.x, np)
    nan = np.isnan(x)
    assert np.array_equal(got[~nan], want[~nan]) and np.isnan(element_arrays.values(got[nan], BF16.x, np)).all()
    back = call(lib.from_half, halves, np.empty(halves.size, np.float32))
    assert np.array_equal(back, exact, equal_nan=True)


def _emulate(problem, formulation, inputs, tmp_path):
    from tests.cuda_emulator import run_emulated

    operation = get_operation(problem.op)
    config = operation.default_config(problem, LIMITS, formulation=formulation)
    return run_emulated(operation.plan(problem, config), inputs, tmp_path)


@needs_gxx
@pytest.mark.parametrize("precision", SIXTEEN)
def test_nan_and_inf_reach_every_output_they_touch(precision, tmp_path):
    conv = ConvFwdProblem(N=2, C=3, H=12, W=13, K=8, R=3, S=3, precision=precision)
    for formulation in ("direct", "igemm", "tc"):
        for poison in (np.nan, np.inf):
            inputs = random_inputs(conv, np, seed=1)
            x = tensor_values(conv, "x", inputs["x"]).copy()
            x[1, 2, 3, 4] = poison
            inputs["x"] = element_arrays.rounded(x, conv.precision.x, np)
            y = tensor_values(conv, "y", _emulate(conv, formulation, inputs, tmp_path)["y"])
            touched = np.zeros(conv.y_shape, dtype=bool)
            touched[1, :, 1:4, 2:5] = True                     # outputs whose 3x3 window covers (3, 4)
            assert np.isfinite(y[~touched]).all() and not np.isfinite(y[touched]).any(), (formulation, poison)
            if poison == np.inf:                                # one infinite term: an infinite sum
                assert np.isinf(y[touched]).all()
    pool = AvgPoolFwdProblem(N=2, C=3, H=8, W=8, window=2, precision=precision)
    inputs = random_inputs(pool, np, seed=2)
    x = tensor_values(pool, "x", inputs["x"]).copy()
    x[0, 1, 5, 2] = np.nan
    inputs["x"] = element_arrays.rounded(x, pool.precision.x, np)
    y = tensor_values(pool, "y", _emulate(pool, "window_gather", inputs, tmp_path)["y"])
    assert np.isnan(y[0, 1, 2, 1]) and np.isfinite(np.delete(y.ravel(), np.ravel_multi_index((0, 1, 2, 1), y.shape))).all()


@needs_gxx
def test_fp16_outputs_beyond_its_range_are_infinite_as_cudnns_and_bf16_has_the_range(tmp_path):
    # 27 terms of 1 x w: 100 * 27 = 2700 fits a half (bf16 rounds it to 2704); 3000 * 27 = 81000 does not
    # (the largest half is 65504).
    for precision in ("fp16", "bf16"):
        problem = ConvFwdProblem(N=1, C=3, H=12, W=12, K=3, R=3, S=3, precision=precision)
        w = np.empty(problem.w_shape, dtype=np.float32)
        w[0], w[1], w[2] = 100.0, 3000.0, -3000.0
        element = problem.precision.x
        inputs = {"x": element_arrays.rounded(np.ones(problem.x_shape, np.float32), element, np),
                  "w": element_arrays.rounded(w, element, np)}
        for formulation in ("direct", "igemm", "tc"):
            y = tensor_values(problem, "y", _emulate(problem, formulation, inputs, tmp_path)["y"])
            rounding = to_fp16 if precision == "fp16" else to_bf16
            assert (y[0, 0] == rounding(np.float32(2700.0))).all()          # one rounding of the FP32 sum
            if precision == "fp16":
                assert np.isposinf(y[0, 1]).all() and np.isneginf(y[0, 2]).all()
            else:
                big = to_bf16(np.float32(27 * to_bf16(np.float32(3000.0))))   # 3000 is 3008 in bf16
                assert (y[0, 1] == big).all() and (y[0, 2] == -big).all()


# -- nvcc ------------------------------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")
@pytest.mark.parametrize("precision", SIXTEEN)
def test_sixteen_bit_kernels_compile_for_sm90_without_spills(precision, tmp_path):
    from autocnn.kernels.compiler import NvccCompiler

    compiler = NvccCompiler("sm_90", cache_dir=tmp_path)
    for op, formulation, problem in FIRST:
        problem = _at(problem, precision)
        operation = get_operation(op)
        plan = operation.plan(problem, operation.default_config(problem, LIMITS, formulation=formulation))
        reports = compiler.compile(plan.source, plan.config).reports
        assert set(plan.kernel_names) <= set(reports), (op, formulation)
        assert not any(r.spills for r in reports.values()), (op, formulation, reports)
