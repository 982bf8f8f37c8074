#!/usr/bin/env python3
"""Digests of rendered kernels: a sample of configs of every formulation of every operation, the
sha256 of each one's CUDA source and its plan digest, kept in tests/data/render_digests.json.

The file guards changes that must not change what is generated (moving modules, renaming helpers,
folding template code): tests/test_render_digests.py renders every case it holds again and
compares. Each case is a problem and a config, both stored whole, so the check depends only on
planning, never on how spaces sample. The sample, for each operation, formulation (each value of
its "formulation" parameter) and precision it serves (every formulation serves fp32 and tf32; the
16-bit precisions, those that do not refuse them: kernels.rules.sixteen_bit_rule): up to three problems of the operation's seed and target
layers and up to three of its odd ones (sizes that divide no tile, plus the few odd shapes below
that the 3x3 stride-1 and large-filter formulations accept), the odd ones with a fused epilogue
where the problem has one; for each problem the formulation's default config where it has one
there, and sampled configs to make up twelve a formulation, operation and precision. The odd side
holds the dense shapes, and for a formulation of channel groups alone (depthwise) the grouped ones
(suite.GROUPED_ODD_SHAPES); a formulation that serves both has a second group,
"<op>/<formulation>/<precision>/grouped", of up to six grouped or dilated shapes.
The formulations that serve NHWC problems have groups of their own
(``<op>/<value>/<precision>/nhwc``) over the suite's NHWC odd shapes, sampled after the others so
that theirs stay what they were.

    python scripts/render_digests.py            # sample and write the file anew
    python scripts/render_digests.py --check    # render the file's cases; exit 1 on any difference

Regenerate only when the generated code is meant to change (a template edit that changes its
output, a new formulation): the diff then shows which cases changed.
"""
from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import random
import sys
from pathlib import Path
from typing import Any, Iterator

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from autocnn.device import DeviceLimits  # noqa: E402
from autocnn.errors import InfeasibleConfigError, InvalidConfigError, InvalidProblemError  # noqa: E402
from autocnn.kernels import OPERATIONS, get_operation, problem_from_dict  # noqa: E402
from autocnn.kernels.problem import PRECISIONS, precision_label  # noqa: E402
from autocnn.kernels.suite import (GROUPED_ODD_SHAPES, nhwc_odd_problems, odd_problems, seed_problems,  # noqa: E402
                                   target_problems)

DIGESTS = Path(__file__).resolve().parent.parent / "tests" / "data" / "render_digests.json"
ARCH = "sm_90"                   # the limits configs are sampled under: every formulation serves it
CONFIGS_PER_GROUP = 12           # configs per (operation, formulation value, precision)
PROBLEMS_PER_SIDE = 3            # seed-side and odd-side problems per group
GROUPED_PROBLEMS = 6             # grouped or dilated problems of a formulation that serves dense ones too
FORMAT = 1

# Odd shapes that the formulations for 3x3 stride-1 layers (winograd, winograd_fused, halo, tma) and
# for filters of 25 taps or more (fft) accept, which the suite's odd shapes do not offer them.
EXTRA_CONV_SHAPES = (
    ("odd_3x3", dict(N=3, C=5, H=13, W=11, K=7, R=3, S=3, stride=(1, 1), padding=(1, 1, 1, 1))),
    ("odd_3x3_wide", dict(N=2, C=12, H=10, W=14, K=20, R=3, S=3, stride=(1, 1), padding=(1, 0, 1, 2))),
    ("odd_5x5", dict(N=2, C=6, H=19, W=17, K=12, R=5, S=5, stride=(1, 1), padding=(2, 2, 2, 2))),
    ("odd_5x5_s2", dict(N=3, C=4, H=21, W=18, K=9, R=5, S=5, stride=(2, 2), padding=(2, 1, 2, 2))),
    # Depthwise, grouped and dilated (appended, so that the dense shapes' epilogues stay what they
    # were; cases() samples them apart from the dense ones).
    *((s.name, dict(s.geometry)) for s in GROUPED_ODD_SHAPES),
)
EPILOGUES = (dict(bias=True, activation="relu"), dict(bias=True, activation="tanh"),
             dict(bias=False, activation="logistic"))


def _seeded(*parts: str) -> random.Random:
    return random.Random(int.from_bytes(hashlib.sha256("/".join(parts).encode()).digest()[:8], "big"))


def _with_precision(problem: Any, precision: str | None) -> Any | None:
    if precision is None:
        return problem
    try:
        return dataclasses.replace(problem, precision=precision)
    except InvalidProblemError:
        return None


def _with_epilogue(problem: Any, i: int) -> Any:
    """An odd problem with a fused epilogue (bias, activation) where its type has one."""
    fields = {f.name for f in dataclasses.fields(problem)}
    change = {k: v for k, v in EPILOGUES[i % len(EPILOGUES)].items() if k in fields}
    if "activation" not in fields and "bias" in fields:
        change = {"bias": i % 2 == 1}   # a weight gradient with and without its bias gradient
    try:
        return dataclasses.replace(problem, **change) if change else problem
    except InvalidProblemError:
        return problem


def _extra_problems(op: str) -> list[tuple[str, Any]]:
    cls = type(seed_problems(op)[0][1]) if seed_problems(op) else None
    if cls is None or not {"R", "S", "K"} <= {f.name for f in dataclasses.fields(cls)}:
        return []
    out = []
    for name, geometry in EXTRA_CONV_SHAPES:
        try:
            out.append((name, cls(**geometry)))
        except (InvalidProblemError, TypeError):
            continue
    return out


def _precisions(op: str) -> list[str | None]:
    """The precisions the operation's problems take, by name; None for the problem as it is, where
    its precision has no name of its own in a listing (pooling in float32: precision_label)."""
    problem = seed_problems(op)[0][1] if seed_problems(op) else odd_problems(op)[0][1]
    if not hasattr(problem, "precision"):
        return [None]
    out: list[str | None] = []
    for precision in PRECISIONS:
        at = _with_precision(problem, precision.name)
        if at is not None:
            out.append(None if precision_label(at) == "-" else precision.name)
    return out


def _sides(op: str) -> tuple[list[tuple[str, Any]], list[tuple[str, Any]]]:
    """The seed-side and odd-side problems the sample draws from, by label."""
    seed_side = [*seed_problems(op), *target_problems(op)]
    odd_side = [(name, _with_epilogue(p, i)) for i, (name, p) in enumerate([*odd_problems(op), *_extra_problems(op)])]
    return seed_side, odd_side


def _served(operation: Any, value: str, precision: str | None, limits: DeviceLimits, space_cache: dict) -> bool:
    """Whether a formulation value serves a precision: every formulation serves the float32 ones; a
    16-bit one, where some problem of the sample has a config of it (the others refuse it by a rule)."""
    problem0 = next(iter(_sides(operation.name)[1] or _sides(operation.name)[0]))[1]
    at = _with_precision(problem0, precision)
    if precision is None or at is None or not at.precision.sixteen_bit:
        return True
    for label, problem in [*_sides(operation.name)[1], *_sides(operation.name)[0]]:
        problem = _with_precision(problem, precision)
        if problem is None:
            continue
        key = json.dumps(problem.to_dict(), sort_keys=True)
        space = space_cache.get(key)
        if space is None:
            space = space_cache[key] = operation.space(problem, limits)
        if "formulation" in {p.name for p in space.params}:
            space = space.restrict({"formulation": value})
        if space.sample(_seeded(operation.name, value, precision, label, "serves"), 1, max_attempts=20):
            return True
    return False


def _sample(operation: Any, value: str, problem: Any, limits: DeviceLimits, count: int, rng: random.Random,
            space_cache: dict) -> list[Any]:
    """The formulation's default (when ``value`` is its first name and it has one) and sampled configs."""
    key = json.dumps(problem.to_dict(), sort_keys=True)
    space = space_cache.get(key)
    if space is None:
        space = space_cache[key] = operation.space(problem, limits)
    if "formulation" in {p.name for p in space.params}:
        space = space.restrict({"formulation": value})
    formulation = operation.formulation(value)
    configs = []
    if value == formulation.names[0]:
        try:
            configs.append(operation.default_config(problem, limits, formulation=formulation.formulation))
        except (InfeasibleConfigError, InvalidConfigError):
            pass
        # A default of another value of the same formulation (conv_wgrad's igemm: atomic or two_pass).
        configs = [c for c in configs if c.get("formulation", value) == value]
    configs += space.sample(rng, count - len(configs), exclude=configs)
    return configs[:count]


def cases(arch: str = ARCH) -> Iterator[tuple[str, Any, dict[str, Any]]]:
    """The sampled cases, without their digests: (problem key, problem, case)."""
    limits = DeviceLimits.for_arch(arch)
    for op in sorted(OPERATIONS):
        operation = get_operation(op)
        seed_side, odd_side = _sides(op)
        space_cache: dict = {}
        for value in operation.formulation_names:
            for precision in _precisions(op):
                if not _served(operation, value, precision, limits, space_cache):
                    continue
                group = f"{op}/{value}/{precision or '-'}"
                chosen, grouped = [], []
                for side in (seed_side, odd_side):
                    feasible = []
                    for label, problem in side:
                        problem = _with_precision(problem, precision)
                        if problem is None:
                            continue
                        probe = _sample(operation, value, problem, limits, 1, _seeded(group, label, "probe"), space_cache)
                        if probe:
                            feasible.append((label, problem))
                    if side is odd_side:
                        dense = [(label, problem) for label, problem in feasible if not _grouped(problem)]
                        grouped = [(label, problem) for label, problem in feasible if _grouped(problem)] if dense else []
                        feasible = dense or feasible   # a formulation of channel groups alone: the grouped shapes
                    chosen += _spread(feasible, PROBLEMS_PER_SIDE)
                yield from _group_cases(operation, group, value, precision, chosen, limits, space_cache)
                if grouped:
                    yield from _group_cases(operation, f"{group}/grouped", value, precision,
                                            _spread(grouped, GROUPED_PROBLEMS), limits, space_cache)

    yield from _nhwc_cases(limits)


def _grouped(problem: Any) -> bool:
    return getattr(problem, "grouped_or_dilated", False)


def _spread(feasible: list, k: int) -> list:
    """Up to k of the problems a formulation serves, spread over them, first and last included."""
    k = min(k, len(feasible))
    return [feasible[round(i * (len(feasible) - 1) / (k - 1))] if k > 1 else feasible[0] for i in range(k)]


def _group_cases(operation: Any, group: str, value: str, precision: str | None, chosen: list, limits: DeviceLimits,
                 space_cache: dict) -> Iterator[tuple[str, Any, dict[str, Any]]]:
    """CONFIGS_PER_GROUP configs of one group, spread over its chosen problems."""
    for i, (label, problem) in enumerate(chosen):
        count = CONFIGS_PER_GROUP // len(chosen) + (i < CONFIGS_PER_GROUP % len(chosen))
        key = f"{operation.name}/{label}/{precision or '-'}"
        for config in _sample(operation, value, problem, limits, count, _seeded(group, label), space_cache):
            yield key, problem, {"group": group, "problem": key, "config": config.as_dict()}


def _nhwc_served(operation: Any, value: str, precision: str | None, limits: DeviceLimits) -> list[tuple[str, Any]]:
    """The suite's NHWC odd problems of the operation at the precision that the formulation value serves."""
    out = []
    for label, problem in nhwc_odd_problems(operation.name):
        problem = _with_precision(problem, precision)
        if problem is not None and value not in operation.refusals(problem, limits):
            out.append((label, problem))
    return out


def _nhwc_cases(limits: DeviceLimits) -> Iterator[tuple[str, Any, dict[str, Any]]]:
    """The NHWC groups' cases: twelve configs a formulation value, operation and precision, spread
    over the NHWC problems it serves."""
    for op in sorted(OPERATIONS):
        operation, space_cache = get_operation(op), {}
        for value in operation.formulation_names:
            for precision in _precisions(op):
                chosen = _nhwc_served(operation, value, precision, limits)
                group = f"{op}/{value}/{precision or '-'}/nhwc"
                yield from _group_cases(operation, group, value, precision, chosen, limits, space_cache)


def render(problem_dict: dict[str, Any], config: dict[str, Any], limits: DeviceLimits,
           spaces: dict | None = None) -> dict[str, str]:
    """The sha256 of a config's source and its plan digest; the config is validated against the space first."""
    operation = get_operation(problem_dict["op"])
    problem = problem_from_dict(problem_dict)
    key = json.dumps(problem_dict, sort_keys=True)
    space = None if spaces is None else spaces.get(key)
    if space is None:
        space = operation.space(problem, limits)
        if spaces is not None:
            spaces[key] = space
    plan = operation.plan(problem, space.validate(config))
    return {"source_sha256": hashlib.sha256(plan.source.encode()).hexdigest(), "plan_digest": plan.code_digest}


def generate(arch: str = ARCH) -> dict[str, Any]:
    """The document: the sampled problems by key, and each case with its digests."""
    limits = DeviceLimits.for_arch(arch)
    spaces: dict = {}
    problems: dict[str, Any] = {}
    out = []
    for key, problem, case in cases(arch):
        problems[key] = problem.to_dict()
        out.append({**case, **render(problems[key], case["config"], limits, spaces)})
    return {"format": FORMAT, "arch": arch, "problems": problems, "cases": out}


def document_text(document: dict[str, Any]) -> str:
    """The document, a problem and a case a line, so that a diff shows the cases that changed."""
    problems = ",\n".join(f"{json.dumps(k)}: {json.dumps(v, sort_keys=True)}" for k, v in document["problems"].items())
    cases_ = ",\n".join(json.dumps(case, sort_keys=True) for case in document["cases"])
    return (f'{{"format": {document["format"]}, "arch": {json.dumps(document["arch"])},\n'
            f'"problems": {{\n{problems}\n}},\n"cases": [\n{cases_}\n]}}\n')


def groups_registered(arch: str = ARCH) -> set[str]:
    """Every (operation, formulation value, precision) group the sample must cover: each formulation
    at each precision it serves."""
    limits = DeviceLimits.for_arch(arch)
    out = set()
    for op in OPERATIONS:
        operation, space_cache = get_operation(op), {}
        for value in operation.formulation_names:
            for precision in _precisions(op):
                if _served(operation, value, precision, limits, space_cache):
                    group = f"{op}/{value}/{precision or '-'}"
                    out |= {group, f"{group}/grouped"} if _serves_dense_and_grouped(operation, value) else {group}
        out |= {f"{op}/{value}/{precision or '-'}/nhwc" for value in operation.formulation_names
                for precision in _precisions(op) if _nhwc_served(operation, value, precision, limits)}
    return out


def _serves_dense_and_grouped(operation: Any, value: str) -> bool:
    """Whether a formulation takes the odd dense shapes and some grouped or dilated ones (its own
    rule, grouping_refusal, says; depthwise takes the grouped ones alone)."""
    formulation = operation.formulation(value)
    seed_side, odd_side = _sides(operation.name)
    dense = [p for _, p in [*seed_side, *odd_side] if not _grouped(p)]
    grouped = [p for _, p in odd_side if _grouped(p)]
    return bool(dense and grouped) and formulation.grouping_refusal(dense[0]) is None and any(
        formulation.grouping_refusal(p) is None for p in grouped)


def differences(document: dict[str, Any]) -> list[str]:
    """What renders differently from the document's digests, and which groups it lacks."""
    if document.get("format") != FORMAT:
        return [f"format {document.get('format')} is not {FORMAT}: run scripts/render_digests.py"]
    limits = DeviceLimits.for_arch(document["arch"])
    spaces: dict = {}
    out = []
    for case in document["cases"]:
        what = f"{case['group']} {case['problem']} {case['config']}"
        try:
            now = render(document["problems"][case["problem"]], case["config"], limits, spaces)
        except Exception as exc:   # noqa: BLE001  a case that no longer plans is a difference too
            out.append(f"{what}: {type(exc).__name__}: {exc}")
            continue
        if now["plan_digest"] != case["plan_digest"]:
            out.append(f"{what}: plan digest {case['plan_digest']} -> {now['plan_digest']}")
        elif now["source_sha256"] != case["source_sha256"]:
            out.append(f"{what}: source changed in its header lines only (config text or fingerprint)")
    covered = {case["group"] for case in document["cases"]}
    out += [f"{group}: no case (a new formulation? run scripts/render_digests.py)"
            for group in sorted(groups_registered() - covered)]
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="render the file's cases; exit 1 on any difference")
    ap.add_argument("--file", type=Path, default=DIGESTS)
    args = ap.parse_args(argv)
    if args.check:
        document = json.loads(args.file.read_text())
        diffs = differences(document)
        for line in diffs:
            print(line)
        print(f"{len(document['cases'])} cases, {len(diffs)} differences")
        return 1 if diffs else 0
    document = generate()
    args.file.write_text(document_text(document))
    groups = {case["group"] for case in document["cases"]}
    print(f"{args.file}: {len(document['cases'])} cases of {len(document['problems'])} problems in {len(groups)} groups")
    missing = groups_registered() - groups
    if missing:
        print("groups with no feasible problem in the sample: " + ", ".join(sorted(missing)))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
