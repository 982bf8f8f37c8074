"""The separable kernels on the GPU (-m gpu): every formulation of every operation verified against
float64 (measurement.measure.check_candidate: fresh inputs, poisoned outputs, every element within the
problem's bound, a second check after repeated runs) on the seed's 64 -> 64 maps at filter sizes
3, 5, 7, 9 and 11, ranks 1 and 2, and on odd shapes; the two-pass blocks of images, the weight
gradient's splits and combines, tf32 problems, and the ordered combine's determinism."""
from __future__ import annotations

import random

import pytest

import autocnn.kernels.sep_conv as sep
from autocnn.device import DEFAULT_WORKSPACE_BYTES
from autocnn.kernels import get_operation, reference

pytestmark = pytest.mark.gpu

OPERATIONS = {op: get_operation(op) for op in sep.SEP_OPS}
FORMULATIONS = [("sep_conv_fwd", "sep_register"), ("sep_conv_fwd", "sep_onepass"), ("sep_conv_fwd", "sep_twopass"),
                ("sep_conv_bwd_data", "sep_register"), ("sep_conv_bwd_data", "sep_onepass"),
                ("sep_conv_bwd_data", "sep_twopass"), ("sep_conv_wgrad", "sep_tiles")]
# The seed's maps (64 -> 64 of 32x32) with a batch small enough that the float64 reference of 60
# cases stays quick.
SEED_BATCH = 16


@pytest.fixture(scope="module")
def gpu():
    pytest.importorskip("cupy")
    from autocnn.device import current_device
    from autocnn.kernels.runtime import KernelLoader

    return current_device(0).limits(), KernelLoader()


def configs(op: str, name: str, problem, limits, rng: random.Random, samples: int) -> list:
    """The formulation's default candidates that fit (first and last) and sampled configs."""
    operation = OPERATIONS[op]
    space = operation.space(problem, limits)
    if "formulation" in {p.name for p in space.params}:
        space = space.restrict({"formulation": name})
    fitting = list(operation.default_configs(problem, limits, formulation=name))
    picked = [fitting[0], fitting[-1]] if len(fitting) > 1 else fitting
    return picked + space.sample(rng, samples, exclude=picked)


def verify(op: str, problem, config, gpu) -> str | None:
    from autocnn.measurement.measure import check_candidate

    limits, loader = gpu
    plan = OPERATIONS[op].plan(problem, config)
    if plan.workspace_bytes > limits.workspace_bytes:
        return f"{problem.shape_string()} {config}: {plan.workspace_bytes} bytes of workspace"
    check = check_candidate(loader.load(plan), problem, time_it=True, budget_s=0.02)
    if not check.verification.passed:
        return f"{problem.shape_string()} {config}: {check.verification.message}"
    return None


def run_cases(op: str, name: str, problems, gpu, samples: int) -> None:
    limits, _ = gpu
    rng = random.Random()
    failures, checked = [], 0
    for label, problem in problems:
        if not OPERATIONS[op].candidates(problem, name):
            continue      # the two-pass workspace of one image exceeds the limit: no config
        for config in configs(op, name, problem, limits, rng, samples):
            checked += 1
            why = verify(op, problem, config, gpu)
            if why:
                failures.append(f"{label}: {why}")
    assert checked >= len(problems), f"only {checked} configs ran"
    assert not failures, f"{len(failures)} of {checked} failed:\n" + "\n".join(failures[:8])


@pytest.mark.parametrize("op,name", FORMULATIONS)
def test_each_formulation_verifies_on_the_seed_maps(op, name, gpu):
    """64 -> 64 maps, filter sizes 3-11, ranks 1 and 2: defaults and a sampled config each."""
    run_cases(op, name, sep.seed_problems(op, N=SEED_BATCH), gpu, samples=1)


@pytest.mark.parametrize("op,name", FORMULATIONS)
def test_each_formulation_verifies_on_odd_shapes(op, name, gpu):
    """N = 1 and 3, odd maps, asymmetric padding, C and K multiples of nothing, ranks up to 3."""
    run_cases(op, name, sep.odd_problems(op), gpu, samples=3)


def verify_variants(op: str, problem, base: dict, variants: list[dict], gpu) -> None:
    """``base`` with each of ``variants`` over it, each verified."""
    space = OPERATIONS[op].space(problem, gpu[0])
    failures = [verify(op, problem, space.validate({**base, **v}), gpu) for v in variants]
    assert not [f for f in failures if f], failures


@pytest.mark.parametrize("op", ("sep_conv_fwd", "sep_conv_bwd_data"))
def test_twopass_blocks_of_images_verify(op, gpu):
    problem = sep.PROBLEM_TYPES[op](N=5, C=9, H=21, W=19, K=11, R=7, S=5, padding=(3, 2, 3, 2), rank=2)
    default = OPERATIONS[op].default_config(problem, gpu[0], formulation="sep_twopass").as_dict()
    verify_variants(op, problem, default, [{"NB": nb} for nb in (1, 2, 4, 8)], gpu)


WGRAD_BASE = {"KB": 4, "CB": 4, "TP": 8, "TQ": 16, "RSPLIT": 2, "PAD": 1, "UNROLL_ROWS": 1}


def test_wgrad_splits_and_combines_verify(gpu):
    op = "sep_conv_wgrad"
    problem = dict(sep.seed_problems(op, N=SEED_BATCH))["sep64_5x5_r2"]
    verify_variants(op, problem, WGRAD_BASE, [{"SPLIT": s, "COMBINE": c} for s, c in
                                              ((1, "atomic"), (16, "atomic"), (2, "ordered"), (64, "ordered"))], gpu)


def test_ordered_combine_is_deterministic(gpu):
    import cupy as cp

    from autocnn.measurement.measure import random_inputs

    limits, loader = gpu
    op = "sep_conv_wgrad"
    problem = dict(sep.seed_problems(op, N=SEED_BATCH))["sep64_3x3_r1"]
    space = OPERATIONS[op].space(problem, limits)
    config = space.validate({**WGRAD_BASE, "SPLIT": 32, "COMBINE": "ordered"})
    loaded = loader.load(OPERATIONS[op].plan(problem, config))
    inputs = random_inputs(problem, cp, seed=7)
    results = []
    for _ in range(3):
        outputs = {n: cp.full(s, cp.nan, dtype=cp.float32)
                   for n, s in reference.output_shapes(problem).items()}
        loaded({**inputs, **outputs, **loaded.workspaces()})
        results.append({n: cp.asnumpy(a) for n, a in outputs.items()})
    for other in results[1:]:
        for name in results[0]:
            assert (other[name] == results[0][name]).all(), name


@pytest.mark.parametrize("op", tuple(OPERATIONS))
def test_tf32_problems_verify_with_the_same_kernels(op, gpu):
    limits, _ = gpu
    seed = dict(sep.seed_problems(op, N=SEED_BATCH))["sep64_7x7_r2"]
    problem = sep.PROBLEM_TYPES[op](**{**seed.geometry(), "precision": "tf32"}, rank=seed.rank)
    assert verify(op, problem, OPERATIONS[op].default_config(problem, limits), gpu) is None


@pytest.mark.parametrize("op", tuple(OPERATIONS))
def test_defaults_of_the_full_seed_batch_verify(op, gpu):
    """The seed's batch of 128 images: the lookup's default of each filter size, rank 1 and 2."""
    limits, _ = gpu
    failures = [verify(op, p, OPERATIONS[op].default_config(p, limits), gpu) for _, p in sep.seed_problems(op)]
    assert not [f for f in failures if f], failures
    assert all(OPERATIONS[op].plan(p, OPERATIONS[op].default_config(p, limits)).workspace_bytes <= DEFAULT_WORKSPACE_BYTES
               for _, p in sep.seed_problems(op))
