"""The tma formulation (formulations/tma/): conv_bwd_data (stride 1) on wgmma, its tiles copied by
the Tensor Memory Accelerator. CPU: its rules, its tensor maps' geometry (checked against a NumPy
model of the im2col traversal that gives the implicit GEMM's A rows), every config built for sm_90a
without spills. GPU (-m gpu): every config verified against float64 on modern_56's layer and on
shapes that divide nothing evenly."""
from __future__ import annotations

import dataclasses
import itertools

import numpy as np
import pytest

from autocnn.device import DeviceLimits
from autocnn.errors import InfeasibleConfigError, InvalidConfigError
from autocnn.kernels import OPERATIONS
from autocnn.kernels.compiler import NvccCompiler, nvcc_path
from autocnn.kernels.formulations.tma import FORMULATION_TMA, im2col_window, register_cap, tensor_maps
from autocnn.kernels.problem import ConvBwdDataProblem
from autocnn.kernels.suite import seed_problems
from autocnn.kernels.tensor_maps import TensorMap
from tests.formulation_checks import BUILDS, assert_every_config_verifies, build_sample, target_build_failures

BWD = OPERATIONS["conv_bwd_data"]
HOPPER = DeviceLimits.for_arch("sm_90")
AMPERE = DeviceLimits.for_arch("sm_80")
needs_nvcc = pytest.mark.skipif(nvcc_path() is None, reason="nvcc is not installed")

# Stride 1, nothing even: 13 and 70 input channels (ragged column blocks), K = 20 and 36 (a reduction
# tile past K, zero-filled), a 3x5 filter with asymmetric padding, a 2x2 filter without padding, a
# 1x1 layer, batches of 1, 2, 3 and 7 (a block's rows run into the next image and past the last).
ODD = (("odd_tma_a", ConvBwdDataProblem(N=3, C=13, H=13, W=11, K=20, R=3, S=5, padding=(1, 2, 0, 1))),
       ("odd_tma_b", ConvBwdDataProblem(N=2, C=70, H=9, W=7, K=36, R=1, S=1)),
       ("odd_tma_c", ConvBwdDataProblem(N=1, C=9, H=17, W=14, K=8, R=2, S=2)),
       ("odd_tma_cross", ConvBwdDataProblem(N=7, C=70, H=23, W=19, K=24, R=3, S=3, padding=(1, 2, 0, 1))))


def _problems(precision):
    seed = dict(seed_problems("conv_bwd_data"))
    return [("modern_56", dataclasses.replace(seed["modern_56"], N=4, precision=precision)),
            *((n, dataclasses.replace(p, precision=precision)) for n, p in ODD)]


def _space(problem, limits=HOPPER):
    return BWD.space(problem, limits).restrict({"formulation": FORMULATION_TMA})


def _configs(problem, widths=(16, 64, 128), depths=(2, 4), tilings=("halo", "im2col"), groups=(1,)):
    """Every feasible config of the widths, depths and dY tilings given (halo: one and two slots;
    im2col: the wgmma formulation's staging in one launch, and by blocks of pixels), either loop
    (INFLIGHT 0 with each of the GROUP_TILES given), CROSS both ways."""
    space, out = _space(problem), []
    crosses = (0, 1) if problem.precision == "fp32" else (None,)
    # (tiling, halo slots, staging's pixels a block, PDL): each tiling with both kinds of staging
    # block, and the GEMM a programmatic dependent launch after each kind
    tiles = [t for t in (("halo", 1, 128, 0), ("halo", 2, 64, 1), ("im2col", None, 0, 1), ("im2col", None, 128, 0))
             if t[0] in tilings]
    loops = [(0, group) for group in groups] + [(1, None)]
    for wgs, wbn, stages, (inflight, group), (a_tiles, slots, pixels, pdl), cross in itertools.product(
            (1, 2, 4), widths, depths, loops, tiles, crosses):
        config = {"formulation": FORMULATION_TMA, "WGS": wgs, "WBN": wbn, "WSTAGES": stages, "INFLIGHT": inflight,
                  "A_TILES": a_tiles, "STAGE_PIXELS": pixels, "STAGE_LAUNCHES": 1, "STAGE_PLANES": 0, "PDL": pdl,
                  **({"ASLOTS": slots} if slots else {}), **({"GROUP_TILES": group} if group else {})}
        if cross is not None:
            config["CROSS"] = cross
        try:
            out.append(space.validate(config))
        except InfeasibleConfigError:
            pass
    return out


def test_tma_serves_stride_1_backward_data_on_hopper_only():
    problem = _problems("fp32")[0][1]
    assert FORMULATION_TMA in BWD.space(problem, HOPPER).param("formulation").choices
    config = BWD.default_config(problem, HOPPER, formulation=FORMULATION_TMA)
    assert config["formulation"] == FORMULATION_TMA and config["CROSS"] == 1
    with pytest.raises(InfeasibleConfigError, match="sm_90"):
        BWD.space(problem, AMPERE).validate(config)
    strided = dataclasses.replace(problem, stride=(2, 1))
    with pytest.raises(InfeasibleConfigError, match="stride 1 only"):
        BWD.space(strided, HOPPER).validate(config)
    # fp32 in flight runs the tiles in pairs (with a halo, within a chunk: one slot serves); the pair's
    # accumulators limit WBN
    tile_loop = {k: v for k, v in config.as_dict().items() if k != "GROUP_TILES"}   # INFLIGHT 0's parameter
    paired = _space(problem).validate({**tile_loop, "INFLIGHT": 1})
    assert (paired["INFLIGHT"], paired["WGS"], paired["WBN"], paired["ASLOTS"]) == (1, 2, 64, 1)
    with pytest.raises(InfeasibleConfigError, match="96 registers a thread with WBN=64: at most 48 with WGS=4"):
        _space(problem).validate({**paired.as_dict(), "WGS": 4})
    with pytest.raises(InfeasibleConfigError, match="CROSS=1"):
        _space(dataclasses.replace(problem, K=20)).validate(config)
    tf32 = dataclasses.replace(problem, precision="tf32")
    with pytest.raises(InvalidConfigError, match="CROSS"):
        _space(tf32).validate(config)
    halo = {k: v for k, v in tile_loop.items() if k != "CROSS"}
    assert halo["A_TILES"] == "halo" and halo["ASLOTS"] == 1
    with pytest.raises(InfeasibleConfigError, match="ASLOTS=2"):   # a deadlock: see the rule
        _space(tf32).validate({**halo, "INFLIGHT": 1, "WSTAGES": 3})
    assert _space(tf32).validate({**halo, "INFLIGHT": 1, "WSTAGES": 3, "ASLOTS": 2})["ASLOTS"] == 2
    # INFLIGHT 0 may issue up to 3 tiles' wgmmas as one group, which holds as many stages
    assert config["GROUP_TILES"] == 1
    assert _space(problem).validate({**config.as_dict(), "GROUP_TILES": 3})["GROUP_TILES"] == 3
    with pytest.raises(InfeasibleConfigError, match="GROUP_TILES=3 holds 3 stages"):
        _space(problem).validate({**config.as_dict(), "GROUP_TILES": 3, "WSTAGES": 2})
    with pytest.raises(InvalidConfigError, match="GROUP_TILES"):
        _space(problem).validate({**config.as_dict(), "INFLIGHT": 1})


def test_the_gemm_launch_carries_its_tensor_maps_and_a_producer_warp():
    problem = _problems("fp32")[0][1]
    config = _space(problem).validate({"formulation": FORMULATION_TMA, "WGS": 2, "WBN": 64, "WSTAGES": 4,
                                       "INFLIGHT": 0, "A_TILES": "im2col", "STAGE_PIXELS": 0, "STAGE_LAUNCHES": 1, "STAGE_PLANES": 0,
                                       "CROSS": 1, "PDL": 0, "GROUP_TILES": 1})
    plan = BWD.plan(problem, config)
    *staging, main = plan.launches
    assert [l.kernel for l in staging] == ["conv_bwd_data_stage"]
    assert main.block == (288, 1, 1) and main.args == ("dx",)
    assert main.grid == (-(-4 * 56 * 56 // 128), 1, 1)
    a, b, a_small, b_small = main.tensor_maps
    assert a == TensorMap("dyt", 0, (64, 56, 56, 4), (32, 128), (-1, -1), (-1, -1))
    assert b == TensorMap("wt", 0, (64, 9, 64), (32, 1, 64))
    assert (a_small.offset, b_small.offset) == (4 * 56 * 56 * 64, 64 * 9 * 64)
    assert sum(s.box_bytes for s in main.tensor_maps) == 4 * 2 * (128 + 64) * 32
    halo = BWD.plan(problem, _space(problem).validate({**config.as_dict(), "A_TILES": "halo", "ASLOTS": 1,
                                                        "STAGE_PIXELS": 128}))
    stage, main = halo.launches
    # W's gather, 2 x 25 blocks of 128 pixels for each of 4 images, a block an image for the grid's border
    assert stage.grid == (-(-64 * 64 * 9 // 256) + 4 * 2 * 25 + 4, 1, 1)
    assert main.tensor_maps[0] == TensorMap("dyt", 0, (64, 4 * 58 * 58), (32, 248))   # 128 + 2 * 58 + 2 rows
    assert dict(halo.workspaces)["dyt"] == 2 * 4 * 58 * 58 * 64
    with pytest.raises(InfeasibleConfigError, match="STAGE_PIXELS > 0"):
        _space(problem).validate({**config.as_dict(), "A_TILES": "halo", "ASLOTS": 1})
    # the maps are part of what the digest describes
    other = BWD.plan(problem, _space(problem).validate({**config.as_dict(), "WGS": 1}))
    assert other.code_digest != plan.code_digest
    # PDL: the GEMM alone a programmatic dependent launch, which the digest describes too
    early = BWD.plan(problem, _space(problem).validate({**config.as_dict(), "PDL": 1}))
    assert [l.programmatic for l in early.launches] == [False, True] and not any(l.programmatic for l in plan.launches)
    assert early.launches == (plan.launches[0], dataclasses.replace(plan.launches[1], programmatic=True))
    assert early.code_digest != plan.code_digest and "griddepcontrol.wait" in early.source
    assert "griddepcontrol" not in plan.source


def _im2col_rows(spec: TensorMap, data: np.ndarray, start: tuple[int, int, int], offsets: tuple[int, int],
                 c0: int) -> np.ndarray:
    """What an im2col request lands, by the traversal's definition: ``pixels`` window starts from
    ``start`` = (w, h, n), W fastest within the bounding box [lower, dim - 1 + upper], then H, then
    images; each row the box's channels from c0 at start + offsets, zero outside the tensor."""
    channels, pixels = spec.box
    cdim, wdim, hdim, ndim = spec.dims
    (lw, lh), (uw, uh) = spec.lower, spec.upper
    w, h, n = start
    rows = np.zeros((pixels, channels))
    for r in range(pixels):
        x, y = w + offsets[0], h + offsets[1]
        if n < ndim and 0 <= x < wdim and 0 <= y < hdim:
            take = data[n, y, x, c0:c0 + channels]
            rows[r, :len(take)] = take
        w += 1
        if w > wdim - 1 + uw:
            w, h = lw, h + 1
            if h > hdim - 1 + uh:
                h, n = lh, n + 1
    return rows


@pytest.mark.parametrize("name,problem", _problems("tf32"), ids=[n for n, _ in _problems("tf32")])
def test_the_im2col_boxes_are_the_implicit_gemm_rows(name, problem):
    """The maps' corners and the kernel's request coordinates (window start = output position less
    (DH, DW), offsets (j, i) for W's tap (R-1-i, S-1-j)) give, in the traversal's model, exactly the
    rows of the backward-data GEMM: A[m][(tap, k)] = dY[n][k][h + PT - r][w + PL - s]."""
    p = problem
    rng = np.random.default_rng(3)
    dy = rng.standard_normal((p.N, p.K, p.P, p.Q))
    nhwc = dy.transpose(0, 2, 3, 1)
    dh, dw = im2col_window(p)
    a_map = tensor_maps(p, 1, 16, "im2col")[0]
    bm = a_map.box[1]
    gm = p.N * p.H * p.W
    for m0 in sorted({0, bm, gm - 1 - (gm - 1) % bm}):
        n, rem = divmod(m0, p.H * p.W)
        start = (rem % p.W - dw, rem // p.W - dh, n)
        for i, j in itertools.product(range(p.R), range(p.S)):
            r, s = p.R - 1 - i, p.S - 1 - j
            got = _im2col_rows(a_map, nhwc, start, (j, i), 0)
            want = np.zeros_like(got)
            for row in range(bm):
                m = m0 + row
                if m >= gm:
                    continue
                nn, rr = divmod(m, p.H * p.W)
                y, x = rr // p.W + p.padding[0] - r, rr % p.W + p.padding[1] - s
                if 0 <= y < p.P and 0 <= x < p.Q:
                    want[row, :min(32, p.K)] = dy[nn, :min(32, p.K), y, x]
            np.testing.assert_array_equal(got, want, err_msg=f"{name} rows {m0}.., tap ({r}, {s})")


def test_tensor_map_problems_name_what_the_driver_refuses():
    assert TensorMap("wt", 0, (64, 9, 64), (32, 1, 64)).problems() == []
    assert any("16-byte" in m for m in TensorMap("dyt", 2, (64, 9, 64), (32, 1, 64)).problems())
    assert any("multiple of 16" in m for m in TensorMap("dyt", 0, (6, 9, 64), (32, 1, 64)).problems())
    assert any("corner" in m for m in TensorMap("dyt", 0, (8, 9, 9, 1), (32, 64), (-200, 0), (0, 0)).problems())
    assert any("swizzle" in m for m in TensorMap("dyt", 0, (64, 9, 64), (64, 1, 64)).problems())


def _consumer_steps(ntiles: int, taps: int, schedule: str, group: int = 2) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
    """The consumers' steps (tiles waited for, tiles then released) of tma_conv_bwd_data.cu.j2: a
    tile at a time (INFLIGHT 0); a tile's release after the next one's wgmmas were issued (tf32
    INFLIGHT); pairs (fp32 INFLIGHT, im2col); pairs within a chunk (fp32 INFLIGHT, halo); groups of
    up to `group` tiles (INFLIGHT 0 with GROUP_TILES, im2col), within a chunk (halo)."""
    if schedule == "one":
        return [((kt,), (kt,)) for kt in range(ntiles)]
    if schedule == "in_flight":
        return [((kt,), (kt - 1,) if kt else ()) for kt in range(ntiles)]
    size = 2 if schedule in ("pairs", "chunk_pairs") else group
    steps, kt = [], 0
    while kt < ntiles:
        last = min(kt + size, ntiles if schedule in ("pairs", "groups") else (kt // taps + 1) * taps)
        tiles = tuple(range(kt, last))
        steps.append((tiles, tiles))
        kt = last
    return steps


def _hand_over_finishes(ntiles: int, taps: int, stages: int, aslots: int, halo: bool, schedule: str,
                        group: int = 2) -> bool:
    """A model of the GEMM kernel's hand-over. The producer fills tile kt once tile kt - STAGES
    (its stage's last) is released and, halo, at a chunk's first tap, the last tile of chunk -
    ASLOTS (its slot's last halo); the consumers take _consumer_steps. True when every step ran;
    False where neither side can go on: a deadlock."""
    steps = _consumer_steps(ntiles, taps, schedule, group)
    filled, released, step = 0, set(), 0
    while step < len(steps):
        waits, releases = steps[step]
        if all(kt < filled for kt in waits):
            released.update(releases)
            step += 1
            continue
        kt, chunk = filled, filled // taps
        stage_free = kt < stages or kt - stages in released
        slot_free = not halo or kt % taps or chunk < aslots or (chunk - aslots + 1) * taps - 1 in released
        if not (kt < ntiles and stage_free and slot_free):
            return False
        filled += 1
    return True


@pytest.mark.parametrize("taps", (1, 4, 9, 25))
def test_the_hand_over_finishes_wherever_the_rules_let_a_config_run(taps):
    """The kernel's schedule of each config the rules allow finishes, for any number of chunks and
    stages. The rules are needed: with one halo slot, tf32's tile in flight always deadlocks, and so
    would fp32's pairs wherever one straddled a chunk's end (R * S odd), which is why a halo's pairs
    stay within a chunk."""
    for stages, aslots, halo, chunks in itertools.product((2, 3, 4), (1, 2), (False, True), (1, 2, 3, 5)):
        ntiles = taps * chunks
        assert _hand_over_finishes(ntiles, taps, stages, aslots, halo, "one")
        assert _hand_over_finishes(ntiles, taps, stages, aslots, halo, "chunk_pairs" if halo else "pairs")
        tf32 = _hand_over_finishes(ntiles, taps, stages, aslots, halo, "in_flight")
        assert tf32 == (not halo or aslots == 2 or chunks == 1), (stages, aslots, halo, chunks)
        if halo and aslots == 1 and chunks > 1:
            assert _hand_over_finishes(ntiles, taps, stages, aslots, halo, "pairs") == (taps % 2 == 0)
        # GROUP_TILES: a group holds a stage a tile until it completed, so WSTAGES >= GROUP_TILES
        # (the rule) lets it finish; fewer stages than the tiles a group actually takes deadlock
        for group in (2, 3):
            finishes = _hand_over_finishes(ntiles, taps, stages, aslots, halo, "chunk_groups" if halo else "groups",
                                           group)
            assert finishes == (stages >= min(group, taps if halo else ntiles)), (stages, aslots, halo, chunks, group)
    assert _consumer_steps(18, 9, "chunk_pairs")[:5] == [((k, k + 1), (k, k + 1)) for k in (0, 2, 4, 6)] + [((8,), (8,))]
    assert [tiles for tiles, _ in _consumer_steps(11, 4, "chunk_groups", 3)] == [
        (0, 1, 2), (3,), (4, 5, 6), (7,), (8, 9, 10)]
    assert [tiles for tiles, _ in _consumer_steps(11, 4, "groups", 3)] == [(0, 1, 2), (3, 4, 5), (6, 7, 8), (9, 10)]
    # the rules that make those schedules: tf32's halo in flight needs two slots, fp32's pairs one
    bwd = _problems("fp32")[0][1]
    for precision in ("fp32", "tf32"):
        problem = dataclasses.replace(bwd, precision=precision)
        default = BWD.default_config(problem, HOPPER, formulation=FORMULATION_TMA).as_dict()
        config = {**{k: v for k, v in default.items() if k != "GROUP_TILES"}, "INFLIGHT": 1, "A_TILES": "halo",
                  "ASLOTS": 1}
        if precision == "tf32":
            with pytest.raises(InfeasibleConfigError, match="ASLOTS=2"):
                _space(problem).validate(config)
        else:
            assert _space(problem).validate(config)["ASLOTS"] == 1
        assert _space(problem).validate({**config, "ASLOTS": 2})["INFLIGHT"] == 1


@needs_nvcc
@pytest.mark.parametrize("builds", BUILDS)
def test_every_tma_config_builds_for_sm90a_without_spills(tmp_path, builds):
    compiler = NvccCompiler("sm_90", cache_dir=tmp_path)
    jobs = [(name, config, BWD.plan(problem, config)) for precision in ("fp32", "tf32")
            for name, problem in _problems(precision)[:2]
            for config in _configs(problem, (16, 64, 128, 256), (2, 3, 6), groups=(1, 3))]
    failures = target_build_failures(compiler, build_sample(jobs, builds))
    assert len(jobs) > 60 and not failures, "\n".join(failures[:8])


@needs_nvcc
def test_fp32_pairs_keep_two_blocks_of_modern_56s_record_on_an_sm(tmp_path):
    """modern_56's fp32 record (2 warpgroups x 64 columns, a halo slot, two blocks an SM at INFLIGHT
    0) with INFLIGHT=1: the pair's accumulators within 112 registers a thread, so that two blocks
    of 288 threads still share an SM's 65,536, without spilling."""
    problem = _problems("fp32")[0][1]
    config = {"formulation": FORMULATION_TMA, "CROSS": 1, "WGS": 2, "WBN": 64, "WSTAGES": 3, "STAGE_LAUNCHES": 1,
              "STAGE_PLANES": 0, "A_TILES": "halo", "ASLOTS": 1, "STAGE_PIXELS": 64, "PDL": 0}
    compiler = NvccCompiler("sm_90", cache_dir=tmp_path)
    reports = {}
    for inflight in (0, 1):
        plan = BWD.plan(problem, _space(problem).validate({**config, "INFLIGHT": inflight,
                                                           **({} if inflight else {"GROUP_TILES": 1})}))
        module = compiler.compile(plan.source, arch=plan.compile_arch(compiler.arch))
        reports[inflight] = module.reports["conv_bwd_data"]
    assert not reports[0].spills and not reports[1].spills
    threads = 128 * config["WGS"] + 32
    for report in reports.values():
        allocated = -(-report.registers // 8) * 8   # registers are allocated a warp at a time, 8 a thread
        assert 2 * threads * allocated <= 65536, report
    assert reports[1].registers > reports[0].registers   # the pair's second partial sums


def test_only_fp32_pairs_of_up_to_64_columns_in_two_warpgroups_are_held_to_112_registers():
    """register_cap: __maxnreg__(112) where pairs would otherwise leave one block an SM (the build
    test above); everywhere else 0, __launch_bounds__ and ptxas's choice."""
    config = {"formulation": FORMULATION_TMA, "WGS": 2, "WBN": 64, "WSTAGES": 3, "STAGE_LAUNCHES": 1,
              "STAGE_PLANES": 0, "A_TILES": "halo", "ASLOTS": 2, "STAGE_PIXELS": 64, "PDL": 0}
    fp32, tf32 = _problems("fp32")[0][1], _problems("tf32")[0][1]
    caps = {}
    for inflight, wgs, wbn in itertools.product((0, 1), (1, 2, 4), (32, 64, 128)):
        for name, problem, extra in (("fp32", fp32, {"CROSS": 1}), ("tf32", tf32, {})):
            chosen = {**config, **extra, "INFLIGHT": inflight, "WGS": wgs, "WBN": wbn,
                      **({} if inflight else {"GROUP_TILES": 1})}
            if _space(problem).violations(chosen):
                continue
            caps[name, inflight, wgs, wbn] = register_cap(problem, _space(problem).validate(chosen))
    assert caps[("fp32", 1, 2, 64)] == 112 and caps[("fp32", 0, 2, 64)] == 0
    assert {key for key, cap in caps.items() if cap} == {
        key for key in caps if key[0] == "fp32" and key[1] == 1 and key[2] <= 2 and key[3] <= 64}
    assert all(cap in (0, 112) for cap in caps.values())
    assert not any(cap for key, cap in caps.items() if key[0] == "tf32")


@pytest.mark.gpu
@pytest.mark.parametrize("precision", ["fp32", "tf32"])
def test_tma_kernels_verify_against_float64(precision):
    """Every other config of 16 and 64 columns, 2 and 4 stages, 1, 2 and 4 warpgroups, either loop
    (tf32: a group in flight; fp32: the tiles in pairs), both tilings of dY (halo with one or two
    slots) and both stagings, CROSS both ways (fp32, where K allows), in the order _configs lists
    them; and every other config of 16 and 64 columns and 3 stages that issues 2 or 3 tiles' wgmmas
    as one group (GROUP_TILES): modern_56's layer on 4 images and the odd shapes, every element
    against float64 (fp32 at the one FP32 bound: a group's partial sums span up to 96 terms). The
    tuner verifies every config it measures the same way before timing it."""
    assert_every_config_verifies(BWD, FORMULATION_TMA, _problems(precision),
                                 lambda p: _configs(p, (16, 64), (2, 4))[::2] + [
                                     c for c in _configs(p, (16, 64), (3,), groups=(2, 3))
                                     if c["INFLIGHT"] == 0][::2], "sm_90", HOPPER)
