"""conv_wgrad: weight (and bias) gradients, a reduction over N*P*Q terms per weight.

An implicit GEMM (M = K, N = C*R*S) whose reduction is split over SPLITK blocks, its partial sums
combined by "atomic" (atomicAdd into the zeroed output; a single split stores directly) or
"two_pass" (partials in a workspace, summed in a fixed order by a second kernel). Or "rows", a
direct formulation for few filter weights: blocks stage whole output rows of dY with the input
rows under them and loop over row slabs, each thread an outer product of KPT filters by SPT taps.
"""
from __future__ import annotations

from typing import Any, Sequence

from autocnn.device import DeviceLimits
from autocnn.kernels.space import Config, Constraint, Param, SearchSpace
from autocnn.kernels.operation import GRID_YZ_LIMIT, Launch, Operation, cdiv, next_pow2, smem_rule
from autocnn.kernels.conv_fwd import unroll_context
from autocnn.kernels.problem import ConvWgradProblem
from autocnn.kernels.tiling import GemmEnvelope, igemm_constraints, igemm_params, igemm_smem_bytes

ATOMIC = "atomic"
TWO_PASS = "two_pass"
DIRECT_ROWS = "rows"
SPLITS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
WORKSPACE_LIMIT_BYTES = 256 * 1024 * 1024
REDUCE_THREADS = 256


def gemm_envelope(p: ConvWgradProblem) -> GemmEnvelope:
    return GemmEnvelope(GM=p.K, GN=p.C * p.R * p.S, GK=p.N * p.P * p.Q)


def _with_own(choices: tuple[int, ...], n: int, bound: int = 16) -> tuple[int, ...]:
    """Powers of two up to n's, plus n itself when it is small (5 filters should not pay for 8)."""
    kept = {c for c in choices if c <= max(choices[0], next_pow2(n))}
    return tuple(sorted(kept | ({n} if n <= bound else set())))


def rows_threads(p: ConvWgradProblem, KT: int, KPT: int, CT: int, SPT: int, QSPLIT: int) -> int:
    """Threads of a "rows" block: every (filter group, channel, tap row, tap group) once per column
    group, rounded up to whole warps (the spare threads help staging)."""
    return cdiv((KT // KPT) * CT * p.R * cdiv(p.S, SPT) * QSPLIT, 32) * 32


def rows_smem_bytes(p: ConvWgradProblem, KT: int, KPT: int, CT: int, SPT: int, QSPLIT: int, ROWS: int) -> int:
    # The staged rows of dY and X, and later (the same memory) the column groups' partial sums.
    wsp = (p.Q - 1) * p.stride[1] + cdiv(p.S, SPT) * SPT
    stage = ROWS * KT * (p.Q + 1) + ROWS * CT * p.R * wsp
    sums = QSPLIT * KT * CT * p.R * cdiv(p.S, SPT) * SPT
    return 4 * max(stage, sums)


def rows_params(p: ConvWgradProblem) -> list[Param]:
    cond = (("formulation", (DIRECT_ROWS,)),)
    return [
        Param("KT", _with_own((1, 2, 4, 8, 16, 32), p.K), "filters per block", cond),
        Param("KPT", (1, 2, 4, 8), "filters per thread (dY values reused across taps)", cond),
        Param("CT", _with_own((1, 2, 4, 8), p.C, bound=8), "input channels per block", cond),
        Param("SPT", _with_own((1, 2, 4, 8), p.S), "filter taps along a row per thread (inputs reused across filters)", cond),
        Param("QSPLIT", tuple(v for v in (1, 2, 4, 8, 16, 32) if v <= max(1, next_pow2(p.Q))),
              "thread groups splitting an output row's columns", cond),
        Param("ROWS", (1, 2, 4, 8), "output rows staged per step", cond),
        Param("BLOCKS", (128, 256, 512, 1024, 2048), "blocks along the reduction (each loops over row slabs)", cond),
        Param("UNROLL_Q", (1, 2, 4), "unrolling of the loop over output columns", cond),
    ]


def rows_constraints(p: ConvWgradProblem, limits: DeviceLimits) -> list[Constraint]:
    names = ("KT", "KPT", "CT", "SPT", "QSPLIT")
    return [
        Constraint(("KT", "KPT"), lambda kt, kpt: None if kt % kpt == 0 else f"KPT={kpt} does not divide KT={kt}"),
        Constraint(("KPT", "SPT"), lambda kpt, spt: None if kpt * spt <= 64
                   else f"{kpt * spt} accumulators per thread exceed 64 (registers)"),
        Constraint(names, lambda *v: None if rows_threads(p, *v) <= limits.max_threads_per_block
                   else f"{rows_threads(p, *v)} threads per block exceed the limit of {limits.max_threads_per_block}"),
        Constraint(("KT",), lambda kt: None if cdiv(p.K, kt) <= GRID_YZ_LIMIT else "too many filter tiles"),
        Constraint(("CT",), lambda ct: None if cdiv(p.C, ct) <= GRID_YZ_LIMIT else "too many channel tiles"),
        smem_rule(limits, (*names, "ROWS"), lambda *v: rows_smem_bytes(p, *v)),
    ]


class ConvWgrad(Operation):
    name = "conv_wgrad"
    family = "conv_wgrad"
    problem_type = ConvWgradProblem
    inputs = ("x", "dy")
    outputs = ("dw", "db")

    def space(self, problem: ConvWgradProblem, limits: DeviceLimits) -> SearchSpace:
        self.check_problem(problem)
        env = gemm_envelope(problem)
        gemm = ("formulation", (ATOMIC, TWO_PASS))
        params = [
            Param("formulation", (ATOMIC, TWO_PASS, DIRECT_ROWS),
                  "implicit GEMM with split partial sums combined by atomics or by a second pass, "
                  "or direct over staged rows"),
            Param("SPLITK", SPLITS, "blocks sharing one output tile's reduction", (gemm,)),
        ]
        params += igemm_params((16, 32, 64, 128), (16, 32, 64, 128), (8, 16, 32), env, gemm)
        params += rows_params(problem)
        steps = cdiv(env.GK, 8)
        constraints = igemm_constraints(env, limits, min_bm=16, min_bn=16, min_bk=8)
        constraints += [
            Constraint(("formulation", "SPLITK"),
                       lambda f, s: None if f == ATOMIC or s >= 2 else "two_pass needs SPLITK >= 2"),
            Constraint(("SPLITK", "BK"),
                       lambda s, bk: None if s <= max(1, cdiv(env.GK, bk))
                       else f"SPLITK={s} exceeds the {cdiv(env.GK, bk)} reduction steps"),
            Constraint(("SPLITK",), lambda s: None if s <= GRID_YZ_LIMIT else "too many splits"),
            Constraint(("formulation", "SPLITK"),
                       lambda f, s: None if f == ATOMIC or 4 * s * (env.GM * env.GN + env.GM) <= WORKSPACE_LIMIT_BYTES
                       else f"the two-pass workspace exceeds {WORKSPACE_LIMIT_BYTES >> 20} MiB"),
        ]
        del steps
        constraints += rows_constraints(problem, limits)
        return SearchSpace(self.name, params, constraints)

    def default_candidates(self, problem: ConvWgradProblem) -> Sequence[dict[str, Any]]:
        env = gemm_envelope(problem)
        bm = max(16, min(64, next_pow2(env.GM)))
        bn = max(16, min(64, next_pow2(env.GN)))
        tm, tn = (4 if bm >= 32 else 2), (4 if bn >= 32 else 2)
        tiles = cdiv(env.GM, bm) * cdiv(env.GN, bn)
        # About two blocks per multiprocessor of a large GPU, each split keeping >= 16 steps of 16.
        want = max(1, min(2 * 132 // max(1, tiles), cdiv(env.GK, 16 * 16)))
        split = max(s for s in SPLITS if s <= want)
        gemm = {"formulation": ATOMIC, "PAD_A": 1, "PAD_B": 1, "UNROLL_K": 0}
        return [
            {**gemm, "SPLITK": split, "BM": bm, "BN": bn, "BK": 16, "TM": tm, "TN": tn},
            {**gemm, "SPLITK": split, "BM": 32, "BN": 32, "BK": 16, "TM": 2, "TN": 4},
            {**gemm, "SPLITK": 1, "BM": 16, "BN": 16, "BK": 8, "TM": 2, "TN": 2},
            {"formulation": DIRECT_ROWS, "KT": min(8, next_pow2(problem.K)), "KPT": min(4, next_pow2(problem.K)), "CT": 1,
             "SPT": min(4, next_pow2(problem.S)), "QSPLIT": 1, "ROWS": 1, "BLOCKS": 256, "UNROLL_Q": 1},
        ]

    def _context(self, problem: ConvWgradProblem, config: Config) -> dict[str, Any]:
        context = unroll_context(config)
        if config["formulation"] == DIRECT_ROWS:
            context["UNROLL_Q"] = str(config["UNROLL_Q"])
        return context

    def _launches(self, p: ConvWgradProblem, c: Config) -> tuple[Launch, ...]:
        args = ("x", "dy", "dw", "db", "ws", "ws_bias")
        if c["formulation"] == DIRECT_ROWS:
            tiles = (c["KT"], c["KPT"], c["CT"], c["SPT"], c["QSPLIT"])
            grid = (min(cdiv(p.N * p.P, c["ROWS"]), c["BLOCKS"]), cdiv(p.K, c["KT"]), cdiv(p.C, c["CT"]))
            return (Launch("conv_wgrad", grid, (rows_threads(p, *tiles), 1, 1),
                           rows_smem_bytes(p, *tiles, c["ROWS"]), args),)
        env = gemm_envelope(p)
        threads = (c["BM"] // c["TM"]) * (c["BN"] // c["TN"])
        smem = igemm_smem_bytes(c["BM"], c["BN"], c["BK"], c["PAD_A"], c["PAD_B"])
        grid = (cdiv(env.GM, c["BM"]), cdiv(env.GN, c["BN"]), c["SPLITK"])
        main = Launch("conv_wgrad", grid, (threads, 1, 1), smem, args)
        if c["formulation"] == TWO_PASS:
            n = env.GM * env.GN + env.GM
            reduce = Launch("conv_wgrad_reduce", (cdiv(n, REDUCE_THREADS), 1, 1), (REDUCE_THREADS, 1, 1), 0,
                            ("ws", "ws_bias", "dw", "db"))
            return (main, reduce)
        return (main,)

    def _buffers(self, p: ConvWgradProblem, c: Config):
        env = gemm_envelope(p)
        if c["formulation"] == TWO_PASS:
            return (), (("ws", c["SPLITK"] * env.GM * env.GN), ("ws_bias", c["SPLITK"] * env.GM))
        if c["formulation"] == DIRECT_ROWS or c["SPLITK"] > 1:
            return ("dw", "db"), ()
        return (), ()

    def _codegen_helpers(self) -> tuple:
        return (gemm_envelope, GemmEnvelope, unroll_context, igemm_smem_bytes, REDUCE_THREADS, ATOMIC, TWO_PASS,
                DIRECT_ROWS, rows_threads, rows_smem_bytes)

    def flops(self, p: ConvWgradProblem) -> int:
        return 2 * p.macs

    def min_bytes(self, p: ConvWgradProblem) -> int:
        n = p.N * p.C * p.H * p.W + p.N * p.K * p.P * p.Q + p.K * p.C * p.R * p.S
        return 4 * (n + (p.K if p.bias else 0))
