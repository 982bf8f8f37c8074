"""The tensor-core implicit GEMM ("tc"): warp-level mma.sync m16n8k8 on TF32 operands.

It serves the three convolutions through the same GEMM views as the igemm formulation (conv_fwd:
M = output pixels, N = filters; conv_bwd_data: one GEMM per stride phase; conv_wgrad: M = filters,
N = C*R*S with a split reduction). Its templates sit beside this module: the core tcgemm.cuh.j2,
the operand gathers gemm_operands_<op>.cuh.j2 and the kernels tc_<op>.cu.j2.

Precision comes from the problem: fp32 renders 3xTF32 (FP32-accurate; each tile's products are
summed into the total in FP32, because the tensor cores' own accumulation does not round to
nearest), tf32 one product per term.

Parameters: block tile BM x BN x BK, warps WM x WN (the warp tile is BM/WM x BN/WN), pipeline
STAGES with CP_ASYNC (cp.async global->shared copies; without it, a register double buffer),
shared-memory padding PAD_A/PAD_B (bank conflicts of the fragment reads), TABLE_A (the A gather's
per-k context tabulated in shared memory), UNROLL_K, and for conv_wgrad SPLITK (partial sums
combined by atomics).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from autocnn.device import DeviceLimits
from autocnn.kernels.operation import GRID_YZ_LIMIT, Launch, at_most, cdiv, next_pow2, smem_rule, threads_rule
from autocnn.kernels.space import Config, Constraint, Param

FORMULATION_TC = "tc"
TC_OPS = ("conv_fwd", "conv_bwd_data", "conv_wgrad")
# Which operands are contiguous along the reduction in global memory (decides the shared layouts).
KMAJOR = {"conv_fwd": (False, True), "conv_bwd_data": (False, False), "conv_wgrad": (True, True)}
TABLE_ENTRY_BYTES = 16
MIN_ARCH = 80   # mma.sync with TF32 operands: Ampere and later
SPLITS = (1, 2, 4, 8, 16, 32, 64, 128, 256)


@dataclass(frozen=True)
class TcGemm:
    """The GEMM one tc kernel runs (the largest phase's, for conv_bwd_data)."""

    op: str
    GM: int
    GN: int
    GK: int
    grid_z: int       # stride phases (conv_bwd_data); splits come from the config
    split3: bool      # fp32: 3xTF32


def arch_number(arch: str) -> int:
    digits = "".join(ch for ch in arch if ch.isdigit())
    return int(digits) if digits else 0


def smem_bytes(op: str, BM: int, BN: int, BK: int, STAGES: int, PAD_A: int, PAD_B: int, TABLE_A: int,
               table_k: int) -> int:
    a_kmajor, b_kmajor = KMAJOR[op]
    fa = BM * (BK + PAD_A) if a_kmajor else BK * (BM + PAD_A)
    fb = BN * (BK + PAD_B) if b_kmajor else BK * (BN + PAD_B)
    table = TABLE_ENTRY_BYTES * cdiv(table_k, BK) * BK if TABLE_A else 0
    return 4 * STAGES * (fa + fb) + table


def params(gemm: TcGemm) -> list[Param]:
    cond = (("formulation", (FORMULATION_TC,)),)

    def upto(choices: tuple[int, ...], n: int) -> tuple[int, ...]:
        kept = tuple(c for c in choices if c <= max(choices[0], next_pow2(n)))
        return kept or choices[:1]

    out = [
        Param("BM", upto((32, 64, 128, 256), gemm.GM), "GEMM rows per block", cond),
        Param("BN", upto((32, 64, 128), gemm.GN), "GEMM columns per block", cond),
        Param("BK", upto((8, 16, 32), gemm.GK), "reduction step staged in shared memory", cond),
        Param("WM", (1, 2, 4), "warps along the block's rows", cond),
        Param("WN", (1, 2, 4), "warps along the block's columns", cond),
        Param("STAGES", (2, 3, 4), "shared-memory pipeline stages", cond),
        Param("CP_ASYNC", (0, 1), "cp.async copies global->shared (else a register double buffer)", cond),
        Param("PAD_A", (0, 4, 8), "floats of padding per shared-memory row of A (bank conflicts)", cond),
        Param("PAD_B", (0, 4, 8), "floats of padding per shared-memory row of B (bank conflicts)", cond),
        Param("UNROLL_K", (1, 0), "unrolling of the k-steps of a tile (0: complete)", cond),
    ]
    if gemm.op == "conv_wgrad":
        out.append(Param("SPLITK", SPLITS, "blocks sharing one output tile's reduction (atomics combine them)", cond))
    else:
        out.append(Param("TABLE_A", (0, 1), "the A gather's per-k context tabulated in shared memory", cond))
    return out


def constraints(gemm: TcGemm, limits: DeviceLimits) -> list[Constraint]:
    op = gemm.op

    def arch(bm):
        n = arch_number(limits.arch)
        return None if n >= MIN_ARCH else f"tensor-core TF32 needs sm_{MIN_ARCH} or later, not {limits.arch}"

    def warp_tiles(bm, bn, wm, wn):
        if bm % (16 * wm) or bn % (8 * wn):
            return f"a {bm}x{bn} block does not split into whole 16x8 mma tiles over {wm}x{wn} warps"
        return None

    def accumulators(bm, bn, wm, wn):
        tiles = (bm // (16 * wm)) * (bn // (8 * wn))
        # fp32 keeps a second fragment per tile (the per-tile sum) and split operands: half as many.
        cap = 16 if gemm.split3 else 32
        return None if tiles <= cap else f"{tiles} mma tiles per warp exceed {cap} (registers)"

    def even_loads(bm, bn, bk, wm, wn):
        n = 32 * wm * wn
        if (bm * bk) % n or (bn * bk) % n:
            return f"a {bm}x{bk} / {bn}x{bk} tile does not split evenly over {n} threads"
        return None

    def pipeline(stages, cp_async):
        return None if cp_async or stages == 2 else "a register-staged pipeline has 2 stages"

    out = [
        Constraint(("BM",), arch),
        Constraint(("BM", "BN", "WM", "WN"), warp_tiles),
        Constraint(("BM", "BN", "WM", "WN"), accumulators),
        Constraint(("BM", "BN", "BK", "WM", "WN"), even_loads),
        Constraint(("STAGES", "CP_ASYNC"), pipeline),
        threads_rule(limits, ("WM", "WN"), lambda wm, wn: 32 * wm * wn),
        at_most("BM", max(32, next_pow2(gemm.GM)), f"only {gemm.GM} GEMM rows"),
        at_most("BN", max(32, next_pow2(gemm.GN)), f"only {gemm.GN} GEMM columns"),
        at_most("BK", max(8, next_pow2(gemm.GK)), f"a reduction of only {gemm.GK} terms"),
        Constraint(("BN",), lambda bn: None if cdiv(gemm.GN, bn) <= GRID_YZ_LIMIT
                   else f"{cdiv(gemm.GN, bn)} blocks along y exceed {GRID_YZ_LIMIT}"),
    ]
    if op == "conv_wgrad":
        out += [
            smem_rule(limits, ("BM", "BN", "BK", "STAGES", "PAD_A", "PAD_B"),
                      lambda *v: smem_bytes(op, *v, 0, 0)),
            Constraint(("SPLITK", "BK"), lambda s, bk: None if s <= max(1, cdiv(gemm.GK, bk))
                       else f"SPLITK={s} exceeds the {cdiv(gemm.GK, bk)} reduction steps"),
            Constraint(("SPLITK",), lambda s: None if s <= GRID_YZ_LIMIT else "too many splits"),
        ]
    else:
        out.append(smem_rule(limits, ("BM", "BN", "BK", "STAGES", "PAD_A", "PAD_B", "TABLE_A"),
                             lambda *v: smem_bytes(op, *v, gemm.GK)))
    return out


def default_candidates(gemm: TcGemm) -> list[dict[str, Any]]:
    """Tiles measured fastest on an H100 for 3x3 layers with 64-256 channels (fp32 and tf32),
    then smaller ones for smaller GEMMs; the last fits any problem on sm_80 and later."""
    base = {"formulation": FORMULATION_TC, "STAGES": 2, "CP_ASYNC": 0, "UNROLL_K": 0}
    a_kmajor, b_kmajor = KMAJOR[gemm.op]
    pads = {"PAD_A": 4 if a_kmajor else 8, "PAD_B": 4 if b_kmajor else 8}
    extra = {"SPLITK": 1} if gemm.op == "conv_wgrad" else {"TABLE_A": 1}
    out = []
    for bm, bn, bk, wm, wn in ((128, 64, 16, 2, 2), (64, 64, 16, 2, 2), (64, 32, 16, 2, 2), (32, 32, 8, 2, 2)):
        cand = {**base, **pads, **extra, "BM": bm, "BN": bn, "BK": bk, "WM": wm, "WN": wn}
        if gemm.op == "conv_wgrad":
            tiles = cdiv(gemm.GM, bm) * cdiv(gemm.GN, bn)
            want = max(1, min(2 * 132 // max(1, tiles), cdiv(gemm.GK, 16 * bk)))
            cand["SPLITK"] = max(s for s in SPLITS if s <= want)
        out.append(cand)
    return out


def context(gemm: TcGemm, config: Config) -> dict[str, Any]:
    return {"split3": gemm.split3, "UNROLL_K": "" if config["UNROLL_K"] == 0 else str(config["UNROLL_K"]),
            "TABLE_A": config["TABLE_A"] if "TABLE_A" in config else 0}


def threads(config: Config) -> int:
    return 32 * config["WM"] * config["WN"]


def launches(gemm: TcGemm, config: Config, args: tuple[str, ...]) -> tuple[Launch, ...]:
    c = config
    table = c["TABLE_A"] if "TABLE_A" in c else 0
    smem = smem_bytes(gemm.op, c["BM"], c["BN"], c["BK"], c["STAGES"], c["PAD_A"], c["PAD_B"], table, gemm.GK)
    z = c["SPLITK"] if gemm.op == "conv_wgrad" else gemm.grid_z
    grid = (cdiv(gemm.GM, c["BM"]), cdiv(gemm.GN, c["BN"]), z)
    return (Launch(gemm.op, grid, (threads(c), 1, 1), smem, args),)


# -- the formulation as a kernel family of its own ---------------------------------------------
# Until the ops compose registered formulations (issue 11), the tensor-core kernels are planned
# here: a search space with formulation fixed to "tc", plans, and a fingerprint of their own files
# and code only, so they never make the records of the other formulations stale.

TEMPLATE_FILES = ("tc_problem.cuh.j2", "tcgemm.cuh.j2")


def gemm_for(problem: Any) -> TcGemm:
    from autocnn.kernels.conv_bwd_data import stride_phases

    p = problem
    split3 = p.precision == "fp32"
    if p.op == "conv_fwd":
        return TcGemm(p.op, p.N * p.P * p.Q, p.K, p.C * p.R * p.S, 1, split3)
    if p.op == "conv_bwd_data":
        phases = stride_phases(p)
        return TcGemm(p.op, max(p.N * ph.Ha * ph.Wb for ph in phases), p.C,
                      max(1, max(p.K * ph.Ra * ph.Sb for ph in phases)), len(phases), split3)
    if p.op == "conv_wgrad":
        return TcGemm(p.op, p.K, p.C * p.R * p.S, p.N * p.P * p.Q, 1, split3)
    raise ValueError(f"the tensor-core formulation serves {', '.join(TC_OPS)}, not {p.op}")


class TensorCoreKernels:
    """Space, plans and fingerprint of the tensor-core formulation for one op."""

    ARGS = {"conv_fwd": ("x", "w", "bias", "y"), "conv_bwd_data": ("dy", "w", "dx"),
            "conv_wgrad": ("x", "dy", "dw", "db", "ws", "ws_bias")}

    def __init__(self, op: str):
        if op not in TC_OPS:
            raise ValueError(f"the tensor-core formulation serves {', '.join(TC_OPS)}, not {op}")
        self.op = op

    def space(self, problem: Any, limits: DeviceLimits):
        from autocnn.kernels.space import SearchSpace

        gemm = gemm_for(problem)
        return SearchSpace(self.op, [Param("formulation", (FORMULATION_TC,), "tensor-core implicit GEMM"),
                                     *params(gemm)], constraints(gemm, limits))

    def default_config(self, problem: Any, limits: DeviceLimits) -> Config:
        from autocnn.errors import InfeasibleConfigError, InvalidConfigError

        space = self.space(problem, limits)
        reasons = []
        for cand in default_candidates(gemm_for(problem)):
            try:
                return space.validate(cand)
            except (InfeasibleConfigError, InvalidConfigError) as exc:
                reasons.append(str(exc))
        raise InfeasibleConfigError(self.op, ["no tensor-core default fits: " + "; ".join(reasons)])

    def fingerprint(self) -> str:
        import hashlib

        from autocnn.kernels import codegen

        files = [*TEMPLATE_FILES, f"tc_{self.op}.cu.j2", f"gemm_operands_{self.op}.cuh.j2"]
        h = hashlib.sha256(f"render-version:{codegen.RENDER_VERSION}\n".encode())
        for name in ("_common.cuh.j2", *files):
            path = next(d / name for d in codegen.TEMPLATE_DIRS if (d / name).exists())
            h.update(name.encode() + b"\0" + path.read_bytes())
        for part in (context, launches, smem_bytes, gemm_for, self.plan, KMAJOR):
            h.update(b"\0" + codegen.code_source(part).encode())
        return h.hexdigest()[:16]

    def plan(self, problem: Any, config: Config):
        from autocnn.kernels import codegen
        from autocnn.kernels.conv_bwd_data import stride_phases
        from autocnn.kernels.operation import KernelPlan
        from autocnn.kernels.problem import ACTIVATIONS

        if problem.op != self.op or config.op != self.op:
            raise ValueError(f"a {config.op} config cannot plan {problem.op} on the {self.op} kernels")
        gemm = gemm_for(problem)
        plan_launches = launches(gemm, config, self.ARGS[self.op])
        ctx = {"op": self.op, "family": f"tc_{self.op}", "shape": problem.shape_string(),
               "config_text": str(config), "p": problem, "c": config.as_dict(), **config.as_dict(),
               **context(gemm, config), "planned_threads": plan_launches[0].threads,
               "planned_smem": plan_launches[0].shared_bytes,
               "act_code": ACTIVATIONS.index(getattr(problem, "activation", "none"))}
        if self.op == "conv_bwd_data":
            ctx["phases"] = [vars(ph) for ph in stride_phases(problem)]
        fingerprint = self.fingerprint()
        source = codegen.environment().get_template(f"tc_{self.op}.cu.j2").render(fingerprint=fingerprint, **ctx)
        inputs = {"conv_fwd": ("x", "w", "bias"), "conv_bwd_data": ("dy", "w"), "conv_wgrad": ("x", "dy")}
        outputs = {"conv_fwd": ("y",), "conv_bwd_data": ("dx",), "conv_wgrad": ("dw", "db")}
        zero = ("dw", "db") if self.op == "conv_wgrad" and config["SPLITK"] > 1 else ()
        return KernelPlan(op=self.op, problem=problem, config=config, source=source, fingerprint=fingerprint,
                          launches=plan_launches, inputs=inputs[self.op], outputs=outputs[self.op],
                          zero_first=zero, workspaces=(("ws", 1), ("ws_bias", 1)) if self.op == "conv_wgrad" else ())
