"""conv_wgrad: weight (and bias) gradients, a reduction over N*P*Q terms per weight.

An implicit GEMM (M = K, N = C*R*S) whose reduction is split over SPLITK blocks. The formulation
says how the partial sums are combined: "atomic" (atomicAdd into the zeroed output; a single split
stores directly) or "two_pass" (partials in a workspace, summed in a fixed order by a second kernel).
"""
from __future__ import annotations

from typing import Any, Sequence

from ..device import DeviceLimits
from ..space import Config, Constraint, Param, SearchSpace
from .base import GRID_YZ_LIMIT, Launch, Operation, cdiv, next_pow2
from .conv_fwd import unroll_context
from .problem import ConvWgradProblem
from .tiling import GemmEnvelope, igemm_constraints, igemm_params, igemm_smem_bytes

ATOMIC = "atomic"
TWO_PASS = "two_pass"
SPLITS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
WORKSPACE_LIMIT_BYTES = 256 * 1024 * 1024
REDUCE_THREADS = 256


def gemm_envelope(p: ConvWgradProblem) -> GemmEnvelope:
    return GemmEnvelope(GM=p.K, GN=p.C * p.R * p.S, GK=p.N * p.P * p.Q)


class ConvWgrad(Operation):
    name = "conv_wgrad"
    family = "conv_wgrad"
    problem_type = ConvWgradProblem
    inputs = ("x", "dy")
    outputs = ("dw", "db")

    def space(self, problem: ConvWgradProblem, limits: DeviceLimits) -> SearchSpace:
        self.check_problem(problem)
        env = gemm_envelope(problem)
        params = [
            Param("formulation", (ATOMIC, TWO_PASS),
                  "how split partial sums are combined: atomics, or a workspace and a second pass"),
            Param("SPLITK", SPLITS, "blocks sharing one output tile's reduction"),
        ]
        params += igemm_params((16, 32, 64, 128), (16, 32, 64, 128), (8, 16, 32), env)
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
        ]

    def _context(self, problem: ConvWgradProblem, config: Config) -> dict[str, Any]:
        return unroll_context(config)

    def _launches(self, p: ConvWgradProblem, c: Config) -> tuple[Launch, ...]:
        env = gemm_envelope(p)
        threads = (c["BM"] // c["TM"]) * (c["BN"] // c["TN"])
        smem = igemm_smem_bytes(c["BM"], c["BN"], c["BK"], c["PAD_A"], c["PAD_B"])
        grid = (cdiv(env.GM, c["BM"]), cdiv(env.GN, c["BN"]), c["SPLITK"])
        main = Launch("conv_wgrad", grid, (threads, 1, 1), smem, ("x", "dy", "dw", "db", "ws", "ws_bias"))
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
        if c["SPLITK"] > 1:
            return ("dw", "db"), ()
        return (), ()

    def _codegen_helpers(self) -> tuple:
        return (gemm_envelope, GemmEnvelope, unroll_context, igemm_smem_bytes, REDUCE_THREADS, ATOMIC, TWO_PASS)

    def flops(self, p: ConvWgradProblem) -> int:
        return 2 * p.macs

    def min_bytes(self, p: ConvWgradProblem) -> int:
        n = p.N * p.C * p.H * p.W + p.N * p.K * p.P * p.Q + p.K * p.C * p.R * p.S
        return 4 * (n + (p.K if p.bias else 0))
