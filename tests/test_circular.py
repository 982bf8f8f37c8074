"""The "circular" conv_fwd formulation (Scherer et al. 2010's circular buffer of source rows): on the
CPU, the buffer's row schedule (circular_rows.row_schedule, the kernels' loop) and a NumPy model of
the kernel that follows its indexing (slots, phase-split rows, thread mapping, channel groups)
against the float64 reference, registration leaving every other record and default as it was, and
the template through nvcc with ptxas reports; on the GPU (-m gpu), every element against float64
on the scherer10 shapes and on shapes that divide nothing evenly."""
from __future__ import annotations

import random

import numpy as np
import pytest

from autocnn.device import DeviceLimits
from autocnn.kernels import reference
from autocnn.kernels.compiler import nvcc_path
from autocnn.kernels.conv_bwd_data import ConvBwdData
from autocnn.kernels.conv_fwd import ConvFwd
from autocnn.kernels.conv_wgrad import ConvWgrad
from autocnn.kernels.formulations import REGISTRY
from autocnn.kernels.formulations.circular import CIRCULAR, NAME, circular_grid, circular_threads
from autocnn.kernels.formulations.cores.circular_rows import (RowWindow, block_steps, final_rows, flush_rows, phase_len,
                                                              row_schedule, strip_width)
from autocnn.kernels.geometry import cdiv
from autocnn.kernels.problem import ConvFwdProblem
from autocnn.kernels.suite import odd_problems, seed_problems
from tests.formulation_checks import BUILD_ARCHES, assert_verifies_on_gpu, build_failures, operations_with

LIMITS = DeviceLimits.for_arch("sm_90")
OPERATIONS = operations_with(CIRCULAR)
FWD = OPERATIONS["conv_fwd"]


def scherer10_problems(batch: int = 60) -> list[tuple[str, ConvFwdProblem]]:
    """The zoo's scherer10 layers (1x256x256, three 8x8 stride-2 pad-3 tanh convolutions of 8 maps)."""
    geo = {"R": 8, "S": 8, "stride": 2, "padding": 3, "bias": True, "activation": "tanh"}
    return [(f"scherer10_zoo_l{i + 1}", ConvFwdProblem(N=batch, C=c, H=h, W=h, K=8, **geo))
            for i, (c, h) in enumerate(((1, 256), (8, 128), (8, 64)))]


def uneven_problems() -> list[tuple[str, ConvFwdProblem]]:
    """Shapes that divide no tile evenly: batch 1 and 3, odd sizes, asymmetric padding, strides 1, 2
    and (2, 1), K and C not multiples of the maps per block, more channels than one group stages."""
    return [
        ("c_odd_s1", ConvFwdProblem(N=3, C=5, H=13, W=11, K=7, R=3, S=5, padding=(1, 2, 1, 2))),
        ("c_odd_s2", ConvFwdProblem(N=1, C=3, H=17, W=23, K=13, R=5, S=5, stride=2, padding=(2, 1, 0, 2),
                                    bias=True, activation="tanh")),
        ("c_odd_s21", ConvFwdProblem(N=3, C=7, H=9, W=31, K=10, R=4, S=3, stride=(2, 1), padding=(3, 0, 1, 2),
                                     bias=True, activation="relu")),
        ("c_many_c", ConvFwdProblem(N=1, C=37, H=10, W=9, K=9, R=3, S=3, stride=1, padding=1, bias=True)),
        ("c_wide_stride", ConvFwdProblem(N=3, C=2, H=11, W=12, K=5, R=2, S=2, stride=3)),
    ]


def space():
    return lambda problem: FWD.space(problem, LIMITS).restrict({"formulation": NAME})


# -- the row schedule ------------------------------------------------------------------------

@pytest.mark.parametrize("R,SH,PPS", [(8, 2, 1), (8, 2, 2), (8, 2, 4), (3, 1, 1), (5, 3, 2), (2, 3, 1), (1, 1, 4)])
def test_row_schedule_loads_each_row_once_into_a_free_slot(R, SH, PPS):
    """Every row a block reads is loaded once, into a slot whose previous row no later read needs
    and that no read of the same barrier interval uses; each step reads exactly the rows of its
    output rows (output row pp of step t: rows t*E + pp*SH + r, r < R); one barrier a step when
    the buffer holds a step's rows ahead."""
    for extra in range(0, 2 * PPS * SH + 1):
        win = RowWindow(R, SH, PPS, (PPS - 1) * SH + R + extra)
        for steps in (1, 2, 5, 9):
            schedule = row_schedule(win, steps)
            slot_row: dict[int, int] = {}
            loaded: list[int] = []
            for t, step in enumerate(schedule):
                # "before" loads land behind a barrier (after last step's reads), then the barrier,
                # then the prefetch runs concurrently with this step's reads. The rows of one load
                # are written at once: they must go to distinct slots.
                for rows in (step.before, step.prefetch):
                    assert len({i % win.ROWS for i in rows}) == len(rows), (win, t, rows)
                for i in step.before:
                    slot_row[i % win.ROWS] = i
                for i in step.prefetch:
                    assert i % win.ROWS not in {j % win.ROWS for j in step.reads}, (win, t, i)
                assert all(slot_row.get(i % win.ROWS) == i for i in step.reads), (win, t)
                for i in step.prefetch:
                    slot_row[i % win.ROWS] = i
                loaded += [*step.before, *step.prefetch]
                for pp in range(PPS):
                    rows = [t * win.enter + pp * SH + r for r in range(R)]
                    assert set(rows) <= set(step.reads)
                assert len(step.reads) == win.need
                if t > 0 and win.overlapped():
                    assert not step.before and not step.extra_barrier
            needed = sorted({i for step in schedule for i in step.reads})
            assert loaded == needed, (win, steps)


@pytest.mark.parametrize("R,SH", [(8, 2), (3, 1), (5, 3), (2, 3), (4, 4), (1, 2)])
def test_error_accumulator_flushes_every_touched_row_once_when_complete(R, SH):
    """The backward's second buffer (R slots): step t touches rows t*SH .. t*SH+R-1; a flushed row is
    touched by no later step, every touched row is flushed once, and rows in one slot never overlap."""
    for steps in (1, 2, 7):
        flushed: list[int] = []
        live: dict[int, int] = {}
        for t in range(steps):
            touched = range(t * SH, t * SH + R)
            for i in touched:
                assert live.setdefault(i % R, i) == i, "two live rows share a slot"
            for i in flush_rows(R, SH, t):
                assert all(i < u * SH for u in range(t + 1, steps)), "flushed before its last touch"
                flushed.append(i)
                del live[i % R]
        for i in final_rows(R, SH, steps):
            flushed.append(i)
            del live[i % R]
        assert not live
        touched_all = sorted({t * SH + r for t in range(steps) for r in range(R)})
        assert flushed == touched_all


def test_strip_geometry():
    # The paper's window: 32 outputs of stride 2 and an 8-wide filter read 70 source columns.
    assert strip_width(32, 8, 2) == 70 and phase_len(32, 8, 2) == 35
    assert block_steps(P=33, PBLK=16, PPS=4, p0=32) == 1 and block_steps(P=33, PBLK=16, PPS=4, p0=16) == 4


# -- a NumPy model of the kernel -----------------------------------------------------------------

def load_rows(buf, x_n, problem, c0, h0, w0, a, b, CB, ROWS, LDM, IWT, E, NEED):
    """circ::load_rows: rows [a, b) of CB channels into slot i % ROWS, column x at phase x % SW,
    skipping the rows no step reads (E > NEED); two rows of one call in one slot is an error."""
    C, H, W = problem.C, problem.H, problem.W
    SW = problem.stride[1]
    rows = [i for i in range(a, b) if E <= NEED or i % E < NEED]
    assert len({i % ROWS for i in rows}) == len(rows), f"rows {rows} race for slots of {ROWS}"
    i, c, x = np.meshgrid(np.array(rows, dtype=int), np.arange(CB), np.arange(IWT), indexing="ij")
    ci, h, w = c0 + c, h0 + i, w0 + x
    ok = (ci < C) & (h >= 0) & (h < H) & (w >= 0) & (w < W)
    v = np.where(ok, x_n[np.minimum(ci, C - 1), np.clip(h, 0, H - 1), np.clip(w, 0, W - 1)], 0.0)
    buf[((c * ROWS + i % ROWS) * SW + x % SW) * LDM + x // SW] = v


def model_forward(problem: ConvFwdProblem, config, x, w, bias):
    """The circular_conv_fwd.cu.j2 kernel, block by block, its threads vectorised: shared memory
    starts as NaN, so a read of a slot or position the loader did not fill shows in the output."""
    p, c = problem, config
    KB, KPT, TQ, QPT, PPS = c["KB"], c["KPT"], c["TQ"], c["QPT"], c["PPS"]
    ROWS, CB, PBLK, PAD = c["ROWS"], c["CB"], c["PBLK"], c["PAD"]
    R, S, (SH, SW), (PT, PL) = p.R, p.S, p.stride, p.padding[:2]
    TXQ, THREADS = TQ // QPT, circular_threads(c)
    E, NEED = PPS * SH, (PPS - 1) * SH + R
    IWT, LDM = strip_width(TQ, S, SW), phase_len(TQ, S, SW) + PAD
    STRIPS, GROUPS = cdiv(p.Q, TQ), cdiv(p.C, CB)
    tid = np.arange(THREADS)
    tq, tk = tid % TXQ, tid // TXQ
    y = np.full(p.y_shape, np.nan)
    gx, gy, gz = circular_grid(p, c)
    for bx in range(gx):
        strip, seg = bx % STRIPS, bx // STRIPS
        q0, p0 = strip * TQ, seg * PBLK
        h0, w0 = p0 * SH - PT, q0 * SW - PL
        steps = cdiv(min(PBLK, p.P - p0), PPS)
        total = (steps - 1) * E + NEED
        for by in range(gy):
            k0 = by * KB
            for n in range(gz):
                for g in range(GROUPS):
                    c0 = g * CB
                    w_s = np.zeros((CB, R, S, KB))
                    cs, ks = np.arange(c0, c0 + CB), np.arange(k0, k0 + KB)
                    valid = (cs[:, None] < p.C) & (ks[None, :] < p.K)
                    w_s[...] = np.where(valid[:, None, None, :],
                                        w[np.minimum(ks, p.K - 1)][:, np.minimum(cs, p.C - 1)].transpose(1, 2, 3, 0), 0.0)
                    buf = np.full(CB * ROWS * SW * LDM, np.nan)
                    loaded, base_slot = 0, 0
                    for t in range(steps):
                        hi = t * E + NEED
                        if loaded < hi:
                            load_rows(buf, x[n], p, c0, h0, w0, loaded, hi, CB, ROWS, LDM, IWT, E, NEED)
                            loaded = hi
                        pre = min(t * E + ROWS, total)
                        if loaded < pre:   # before the reads here: a prefetch into a read slot shows
                            load_rows(buf, x[n], p, c0, h0, w0, loaded, pre, CB, ROWS, LDM, IWT, E, NEED)
                            loaded = pre
                        acc = np.zeros((THREADS, KPT, PPS, QPT))
                        for cc in range(CB):
                            if c0 + cc >= p.C:
                                break
                            for r in range(R):
                                for s in range(S):
                                    wv = w_s[cc, r, s][tk[:, None] * KPT + np.arange(KPT)]      # (THREADS, KPT)
                                    for pp in range(PPS):
                                        slot = (base_slot + pp * SH + r) % ROWS
                                        idx = (((cc * ROWS + slot) * SW + s % SW) * LDM + s // SW + tq[:, None]
                                               + np.arange(QPT) * TXQ)
                                        acc[:, :, pp, :] += wv[:, :, None] * buf[idx][:, None, :]
                        for i in range(KPT):
                            for pp in range(PPS):
                                for j in range(QPT):
                                    k, pr, q = k0 + tk * KPT + i, p0 + t * PPS + pp, q0 + tq + j * TXQ
                                    ok = (k < p.K) & (pr < p.P) & (q < p.Q)
                                    if not ok.any():
                                        continue
                                    k, q, v = k[ok], q[ok], acc[ok, i, pp, j]
                                    if g > 0:
                                        v = v + y[n, k, pr, q]
                                    if g == GROUPS - 1:
                                        if p.bias:
                                            v = v + bias[k]
                                        v = reference.activation(v, p.activation)
                                    y[n, k, pr, q] = v
                        base_slot = (base_slot + E) % ROWS
    return y


@pytest.mark.parametrize("label,problem", uneven_problems()
                         + [("scherer_mini", ConvFwdProblem(N=1, C=3, H=40, W=36, K=9, R=8, S=8, stride=2, padding=3,
                                                             bias=True, activation="tanh"))])
def test_the_kernel_model_computes_the_convolution(label, problem, rng):
    """Defaults and sampled configs of every buffer size, tile and channel grouping: the model of
    the kernel's indexing gives the float64 reference to rounding, every output written."""
    pyrng = random.Random(int(rng.integers(2**31)))
    sp = space()(problem)
    configs = [*FWD.default_configs(problem, LIMITS, formulation=NAME), *sp.sample(pyrng, 4)]
    x, w = rng.standard_normal(problem.x_shape), rng.standard_normal(problem.w_shape)
    bias = rng.standard_normal(problem.K)
    expected = reference.conv_fwd(x, w, stride=problem.stride, padding=problem.padding,
                                  bias=bias if problem.bias else None, activation=problem.activation)
    for config in configs:
        got = model_forward(problem, config, x, w, bias)
        assert not np.isnan(got).any(), f"{label} {config}: unwritten outputs or unloaded rows read"
        np.testing.assert_allclose(got, expected, rtol=1e-10, atol=1e-10, err_msg=f"{label} {config}")


# -- the space and the registry ----------------------------------------------------------------------

def test_the_papers_configuration_is_in_the_space():
    """Section 4: 64x64 source maps to 32x32 targets, 8 maps a block, 32 outputs a row, 256 threads,
    a 70x8 window of which two rows enter each step."""
    problem = ConvFwdProblem(N=60, C=8, H=64, W=64, K=8, R=8, S=8, stride=2, padding=3, bias=True, activation="tanh")
    config = space()(problem).validate({"formulation": NAME, "KB": 8, "KPT": 1, "TQ": 32, "QPT": 1, "PPS": 1,
                                        "ROWS": 8, "PBLK": 32, "CB": 1, "PAD": 0, "UNROLL_R": 1,
                                        "MINB": 1})
    plan = FWD.plan(problem, config)
    assert plan.launches[0].block == (256, 1, 1) and plan.launches[0].grid == (1, 1, 60)
    assert "IWT = (TQ - 1) * SW + S" in plan.source and strip_width(32, 8, 2) == 70


def test_rows_below_one_step_are_refused_with_the_reason():
    problem = scherer10_problems()[1][1]
    from autocnn.errors import InfeasibleConfigError

    with pytest.raises(InfeasibleConfigError, match="ROWS=8 is fewer than the 10 rows one step of 2 output rows reads"):
        space()(problem).validate({"formulation": NAME, "KB": 8, "KPT": 4, "TQ": 32, "QPT": 2, "PPS": 2,
                                   "ROWS": 8, "PBLK": 16, "CB": 8, "PAD": 1, "UNROLL_R": 1, "MINB": 1})


def _registry_without_circular():
    return tuple(f for f in REGISTRY if not f.name.startswith("circular"))


def test_registering_circular_leaves_other_formulations_and_defaults_as_they_were():
    """Fingerprints (what shipped records are keyed by) and heuristic defaults of every other
    formulation are the same with and without circular registered."""
    # After every formulation that was there before it (only those added since come later).
    names = [f.name for f in REGISTRY]
    assert names[names.index(CIRCULAR.name):] == [CIRCULAR.name, "circular_bwd", "wgmma", "halo", "tc_rows",
                                                    "winograd_fused", "tma", "depthwise"]
    before = _registry_without_circular()
    for cls in (ConvFwd, ConvBwdData, ConvWgrad):
        old, new = cls(before), cls(REGISTRY)
        for f in old.formulations:
            assert old.fingerprint(f.names[0]) == new.fingerprint(f.names[0]), (cls.name, f.formulation)
        for name, problem in seed_problems(cls.name) + odd_problems(cls.name):
            assert old.default_config(problem, LIMITS) == new.default_config(problem, LIMITS), (cls.name, name)
    assert NAME in ConvFwd(REGISTRY).formulation_names and NAME not in ConvFwd(before).formulation_names


def test_shipped_records_stay_current():
    from autocnn.store import TuningDatabase

    assert TuningDatabase().check() == []


def test_shipped_records_carry_the_digest_of_the_code_they_were_tuned_with():
    """Every shipped record has a plan digest, and its config (completed with the first choice of
    any parameter added since) plans to it now: a template edit that changes the code of a tuned
    config is caught here, on the CPU, while one that leaves every tuned config's code as it was
    keeps the records current (records.validate_record re-keys them)."""
    from autocnn.kernels import get_operation
    from autocnn.store.files import default_shipped_dir, read_raw
    from autocnn.store.records import TuningRecord, validate_record

    files = sorted(default_shipped_dir().glob("*.json"))
    assert files
    wrong = []
    for path in files:
        for i, raw in enumerate(read_raw(path)):
            record = TuningRecord.from_dict(raw)
            valid = validate_record(record)
            digest = get_operation(record.key.op).code_digest(valid.problem, valid.config)
            if record.plan_digest != digest:
                wrong.append(f"{path.name} record {i} ({record.key.op} {valid.problem.shape_string()}): "
                             f"plan digest {record.plan_digest}, its config now plans to {digest}")
    assert not wrong, "\n".join(wrong[:10]) + ("\n(scripts/stamp_plan_digests.py adds missing digests)")


# -- nvcc ------------------------------------------------------------------------------------------

@pytest.mark.skipif(nvcc_path() is None, reason="nvcc is not installed")
@pytest.mark.parametrize("arch", BUILD_ARCHES)
def test_templates_build_without_spills(arch, tmp_path):
    """The default and two sampled configs of the scherer10 layers (the zoo's and the seed suite's)
    and of shapes that divide nothing evenly: every kernel reported by ptxas, no default spilling."""
    seeds = [(n, pr) for n, pr in seed_problems("conv_fwd") if n.startswith("scherer10")]
    problems = {"conv_fwd": scherer10_problems() + seeds + uneven_problems()[:3]}
    failures = build_failures(OPERATIONS, NAME, problems, arch, tmp_path)
    assert not failures, "\n".join(failures[:10])


# -- the GPU ---------------------------------------------------------------------------------------

def gpu_problems() -> list[tuple[str, ConvFwdProblem]]:
    seeds = [(n, pr) for n, pr in seed_problems("conv_fwd") if n.startswith("scherer10")]
    return scherer10_problems(60) + scherer10_problems(1)[:1] + seeds + uneven_problems() + odd_problems("conv_fwd")


@pytest.mark.gpu
def test_circular_verifies_against_float64_on_the_gpu():
    """Defaults and four sampled configs of each shape: every element within the FP32 bound."""
    pytest.importorskip("cupy")
    assert_verifies_on_gpu(FWD, NAME, gpu_problems(), 4, workspace_limit=0)


# -- scripts/bench_scherer.py ------------------------------------------------------------------------

def test_the_benchmark_script_runs_here_up_to_the_gpu(monkeypatch):
    """--help, its refusal of bad batches before any device work, the layers it times (the zoo's
    scherer10), and the one-core CPU baseline on a small layer."""
    import os
    import runpy
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parent.parent / "scripts" / "bench_scherer.py"
    run = subprocess.run([sys.executable, str(script), "--help"], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0 and "95-115x" in run.stdout
    run = subprocess.run([sys.executable, str(script), "--batches", "60,x"], capture_output=True, text=True, timeout=120)
    assert run.returncode == 2 and "--batches" in run.stderr
    for var in ("OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "OMP_NUM_THREADS"):   # the script sets them: undo after
        monkeypatch.setenv(var, os.environ.get(var, "1"))
    module = runpy.run_path(str(script))
    assert [p for _, p in module["scherer10_layers"](60)] == [p for _, p in scherer10_problems(60)]
    small = ConvFwdProblem(N=2, C=2, H=12, W=12, K=3, R=4, S=4, stride=2, padding=1, bias=True, activation="tanh")
    seconds = module["cpu_layer_seconds"](small, 1)
    assert set(seconds) == {"fwd", "bwd"} and all(v > 0 for v in seconds.values())
