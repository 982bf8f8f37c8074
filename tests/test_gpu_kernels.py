"""GPU verification of every kernel family (run on a GPU host: pytest -m gpu).

Every family, on every seed shape and on the odd shapes, is verified for its default config,
AUTOCNN_GPU_SAMPLES (default 16) sampled configs and three of each formulation of the family
against the float64 reference, on fresh random inputs, every element checked. Variants run in a measurement worker, so one that faults is
reported as a failure of its own case instead of ending the pytest run.
"""
from __future__ import annotations

import os
import random
from concurrent.futures import Future

import pytest

from autocnn.kernels import OPERATIONS, operation_for
from autocnn.kernels.suite import odd_problems, seed_problems

pytestmark = pytest.mark.gpu

SAMPLES = int(os.environ.get("AUTOCNN_GPU_SAMPLES", "16"))
SEED = int(os.environ.get("AUTOCNN_GPU_SEED", random.randrange(2**31)))
CASES = [(op, name) for op in sorted(OPERATIONS)
         for name, _ in seed_problems(op) + odd_problems(op)]


def _problem(op: str, name: str):
    return dict(seed_problems(op) + odd_problems(op))[name]


@pytest.fixture(scope="session")
def worker():
    from autocnn.measurement.worker import MeasureWorker

    with MeasureWorker(0, timeout_s=120) as w:
        yield w


def _per_formulation(space, rng, taken, count: int = 3) -> list:
    """A few configs of each formulation of a family that has several, so that every core is
    verified on every case and not only where the random draw lands on it."""
    names = [p.name for p in space.params]
    if "formulation" not in names:
        return []
    out = []
    for f in space.param("formulation").choices:
        out += space.restrict({"formulation": f}).sample(rng, count, exclude=[*taken, *out])
    return out


def _selected_cases(items) -> list[tuple[str, str]]:
    """The cases this pytest run selects (after -k, -m and node ids): only they are compiled, so a run of
    one operation's cases (scripts/gpu_check.sh --by-op) does not compile every family's variants."""
    chosen = {(item.callspec.params["op"], item.callspec.params["name"]) for item in items
              if getattr(item, "originalname", None) == "test_family_verifies" and hasattr(item, "callspec")}
    return [case for case in CASES if case in chosen]


@pytest.fixture(scope="session")
def compiled(request, device):
    """All configs of the selected cases, compiled in parallel with nvcc before the first one runs."""
    from autocnn.kernels.compiler import CompilePool, nvcc_path

    if nvcc_path() is None:
        pytest.skip("nvcc is needed to compile the GPU test variants in parallel")
    limits = device.limits()
    jobs: dict[tuple[str, str], list[tuple[object, object, Future]]] = {}
    with CompilePool(device.arch) as pool:
        for op, name in _selected_cases(request.session.items):
            # Each case draws from its own generator: the same seed gives the same variants of a
            # case whichever cases run beside it (a failure reruns alone with AUTOCNN_GPU_SEED).
            rng = random.Random(f"{SEED}:{op}:{name}")
            problem = _problem(op, name)
            operation = operation_for(problem)
            space = operation.space(problem, limits)
            default = operation.default_config(problem, limits)
            configs = [default, *space.sample(rng, SAMPLES, exclude=[default])]
            configs += _per_formulation(space, rng, configs)
            jobs[(op, name)] = [(c, operation.plan(problem, c), pool.submit(operation.plan(problem, c)))
                                for c in configs]
        for entries in jobs.values():
            for _, _, fut in entries:
                fut.exception()   # wait for every compile while the pool is alive
    return jobs


@pytest.mark.parametrize("op,name", CASES, ids=[f"{op}-{name}" for op, name in CASES])
def test_family_verifies(op, name, compiled, worker, device):
    from autocnn.kernels.compiler import resource_violations
    from autocnn.measurement.worker import MeasureJob

    problem = _problem(op, name)
    failures, checked = [], 0
    for config, plan, fut in compiled[(op, name)]:
        if fut.exception() is not None:
            failures.append(f"{config}: compile error {fut.exception()}")
            continue
        module = fut.result()
        if resource_violations(module, plan, device.regs_per_sm, device.max_smem_per_block, allow_spills=True):
            continue   # the tuner never runs these; ptxas says they cannot launch
        job = MeasureJob(op, problem.to_dict(), config.as_dict(), module.cubin_path, time_it=False)
        result = worker.run(job)
        checked += 1
        if not result.ok:
            failures.append(f"{config}: {result.failure}: {result.message[:300]}")
    assert checked >= min(SAMPLES + 1, len(compiled[(op, name)])) - 2, f"only {checked} variants could run"
    assert not failures, f"seed {SEED}: {len(failures)} of {checked} failed:\n" + "\n".join(failures[:8])


@pytest.mark.parametrize("op", sorted(OPERATIONS))
def test_nvrtc_path_runs_the_default_config(op, device):
    """The training library compiles through NVRTC (no nvcc needed): the default config verifies."""
    from autocnn.measurement.measure import check_candidate
    from autocnn.kernels.runtime import KernelLoader

    loader = KernelLoader()
    for name, problem in odd_problems(op)[:3]:
        operation = operation_for(problem)
        plan = operation.plan(problem, operation.default_config(problem, device.limits()))
        check = check_candidate(loader.load(plan), problem, time_it=False)
        assert check.verification.passed, f"{name}: {check.verification.message}"


def test_timing_protocol_returns_a_consistent_median(device):
    from autocnn.measurement.measure import L2Flusher, check_candidate
    from autocnn.kernels.runtime import KernelLoader

    name, problem = seed_problems("conv_fwd")[0]
    operation = operation_for(problem)
    plan = operation.plan(problem, operation.default_config(problem, device.limits()))
    check = check_candidate(KernelLoader().load(plan), problem, flusher=L2Flusher(device.l2_bytes), budget_s=0.1)
    t = check.timing
    assert check.verification.passed and t is not None
    assert 0 < t.min_us <= t.p25_us <= t.median_us <= t.p75_us
    assert t.reps >= 10
