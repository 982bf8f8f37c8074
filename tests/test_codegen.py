"""Rendering and compilation on the CPU: every family renders for every seed and odd shape, and a
sample of valid configs compiles with nvcc for sm_80 and sm_90, with the ptxas report parsed."""
from __future__ import annotations

import dataclasses
import os
import re
import random
import threading
from concurrent.futures import ThreadPoolExecutor

import jinja2
import jinja2.meta
import pytest

from autocnn.kernels import codegen
from autocnn.kernels.compiler import NvccCompiler, nvcc_path, parse_ptxas_report
from autocnn.kernels.formulations.halo import FORMULATION_HALO
from autocnn.kernels.formulations.tma import FORMULATION_TMA
from autocnn.kernels.formulations.cores.wgmma_gemm import ARCH as WGMMA_ARCH, FORMULATION_WGMMA
from autocnn.device import DeviceLimits
from autocnn.errors import CompileError
from autocnn.kernels import OPERATIONS, ConvFwdProblem, operation_for
from autocnn.kernels.suite import grouped_odd_problems, odd_problems, seed_problems

ARCHES = ("sm_80", "sm_90")
needs_nvcc = pytest.mark.skipif(nvcc_path() is None, reason="nvcc is not installed")


def all_problems(op):
    return seed_problems(op) + odd_problems(op)


@pytest.mark.parametrize("op", sorted(OPERATIONS))
def test_every_family_renders_for_every_shape(op):
    limits = DeviceLimits.for_arch("sm_90")
    rng = random.Random()
    for name, problem in all_problems(op):
        operation = operation_for(problem)
        for config in [operation.default_config(problem, limits), *operation.space(problem, limits).sample(rng, 4)]:
            plan = operation.plan(problem, config)
            # A plan of library steps only (unrolled's 1x1 as plain GEMMs) has no kernel of its own.
            assert bool(plan.kernel_names) == (f'extern "C" __global__' in plan.source), name
            assert all(re.search(rf"\b{k}\(", plan.source) for k in plan.kernel_names), name
            # every problem size is a compile-time constant in the source
            assert f"N = {problem.N}" in plan.source or f"NC = {problem.N * problem.C}" in plan.source
            assert "{{" not in plan.source and "{%" not in plan.source


def test_missing_template_variable_is_an_error_not_empty_text():
    env = codegen.environment()
    with pytest.raises(jinja2.UndefinedError):
        env.from_string("constexpr int X = {{ missing }};").render()


def _copy_templates(tmp_path, monkeypatch):
    """A copy of the template folders (op templates, formulations' folders) that the fingerprints
    (not the cached renderer) read."""
    roots = []
    for root in codegen.TEMPLATE_ROOTS:
        copy = tmp_path / root.name
        for path in root.rglob("*.j2"):
            target = copy / path.relative_to(root)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(path.read_text())
        roots.append(copy)
    monkeypatch.setattr(codegen, "TEMPLATE_ROOTS", tuple(roots))
    codegen.template_index.cache_clear()
    codegen.template_fingerprint.cache_clear()
    return roots


def test_a_template_is_found_by_name_in_any_folder_and_a_name_is_one_file(tmp_path, monkeypatch):
    templates, formulations = _copy_templates(tmp_path, monkeypatch)
    try:
        assert codegen.template_path("conv_fwd.cu.j2") == templates / "conv_fwd.cu.j2"
        with pytest.raises(FileNotFoundError):
            codegen.template_path("only_nested.cuh.j2")
        (formulations / "elsewhere").mkdir()
        (formulations / "elsewhere" / "only_nested.cuh.j2").write_text("// found by its name\n")
        codegen.template_index.cache_clear()
        assert codegen.template_path("only_nested.cuh.j2") == formulations / "elsewhere" / "only_nested.cuh.j2"
        (formulations / "elsewhere" / "conv_fwd.cu.j2").write_text("// a second file of one name\n")
        codegen.template_index.cache_clear()
        with pytest.raises(codegen.DuplicateTemplateError, match="conv_fwd.cu.j2"):
            codegen.template_index()
    finally:
        codegen.template_index.cache_clear()
        codegen.template_fingerprint.cache_clear()


def test_a_fingerprint_belongs_to_a_formulation_of_an_operation():
    fwd, wgrad = OPERATIONS["conv_fwd"], OPERATIONS["conv_wgrad"]
    direct, igemm = fwd.fingerprint("direct"), fwd.fingerprint("igemm")
    assert len({direct, igemm, fwd.fingerprint(), wgrad.fingerprint("atomic")}) == 4
    assert direct == fwd.fingerprint("direct")
    # atomic and two_pass are one formulation (the GEMM's split sums meet two ways), with one fingerprint.
    assert wgrad.fingerprint("atomic") == wgrad.fingerprint("two_pass") == wgrad.fingerprint("igemm")
    limits = DeviceLimits.for_arch("sm_90")
    for op in OPERATIONS.values():
        name, problem = seed_problems(op.name)[0]
        config = op.default_config(problem, limits)
        plan = op.plan(problem, config)
        assert plan.fingerprint == op.config_fingerprint(config) == op.fingerprint(config.get("formulation")), op.name
        assert f"(fingerprint {plan.fingerprint})" in plan.source
    # An operation with one formulation has one fingerprint; a config naming no formulation of an op has none.
    assert OPERATIONS["avgpool_fwd"].fingerprint() == OPERATIONS["avgpool_fwd"].fingerprint("window_gather")
    assert fwd.config_fingerprint({"formulation": "rows"}) is None


def test_a_template_change_makes_only_its_formulations_stale(tmp_path, monkeypatch):
    fwd = OPERATIONS["conv_fwd"]
    before = {name: fwd.fingerprint(name) for name in fwd.formulation_names}
    combined = fwd.fingerprint()
    templates, _ = _copy_templates(tmp_path, monkeypatch)
    try:
        assert {name: fwd.fingerprint(name) for name in fwd.formulation_names} == before
        # The implicit GEMM's glue changes: its records go stale, the direct formulation's stay current.
        glue = codegen.template_path("igemm_conv_fwd.cu.j2")
        glue.write_text(glue.read_text() + "\n// changed\n")
        codegen.template_fingerprint.cache_clear()
        assert fwd.fingerprint("igemm") != before["igemm"]
        assert fwd.fingerprint("direct") == before["direct"]
        assert fwd.fingerprint() != combined
        # The op template is every formulation's.
        (templates / "conv_fwd.cu.j2").write_text((templates / "conv_fwd.cu.j2").read_text() + "// changed\n")
        codegen.template_fingerprint.cache_clear()
        assert fwd.fingerprint("direct") != before["direct"]
    finally:
        codegen.template_index.cache_clear()
        codegen.template_fingerprint.cache_clear()


def _rendered_from(names) -> set[str]:
    """The templates named and every template they include or import, transitively (an include
    under a condition counts: some config takes it; one by a computed name, the op templates'
    formulation_template, is each formulation's first template, which its list holds)."""
    env = codegen.environment()
    seen, todo = set(), list(names)
    while todo:
        name = todo.pop()
        if name not in seen:
            seen.add(name)
            source = codegen.template_path(name).read_text(encoding="utf-8")
            todo += [n for n in jinja2.meta.find_referenced_templates(env.parse(source)) if n]
    return seen


def test_a_formulations_fingerprint_covers_every_template_it_renders_from():
    """A fingerprint hashes the template files a formulation lists; a shared template that one of them
    includes or imports and the list lacks could change without its records going stale."""
    wgrad = _rendered_from(["igemm_conv_wgrad.cu.j2"])
    assert {"igemm_conv_wgrad_reduce.cu.j2", "_conv_wgrad_operands.cuh.j2", "_operand_access.cuh.j2"} <= wgrad
    missing = {}
    for op in OPERATIONS.values():
        for f in op.formulations:
            listed = set(op.template_files(f))
            if unlisted := _rendered_from(listed) - listed:
                missing[f"{op.name}/{f.formulation}"] = sorted(unlisted)
    assert not missing, f"templates rendered from but not in the formulation's templates: {missing}"


def test_fingerprint_follows_code_generation_not_the_search_space():
    fwd = OPERATIONS["conv_fwd"]
    base = fwd.fingerprint("igemm")
    # The Python that computes launch geometry is part of the kernel...
    assert codegen.template_fingerprint(("conv_fwd.cu.j2",), ("def launches(): return 1",)) != \
        codegen.template_fingerprint(("conv_fwd.cu.j2",), ("def launches(): return 2",))
    hashed = "".join(fwd._formulation_code(fwd.formulation("igemm")))
    assert "def launches(" in hashed and "def plan(" in hashed
    # ...while which configs the space offers is not: records survive a change of choices.
    assert "def params(" not in hashed and "def constraints(" not in hashed
    assert fwd.fingerprint("igemm") == base


PTXAS_LOG = """ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 'conv_wgrad' for 'sm_90'
ptxas info    : Function properties for conv_wgrad
    24 bytes stack frame, 8 bytes spill stores, 12 bytes spill loads
ptxas info    : Used 255 registers, used 1 barriers, 1024 bytes smem, 400 bytes cmem[0]
ptxas info    : Compiling entry function 'conv_wgrad_reduce' for 'sm_90'
ptxas info    : Function properties for conv_wgrad_reduce
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 29 registers, used 0 barriers, 384 bytes cmem[0]
"""


def test_ptxas_report_parsing():
    reports = parse_ptxas_report(PTXAS_LOG)
    assert set(reports) == {"conv_wgrad", "conv_wgrad_reduce"}
    big = reports["conv_wgrad"]
    assert (big.registers, big.stack_bytes, big.spill_stores, big.spill_loads, big.static_shared_bytes,
            big.barriers) == (255, 24, 8, 12, 1024, 1)
    assert big.spills and not reports["conv_wgrad_reduce"].spills
    assert reports["conv_wgrad_reduce"].registers == 29


@needs_nvcc
def test_compile_error_carries_the_log_and_config(tmp_path):
    compiler = NvccCompiler("sm_90", cache_dir=tmp_path)
    with pytest.raises(CompileError) as err:
        compiler.compile('extern "C" __global__ void k() { undeclared_name = 1; }', config={"X": 1})
    assert "undeclared_name" in err.value.log
    assert err.value.config == {"X": 1}
    assert err.value.failure_class.value == "compile_error"


def _compile_jobs(arch, rng, thorough):
    """The plans to build: with ``thorough``, every seed shape's default and two samples, every odd
    shape's default and one, and one config of each formulation on each shape; otherwise each
    operation's first seed and first odd shape's defaults and one config of each formulation on the
    first shape that it serves. Each offered formulation is built at least once either way (one that
    serves one precision only, on a seed shape in tf32 too). Returns the jobs, how many default and
    sampled configs they hold, and the formulations offered and served per operation."""
    limits = DeviceLimits.for_arch(arch)
    jobs, expected = [], 0
    offered = {op: set() for op in OPERATIONS}
    served = {op: set() for op in OPERATIONS}
    for op in sorted(OPERATIONS):
        # The grouped odd shapes too: the formulations of channel groups (depthwise) serve only those.
        for shapes, samples in ((seed_problems(op), 2), ([*odd_problems(op), *grouped_odd_problems(op)], 1)):
            for i, (name, problem) in enumerate(shapes):
                operation = operation_for(problem)
                space = operation.space(problem, limits)
                configs = []
                if thorough or i == 0:
                    configs = [operation.default_config(problem, limits), *space.sample(rng, samples if thorough else 0)]
                    expected += 1 + (samples if thorough else 0)
                formulations = space.param("formulation").choices if any(p.name == "formulation" for p in space.params) else ()
                for f in formulations:
                    if f not in (FORMULATION_WGMMA, FORMULATION_HALO, FORMULATION_TMA) or arch == f"sm_{WGMMA_ARCH}":   # Hopper only
                        offered[op].add(f)
                    if not thorough and f in served[op]:
                        continue
                    # None where the formulation cannot serve the shape (winograd: 3x3 stride 1 only).
                    one = space.restrict({"formulation": f}).sample(rng, 1)
                    configs += one
                    served[op].update(c["formulation"] for c in one)
                jobs += [(op, name, c, operation.plan(problem, c)) for c in configs]
        for name, problem in seed_problems(op):
            if not hasattr(problem, "precision") or offered[op] <= served[op]:
                break
            tf32 = dataclasses.replace(problem, precision="tf32")
            operation = operation_for(tf32)
            space = operation.space(tf32, limits)
            for f in sorted(offered[op] - served[op]):
                one = space.restrict({"formulation": f}).sample(rng, 1)
                served[op].update(c["formulation"] for c in one)
                jobs += [(op, name, c, operation.plan(tf32, c)) for c in one]
    return jobs, expected, offered, served


def _build_all(arch, jobs, tmp_path):
    """Failures of building ``jobs`` with nvcc: a compile error, a kernel without a ptxas report, or
    a register count out of range."""
    compiler = NvccCompiler(arch, cache_dir=tmp_path)

    def build(job):
        op, name, config, plan = job
        try:
            module = compiler.compile(plan.source, config=config, arch=plan.compile_arch(arch))
        except CompileError as exc:
            return f"{op} {name} {config}: {exc}"
        missing = [k for k in plan.kernel_names if k not in module.reports]
        if missing:
            return f"{op} {name} {config}: no ptxas report for {missing}"
        for k, rep in module.reports.items():
            if not 0 < rep.registers <= 255:
                return f"{op} {name} {config}: {rep.registers} registers for {k}"
        return None

    with ThreadPoolExecutor(max_workers=max(2, os.cpu_count() or 2)) as pool:
        return [f for f in pool.map(build, jobs) if f]


@needs_nvcc
@pytest.mark.parametrize("arch", ARCHES)
def test_every_formulation_compiles_with_its_ptxas_report(arch, tmp_path):
    """Each operation's defaults on a seed and an odd shape, and a config of every formulation it
    offers, build with nvcc, and ptxas reports every kernel of the plan."""
    jobs, expected, offered, served = _compile_jobs(arch, random.Random(), thorough=False)
    failures = _build_all(arch, jobs, tmp_path)
    assert not failures, "\n".join(failures[:10])
    assert expected == 2 * len(OPERATIONS) and len(jobs) >= expected + sum(map(len, offered.values()))
    assert served == offered, "a formulation served none of its op's seed and odd shapes"


@needs_nvcc
@pytest.mark.slow   # several hundred nvcc builds an architecture
@pytest.mark.parametrize("arch", ARCHES)
def test_sampled_configs_compile_on_every_seed_shape(arch, tmp_path):
    """Every family on every seed shape (the default and two sampled configs) and every odd shape (the
    default and one sample), plus one config of each formulation on each, builds with nvcc, and
    ptxas reports every kernel of the plan."""
    jobs, expected, offered, served = _compile_jobs(arch, random.Random(), thorough=True)
    failures = _build_all(arch, jobs, tmp_path)
    assert not failures, "\n".join(failures[:10])
    assert len(jobs) >= expected >= 3 * (14 * 3 + 3 * 2)
    assert served == offered, "a formulation served none of its op's seed and odd shapes"


def test_config_of_another_operation_cannot_plan():
    p = ConvFwdProblem(N=1, C=1, H=5, W=5, K=1, R=3, S=3)
    limits = DeviceLimits.for_arch("sm_90")
    wgrad_config = OPERATIONS["conv_wgrad"].default_config(p.with_op("conv_wgrad"), limits)
    with pytest.raises(ValueError):
        OPERATIONS["conv_fwd"].plan(p, wgrad_config)


@needs_nvcc
def test_threads_compiling_one_source_into_one_cache_all_succeed(tmp_path):
    """The compile pool's threads share a process id; two writing one source's cache entry must
    not rename each other's temporary file away (a CI run failed so)."""
    from autocnn.kernels import compiler

    barrier = threading.Barrier(4)

    def name_in_thread():
        barrier.wait()   # all four alive at once, so no thread id is reused
        return compiler._private_tmp(tmp_path / "x.json")

    with ThreadPoolExecutor(max_workers=4) as pool:
        names = list(pool.map(lambda _: name_in_thread(), range(4)))
    assert len(set(names)) == 4
    source = 'extern "C" __global__ void k(float* y) { y[threadIdx.x] = 1.f; }'
    nvcc = NvccCompiler("sm_80", cache_dir=tmp_path / "cache")
    with ThreadPoolExecutor(max_workers=4) as pool:
        modules = list(pool.map(lambda _: nvcc.compile(source), range(4)))
    assert all("k" in m.reports for m in modules)
    assert not list((tmp_path / "cache").rglob("*.tmp"))


def test_code_source_of_a_cached_function_is_its_source():
    """A helper wrapped by functools.lru_cache counts by its source, not by the wrapper's repr (which
    holds an address that differs in every process, and so would the fingerprint and the study)."""
    import functools

    from autocnn.kernels.codegen import code_source
    from autocnn.kernels.formulations.fft.fft_kernels import dft_tables

    @functools.lru_cache(maxsize=4)
    def cached(n: int) -> int:
        return n + 1

    assert "return n + 1" in code_source(cached) and " at 0x" not in code_source(cached)
    assert code_source(dft_tables).lstrip().startswith("@functools.lru_cache") and "def dft_tables" in code_source(dft_tables)
