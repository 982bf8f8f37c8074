"""The halo formulation (formulations/halo/): conv_fwd (stride 1) and conv_bwd_data on Hopper's
warpgroup tensor cores, each filter tap a shift of one staged halo tile.

CPU: a NumPy model of the GEMM over the staged grid (the grid's geometry, each phase's base and tap
shifts, the weights' tap index, the rows kept) against the float64 reference, on strided, odd and
seed shapes; where the formulation is offered and each rule's message; every sampled config builds
for sm_90a without spills or serialized wgmmas. GPU (``-m gpu``, a Hopper GPU): configs of every
width, depth and taps per step verified against float64, tf32 and fp32 (3xTF32: the FP32 bound),
on seed shapes and on shapes that divide nothing evenly."""
from __future__ import annotations

import dataclasses
import itertools

import numpy as np
import pytest

from autocnn.device import DeviceLimits
from autocnn.errors import InfeasibleConfigError
from autocnn.kernels import OPERATIONS, reference
from autocnn.kernels.compiler import NvccCompiler, nvcc_path
from autocnn.kernels.formulations.halo import FORMULATION_HALO, HALO, HaloGrid, smem_bytes, slots
from autocnn.kernels.problem import ConvBwdDataProblem, ConvFwdProblem
from autocnn.kernels.suite import seed_problems
from tests.formulation_checks import assert_every_config_verifies, target_build_failures

needs_nvcc = pytest.mark.skipif(nvcc_path() is None, reason="nvcc is not installed")
FWD = OPERATIONS["conv_fwd"]
BWD = OPERATIONS["conv_bwd_data"]
HOPPER = DeviceLimits.for_arch("sm_90")

# The reduction's channels a multiple of 4 and nothing else even: 13 and 70 GEMM columns (ragged
# blocks), odd images, asymmetric padding, stride 2 by 1 and 3 by 3 (phases of different sizes, and
# phases no tap reaches), a 2x2 filter, batch 1, a reduction of 20 and 36 channels (a ragged block).
ODD_BWD = (("odd_hb_a", ConvBwdDataProblem(N=3, C=13, H=13, W=11, K=20, R=3, S=5, stride=(2, 1), padding=(1, 2, 0, 1),
                                           precision="tf32")),
           ("odd_hb_b", ConvBwdDataProblem(N=1, C=9, H=17, W=14, K=8, R=2, S=2, stride=(3, 3), precision="tf32")),
           ("odd_hb_c", ConvBwdDataProblem(N=2, C=70, H=9, W=7, K=36, R=3, S=3, padding=1, precision="tf32")))
ODD_FWD = (("odd_hf_a", ConvFwdProblem(N=3, C=12, H=13, W=11, K=19, R=3, S=5, padding=(1, 2, 0, 1),
                                       precision="tf32")),
           ("odd_hf_b", ConvFwdProblem(N=1, C=36, H=9, W=17, K=70, R=2, S=2, precision="tf32", bias=True,
                                       activation="relu")))
BWD_SEED = ("scherer10_l2", "modern_14", "sweep_3x3")
FWD_SEED = ("modern_14", "convnet18_c2")


def _seed(op, names, precision="tf32"):
    seed = dict(seed_problems(op.name))
    return [(n, dataclasses.replace(seed[n], precision=precision)) for n in names]


def _model(problem, src, w):
    """The halo GEMM in NumPy, as the kernels compute it: the input staged on the grid, per phase
    the rows' taps read at the row's position + HBASE + rel(tap), the weights at the tap's index,
    outputs kept where the position is one of the phase's."""
    p, g = problem, HaloGrid.of(problem)
    fwd = p.op == "conv_fwd"
    kred = p.C if fwd else p.K
    at = np.zeros((p.N, g.HD, g.VD, kred))
    at[:, g.UP:g.UP + g.SP, g.VP:g.VP + g.SQ, :] = src.transpose(0, 2, 3, 1)
    rows = p.N * g.HD * g.VD
    tail = max(ph.HBASE for ph in g.phases) + g.halo(64)   # reads past the grid's end (rows dropped)
    flat = np.concatenate([at.reshape(rows, kred), np.zeros((tail, kred))])
    wt = (w.transpose(0, 2, 3, 1) if fwd else w.transpose(1, 2, 3, 0)).reshape(-1, p.R * p.S, kred)
    m = np.arange(rows)
    n, rem = np.divmod(m, g.HD * g.VD)
    i, j = np.divmod(rem, g.VD)
    out = np.zeros((p.N, p.K, p.P, p.Q) if fwd else (p.N, p.C, p.H, p.W))
    sh, sw = p.stride
    for ph in g.phases:
        acc = np.zeros((rows, wt.shape[0]))
        for tap in range(ph.taps):
            jr, js = divmod(tap, ph.Sb)
            rel = jr * g.VD + js if fwd else (ph.Ra - 1 - jr) * g.VD + ph.Sb - 1 - js
            wtap = tap if fwd else (ph.a + sh * jr) * p.S + ph.b + sw * js
            acc += flat[m + ph.HBASE + rel] @ wt[:, wtap, :].T
        keep = (i < ph.Ha) & (j < ph.Wb)
        if fwd:
            out[n[keep], :, i[keep], j[keep]] = acc[keep]
        else:
            h = ph.a - p.padding[0] + sh * (ph.ilo + i[keep])
            x = ph.b - p.padding[1] + sw * (ph.jlo + j[keep])
            out[n[keep], :, h, x] = acc[keep]
    return out


MODEL_SHAPES = [
    *ODD_BWD, *ODD_FWD,
    ("bwd_s2_8x8", ConvBwdDataProblem(N=2, C=4, H=20, W=18, K=4, R=8, S=8, stride=(2, 2), padding=(3, 3, 3, 3))),
    ("bwd_s2_3x3", ConvBwdDataProblem(N=2, C=5, H=12, W=9, K=4, R=3, S=3, stride=(2, 2), padding=(1, 1, 1, 1))),
    ("bwd_s1_pad0", ConvBwdDataProblem(N=2, C=3, H=7, W=8, K=4, R=3, S=2)),
    ("fwd_pad0", ConvFwdProblem(N=2, C=4, H=7, W=9, K=3, R=3, S=2)),
]


@pytest.mark.parametrize("name,problem", MODEL_SHAPES, ids=[n for n, _ in MODEL_SHAPES])
def test_the_halo_gemm_over_the_grid_is_the_convolution(name, problem):
    rng = np.random.default_rng(7)
    p = problem
    w = rng.standard_normal((p.K, p.C, p.R, p.S))
    if p.op == "conv_fwd":
        x = rng.standard_normal((p.N, p.C, p.H, p.W))
        expect = reference.conv_fwd(x, w, stride=p.stride, padding=p.padding)
        got = _model(p, x, w)
    else:
        dy = rng.standard_normal((p.N, p.K, p.P, p.Q))
        expect = reference.conv_bwd_data(dy, w, input_hw=(p.H, p.W), stride=p.stride, padding=p.padding)
        got = _model(p, dy, w)
    np.testing.assert_allclose(got, expect, rtol=1e-12, atol=1e-12)


def test_every_phase_reads_inside_the_grid_and_its_halo():
    """A phase's taps read positions HBASE + rel(tap) >= 0 on from a row, and a block of BM rows reads
    no further than its halo (which the pitch holds)."""
    for _, p in [*MODEL_SHAPES, *_seed(BWD, BWD_SEED), *_seed(FWD, FWD_SEED)]:
        g = HaloGrid.of(p)
        for ph in g.phases:
            if not ph.taps:
                continue
            assert ph.HBASE >= 0
            rels = [jr * g.VD + js for jr in range(ph.Ra) for js in range(ph.Sb)]
            for bm in (64, 128, 256):
                assert bm - 1 + max(rels) < g.pitch(bm) and g.pitch(bm) % 8 == 0


def _space(problem, op):
    return op.space(problem, HOPPER).restrict({"formulation": FORMULATION_HALO})


def _rejects(problem, op, config, match):
    with pytest.raises(InfeasibleConfigError, match=match):
        _space(problem, op).validate({"formulation": FORMULATION_HALO, **config})


def test_the_halo_gemm_is_offered_on_hopper_with_its_rules_named():
    name, p = _seed(BWD, ["scherer10_l2"])[0]
    ok = {"WGS": 2, "WBN": 16, "WSTAGES": 3, "TPS": 4, "MT": 1, "INFLIGHT": 0}
    assert _space(p, BWD).validate({"formulation": FORMULATION_HALO, **ok})
    _rejects(p, BWD, {**ok, "TPS": 3}, "TPS=3 does not divide the taps of every phase")
    _rejects(p, BWD, {**ok, "WBN": 64}, "WBN=64 exceeds 16")
    ampere = DeviceLimits.for_arch("sm_80")
    with pytest.raises(InfeasibleConfigError, match="sm_90 .Hopper. only, not sm_80"):
        BWD.space(p, ampere).restrict({"formulation": FORMULATION_HALO}).validate(
            {"formulation": FORMULATION_HALO, **ok})
    strided = ConvFwdProblem(N=2, C=8, H=9, W=9, K=8, R=3, S=3, stride=2, precision="tf32")
    _rejects(strided, FWD, ok | {"WBN": 16}, "stride 1 only")
    odd = ConvBwdDataProblem(N=2, C=8, H=9, W=9, K=6, R=3, S=3, precision="tf32")
    _rejects(odd, BWD, ok | {"TPS": 1}, "K .dY's channels. must be a multiple of 4, not 6")
    fp32 = dataclasses.replace(p, precision="fp32")
    big = ConvBwdDataProblem(N=8, C=256, H=14, W=14, K=256, R=3, S=3, padding=1, precision="fp32")
    _rejects(big, BWD, {**ok, "WBN": 128, "TPS": 3}, "fp32 keeps each tap's partial sums")
    assert _space(fp32, BWD).validate({"formulation": FORMULATION_HALO, **ok})
    _rejects(fp32, BWD, {**ok, "INFLIGHT": 1}, "INFLIGHT=1 is tf32 only")
    _rejects(p, BWD, {**ok, "INFLIGHT": 1, "WSTAGES": 2}, "INFLIGHT=1 needs at least 3 stages")
    wide = ConvFwdProblem(N=1, C=4, H=8, W=900, K=8, R=3, S=3, padding=1, precision="tf32")   # rows 902 wide
    _rejects(wide, FWD, {**ok, "WGS": 1, "TPS": 1}, "bytes of shared memory exceed")


def test_shared_memory_counts_each_slot_the_copies_ahead_reach():
    _, p = _seed(BWD, ["scherer10_l2"])[0]
    g = HaloGrid.of(p)
    # 16 taps a phase: 4 steps per channel block at TPS=4; 5 stages run 4 steps ahead, 2 slots
    assert slots(g, 3, 4) == 2 and slots(g, 5, 4) == 2 and slots(g, 6, 4) == 3 and slots(g, 3, 16) == 3
    assert g.pitch(128) == 8 * -(-(128 + 3 * g.VD + 3) // 8)   # 4x4 taps a phase on rows VD wide
    assert smem_bytes(g, 2, 16, 3, 4, False) == 3 * 4 * 16 * 128 + 2 * g.pitch(128) * 128 + 1024
    assert smem_bytes(g, 2, 16, 3, 4, True) == 2 * (smem_bytes(g, 2, 16, 3, 4, False) - 1024) + 1024


def _configs(problem, op, stages=(2, 3, 5), widths=(16, 32, 64, 128, 256), mts=(1, 4), inflights=(0, 1)):
    """Every feasible config of these widths, depths, tiles per block and loops, over every taps-per-step
    choice."""
    space, out = _space(problem, op), []
    for wgs, wbn, st, tps, mt, inf in itertools.product((1, 2, 4), widths, stages, (1, 2, 3, 4, 8, 9, 16), mts,
                                                        inflights):
        try:
            out.append(space.validate({"formulation": FORMULATION_HALO, "WGS": wgs, "WBN": wbn, "WSTAGES": st,
                                       "TPS": tps, "MT": mt, "INFLIGHT": inf}))
        except InfeasibleConfigError:
            pass
    return out


@needs_nvcc
def test_sampled_configs_build_for_sm90a_without_spills(tmp_path):
    compiler = NvccCompiler("sm_90", cache_dir=tmp_path)
    rng = np.random.default_rng(3)
    jobs = []
    for op, problems in ((BWD, [*_seed(BWD, ["scherer10_l2"]), *_seed(BWD, ["modern_14"], "fp32"), ODD_BWD[0]]),
                         (FWD, [*_seed(FWD, ["modern_14"]), *_seed(FWD, ["modern_14"], "fp32"), ODD_FWD[1]])):
        for name, p in problems:
            configs = _configs(p, op)
            for k in rng.choice(len(configs), size=min(6, len(configs)), replace=False):
                jobs.append((name, configs[k], op.plan(p, configs[k])))
    assert len(jobs) >= 30 and any(c["MT"] > 1 for _, c, _ in jobs) and any(c["INFLIGHT"] for _, c, _ in jobs)
    failures = target_build_failures(compiler, jobs)
    assert not failures, "\n".join(failures[:8])


def _verify(op, problems, configs):
    """Every config on each shape through NVRTC (the training library's path), and the default
    through an nvcc cubin (the tuner's), every element checked against float64 (fp32 problems at the
    FP32 bound)."""
    assert_every_config_verifies(op, FORMULATION_HALO, problems, configs, "sm_90", HOPPER)


def _gpu_configs(problem):
    """Every other config of each taps-per-step choice with 2 and 5 stages (one halo slot more) in the
    narrowest and widest widths the shape takes, one tile a block; every third with 4 tiles a block
    and 3 or 5 stages (tf32 with a group in flight); plus the defaults."""
    op = FWD if problem.op == "conv_fwd" else BWD
    configs = _configs(problem, op, stages=(2, 5), mts=(1,), inflights=(0,))
    widths = sorted({c["WBN"] for c in configs})
    keep = [c for c in configs if c["WBN"] in (widths[0], widths[-1])][::2]
    tiled = _configs(problem, op, stages=(3, 5), widths=(widths[0], widths[-1]), mts=(4,),
                     inflights=(0,) if problem.precision == "fp32" else (1,))
    keep += tiled[::3]
    space, defaults = _space(problem, op), []
    for cand in HALO.for_op(op.name).default_candidates(problem):
        try:
            defaults.append(space.validate(cand))
        except InfeasibleConfigError:
            pass
    return keep + [c for c in defaults if c not in keep]


@pytest.mark.gpu
@pytest.mark.parametrize("precision", ["tf32", "fp32"])
def test_halo_bwd_data_verifies_against_float64(precision):
    problems = [(n, dataclasses.replace(p, precision=precision)) for n, p in [*_seed(BWD, BWD_SEED), *ODD_BWD]]
    _verify(BWD, problems, _gpu_configs)


@pytest.mark.gpu
@pytest.mark.parametrize("precision", ["tf32", "fp32"])
def test_halo_fwd_verifies_against_float64(precision):
    problems = [(n, dataclasses.replace(p, precision=precision)) for n, p in [*_seed(FWD, FWD_SEED), *ODD_FWD]]
    _verify(FWD, problems, _gpu_configs)
