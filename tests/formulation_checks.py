"""Checks every new formulation's tests make: its operations (with it registered), nvcc builds of
its default and sampled configs without spills, and GPU verification against float64."""
from __future__ import annotations

import os
import random
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Mapping, Sequence

import pytest

from autocnn.device import DeviceLimits
from autocnn.kernels.compiler import NvccCompiler
from autocnn.kernels.conv_bwd_data import ConvBwdData
from autocnn.kernels.conv_fwd import ConvFwd
from autocnn.kernels.conv_wgrad import ConvWgrad
from autocnn.kernels.formulations import REGISTRY, Formulation


def operations_with(formulation: Formulation) -> dict[str, Any]:
    """The convolutions with the formulation registered last (as REGISTRY offers it, or will)."""
    registry = (*(f for f in REGISTRY if f.name != formulation.name), formulation)
    return {op.name: op for op in (ConvFwd(registry), ConvBwdData(registry), ConvWgrad(registry))
            if formulation.serves(op.name)}


def sampled(operation: Any, name: str, problem: Any, limits: DeviceLimits, rng: random.Random, count: int,
            fixed: Mapping[str, Any] | None = None) -> list:
    """The formulation's default config for the problem, and ``count`` sampled ones; with ``fixed``
    (parameters held at one value), ``count`` sampled configs of that part of the space only."""
    space = operation.space(problem, limits).restrict({"formulation": name, **(fixed or {})})
    if fixed:
        return space.sample(rng, count)
    default = operation.default_config(problem, limits, formulation=name)
    return [default, *space.sample(rng, count, exclude=[default])]


def build_failures(operations: dict[str, Any], name: str, problems: dict[str, Sequence[tuple[str, Any]]],
                   arch: str, cache_dir: Any, samples: int = 2) -> list[str]:
    """nvcc -cubin of each problem's default and sampled configs: kernels missing, or a default
    that spills (a sampled config may: ptxas's report makes the tuner skip it)."""
    limits = DeviceLimits.for_arch(arch)
    rng = random.Random()
    jobs = [(f"{op} {label} {config}", operation.plan(problem, config), i == 0)
            for op, operation in operations.items() for label, problem in problems[op]
            for i, config in enumerate(sampled(operation, name, problem, limits, rng, samples))]
    return compile_failures(jobs, arch, cache_dir)


def compile_failures(jobs: Sequence[tuple[str, Any, bool]], arch: str, cache_dir: Any) -> list[str]:
    """nvcc -cubin of each (what, plan, is_default) job: kernels missing from the build, or a
    default config that spills."""
    compiler = NvccCompiler(arch, cache_dir=cache_dir)

    def build(job):
        what, plan, is_default = job
        module = compiler.compile(plan.source, config=plan.config, arch=plan.compile_arch(arch))
        missing = set(plan.kernel_names) - set(module.reports)
        spills = [str(r) for r in module.reports.values() if r.spills] if is_default else []
        return f"{what}: missing {missing}, spills {spills}" if missing or spills else None

    with ThreadPoolExecutor(max_workers=max(2, os.cpu_count() or 2)) as pool:
        return [f for f in pool.map(build, jobs) if f]


# The builds of an exhaustive config list, and the cases of a long emulation: a fresh random sample
# of them in the default run, every one in the slow one (pytest -m slow). The lists themselves are
# always made whole, so their checks (counts, which parameters vary) always run.
BUILD_SAMPLE = 8
BUILDS = (pytest.param(BUILD_SAMPLE, id="sample"), pytest.param(None, id="every", marks=pytest.mark.slow))
EMULATION_SAMPLE = 3
EMULATIONS = (pytest.param(EMULATION_SAMPLE, id="sample"), pytest.param(None, id="every", marks=pytest.mark.slow))
# A formulation's own build tests target sm_90 (the GPUs autocnn ships records for) in the default
# run and sm_80 too under -m slow; test_codegen's covering sample still builds every formulation for
# both in the default run.
BUILD_ARCHES = ("sm_90", pytest.param("sm_80", marks=pytest.mark.slow))


def build_sample(items: Sequence[Any], count: int | None) -> list:
    """``count`` items drawn at random (the seed printed, so that a failure can be drawn again), or
    all of them when ``count`` is None or covers them."""
    items = list(items)
    if count is None or len(items) <= count:
        return items
    seed = random.randrange(2**32)
    print(f"taking {count} of {len(items)} (random.Random({seed}).sample)", file=sys.stderr)
    return random.Random(seed).sample(items, count)


def target_build_failures(compiler: NvccCompiler, jobs: Sequence[tuple[str, Any, Any]]) -> list[str]:
    """Each (name, config, plan) compiled for its plan's target (sm_90a for the Hopper formulations):
    kernels missing from the build, any spill, or ptxas's C7514 (it found registers of a group of
    wgmmas in flight touched, and made every wgmma wait)."""
    def build(job):
        name, config, plan = job
        module = compiler.compile(plan.source, config=config, arch=plan.compile_arch(compiler.arch))
        missing = set(plan.kernel_names) - set(module.reports)
        spills = [str(r) for r in module.reports.values() if r.spills]
        serialized = "C7514" in module.log
        return f"{name} {config}: missing {missing}, spills {spills}, serialized {serialized}" \
            if missing or spills or serialized else None

    with ThreadPoolExecutor(max_workers=max(2, os.cpu_count() or 2)) as pool:
        return [f for f in pool.map(build, jobs) if f]


def assert_every_config_verifies(operation: Any, formulation: str, problems: Sequence[tuple[str, Any]], configs: Any,
                                 arch: str, limits: DeviceLimits) -> None:
    """``configs(problem)`` of each problem through NVRTC (what the training library loads), and the
    formulation's default through an nvcc cubin (what the tuner measures), every element checked
    against float64; skipped unless the GPU is ``arch``."""
    import pytest

    pytest.importorskip("cupy")
    from autocnn.device import current_device
    from autocnn.kernels.compiler import CompilePool, nvcc_path
    from autocnn.kernels.runtime import KernelLoader
    from autocnn.measurement.measure import check_candidate

    device = current_device(0)
    if device.arch != arch:
        pytest.skip(f"{formulation} needs a {arch} GPU, not {device.arch}")
    loader = KernelLoader()
    failures, checked = [], 0
    for name, problem in problems:
        for config in configs(problem):
            check = check_candidate(loader.load(operation.plan(problem, config)), problem, time_it=False)
            checked += 1
            if not check.verification.passed:
                failures.append(f"{name} {config} (NVRTC): {check.verification.message}")
    if nvcc_path() is not None:
        with CompilePool(device.arch) as pool:
            for name, problem in problems:
                plan = operation.plan(problem, operation.default_config(problem, limits, formulation=formulation))
                module = pool.submit(plan).result()
                check = check_candidate(loader.load(plan, module.cubin_path), problem, time_it=False)
                checked += 1
                if not check.verification.passed:
                    failures.append(f"{name} default (nvcc cubin): {check.verification.message}")
    expected = sum(len(configs(p)) for _, p in problems) + (len(problems) if nvcc_path() else 0)
    assert checked == expected and checked > 0
    assert not failures, f"{len(failures)} of {checked} failed:\n" + "\n".join(failures[:8])


def assert_verifies_on_gpu(operation: Any, name: str, problems: Sequence[tuple[str, Any]], samples: int,
                           workspace_limit: int, fixed: Mapping[str, Any] | None = None) -> None:
    """Each problem's default and ``samples`` sampled configs (with ``fixed``: only sampled ones, of
    that part of the space) run on the GPU with fresh inputs: every element within the problem's
    bound of float64, and the workspace within the limit."""
    from autocnn.device import current_device
    from autocnn.kernels.runtime import KernelLoader
    from autocnn.measurement.measure import check_candidate

    limits = current_device(0).limits()
    loader = KernelLoader()
    rng = random.Random()
    failures, checked = [], 0
    for label, problem in problems:
        for config in sampled(operation, name, problem, limits, rng, samples, fixed):
            plan = operation.plan(problem, config)
            checked += 1
            start = time.perf_counter()
            if plan.workspace_bytes > workspace_limit:
                failures.append(f"{label} {config}: {plan.workspace_bytes} bytes of workspace")
                continue
            check = check_candidate(loader.load(plan), problem, time_it=False)
            # One line per config (seen with pytest -s): a run cut by its time limit names the
            # case it was in and how long the others took.
            print(f"  {label}: {'ok' if check.verification.passed else 'FAILED'} in "
                  f"{time.perf_counter() - start:.1f} s {dict(config.items)}", file=sys.stderr, flush=True)
            if not check.verification.passed:
                failures.append(f"{label} {config}: {check.verification.message}")
    assert checked >= samples * len(problems), f"only {checked} configs ran"
    assert not failures, f"{len(failures)} of {checked} failed:\n" + "\n".join(failures[:8])
