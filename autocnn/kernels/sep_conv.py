"""Separable convolutions (seed 002): a layer whose filters W[K,C,R,S] are replaced by rank-r
sums of outer products runs as 1D convolutions that reuse the 1D filters.

Factors: ``u`` [K,C,r,R] (the vertical, column filters, the singular values folded in) and ``v``
[K,C,r,S] (the horizontal, row filters), so that the filter used is
    W_eff[k,c,y,x] = sum_j u[k,c,j,y] * v[k,c,j,x].
Three operations, each with its problem type (a ConvProblem of its kind plus ``rank``, stride 1):

    sep_conv_fwd       y = act(conv(x, W_eff) + b): a vertical then a horizontal 1D pass per (k, c, j),
                       summed over c and j
    sep_conv_bwd_data  dx: the same separable correlation of dy, the 1D filters flipped, K and C swapped
    sep_conv_wgrad     gu[k,c,j,y] = sum_x G[k,c,y,x] v[k,c,j,x], gv[k,c,j,x] = sum_y u[k,c,j,y] G[k,c,y,x]
                       (G the 2D weight gradient, never formed) and db: the loss's gradients with
                       respect to the factors

Each problem carries its float64 reference, computed the separable way (1D passes over shifted
views, in chunks of images and filters so memory stays bounded); tests check it against W_eff and
the 2D references of kernels/reference.py. The formulations (formulations/sep_*/) are the seed's
register-based, one-pass and two-pass kernels for fwd and bwd_data, and "sep_tiles" for wgrad.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, ClassVar, Mapping, Sequence

from autocnn.errors import InvalidProblemError
from autocnn.kernels.formulations.cores.sep_geometry import SepCorrelation, correlation
from autocnn.kernels.operation import Operation
from autocnn.kernels.problem import (ACTIVATIONS, PROBLEM_TYPES, ConvBwdDataProblem, ConvFwdProblem,
                                     ConvWgradProblem, register_problem_type)
from autocnn.kernels.reference import activation, array_module
from autocnn.precision import KernelTypes

# Elements of the reference's largest temporary (images x filters x channels x a map): bounded so
# that checking a 128-image layer does not need gigabytes of host memory. On the GPU (CuPy) the
# bound is 16x larger (a few temporaries of 512 MiB in float64): with the host's bound, verifying
# one 128-image 11x11 weight gradient took thousands of small launches and reductions (several
# seconds per variant, over 100 s per case of test_gpu_kernels on an H100).
_REFERENCE_CHUNK = 1 << 22
_REFERENCE_CHUNK_GPU = 1 << 26


# -- problems ---------------------------------------------------------------------------------------

class _Separable:
    """What the three separable problem types add to their convolution: the rank, stride 1, and
    a float64 reference of the separable computation."""

    rank: int
    op: ClassVar[str]
    # Their factors and kernels are NCHW's (kernels/problem.py: ConvProblem.takes_layout).
    takes_layout: ClassVar[bool] = False

    def __post_init__(self) -> None:
        # The convolution's checks first (the next class in the MRO), then the separable ones.
        super().__post_init__()   # type: ignore[misc]
        self._check_separable()

    def _check_separable(self) -> None:
        if tuple(self.stride) != (1, 1):   # type: ignore[attr-defined]
            raise InvalidProblemError(self.op, "stride", self.stride,   # type: ignore[attr-defined]
                                      "1: the separable kernels compute stride-1 convolutions")
        r = self.rank
        most = min(self.R, self.S)   # type: ignore[attr-defined]
        if isinstance(r, bool) or not isinstance(r, int) or not 1 <= r <= most:
            raise InvalidProblemError(self.op, "rank", r,
                                      f"an integer from 1 to min(R, S) = {most} (outer products per filter)")

    def _epilogue_string(self) -> str:
        return super()._epilogue_string() + f",rank={self.rank}"   # type: ignore[misc]

    def with_op(self, op: str, **extra: Any) -> Any:
        """The same geometry as another convolution; a separable one keeps this rank unless told."""
        if issubclass(PROBLEM_TYPES.get(op, object), _Separable):
            extra.setdefault("rank", self.rank)
        return super().with_op(op, **extra)   # type: ignore[misc]

    @property
    def factor_shapes(self) -> dict[str, tuple[int, int, int, int]]:
        K, C, R, S = self.w_shape   # type: ignore[attr-defined]
        return {"u": (K, C, self.rank, R), "v": (K, C, self.rank, S)}


@dataclass(frozen=True)
class SepConvFwdProblem(_Separable, ConvFwdProblem):
    """y = act(conv(x, W_eff) + b) with W_eff = sum_j u[:,:,j,:,None] * v[:,:,j,None,:]."""

    rank: int = 1
    op: ClassVar[str] = "sep_conv_fwd"

    def input_shapes(self) -> dict[str, tuple[int, ...]]:
        return {"x": self.x_shape, **self.factor_shapes, **({"bias": (self.K,)} if self.bias else {})}

    def output_shapes(self) -> dict[str, tuple[int, ...]]:
        return {"y": self.y_shape}

    def reference(self, inputs: Mapping[str, Any]) -> dict[str, Any]:
        out = separable_correlation(inputs["x"], inputs["u"], inputs["v"], correlation(self))
        if self.bias:
            out += inputs["bias"][None, :, None, None]
        return {"y": out if self.activation == "none" else activation(out, self.activation)}

    def reduction_length(self, output_name: str) -> int:
        return self.C * self.rank * self.R * self.S


@dataclass(frozen=True)
class SepConvBwdDataProblem(_Separable, ConvBwdDataProblem):
    """dx of the separable convolution: the separable correlation of dy with the flipped 1D filters."""

    rank: int = 1
    op: ClassVar[str] = "sep_conv_bwd_data"

    def input_shapes(self) -> dict[str, tuple[int, ...]]:
        return {"dy": self.y_shape, **self.factor_shapes}

    def output_shapes(self) -> dict[str, tuple[int, ...]]:
        return {"dx": self.x_shape}

    def reference(self, inputs: Mapping[str, Any]) -> dict[str, Any]:
        return {"dx": separable_correlation(inputs["dy"], inputs["u"], inputs["v"], correlation(self))}

    def reduction_length(self, output_name: str) -> int:
        return self.K * self.rank * self.R * self.S


@dataclass(frozen=True)
class SepConvWgradProblem(_Separable, ConvWgradProblem):
    """(gu, gv, db): the gradients with respect to the factors u and v (and the bias)."""

    rank: int = 1
    op: ClassVar[str] = "sep_conv_wgrad"

    def input_shapes(self) -> dict[str, tuple[int, ...]]:
        return {"x": self.x_shape, "dy": self.y_shape, **self.factor_shapes}

    def output_shapes(self) -> dict[str, tuple[int, ...]]:
        shapes = {"gu": self.factor_shapes["u"], "gv": self.factor_shapes["v"]}
        return {**shapes, **({"db": (self.K,)} if self.bias else {})}

    def reference(self, inputs: Mapping[str, Any]) -> dict[str, Any]:
        gu, gv = separable_factor_grads(inputs["x"], inputs["dy"], inputs["u"], inputs["v"], self)
        out = {"gu": gu, "gv": gv}
        if self.bias:
            out["db"] = inputs["dy"].sum(axis=(0, 2, 3))
        return out

    def reduction_length(self, output_name: str) -> int:
        # gu sums dy * (x filtered along a row by v): N*P*Q*S products; gv likewise with R.
        npq = self.N * self.P * self.Q
        return {"gu": npq * self.S, "gv": npq * self.R, "db": npq}[output_name]


for _cls in (SepConvFwdProblem, SepConvBwdDataProblem, SepConvWgradProblem):
    register_problem_type(_cls)


# -- float64 references, the separable way -----------------------------------------------------------

def _padded(xp: Any, a: Any, top: int, left: int, rows: int, cols: int) -> Any:
    """``a`` (N, C, h, w) placed at (top, left) of zeros (N, C, rows, cols), cut where it overhangs."""
    n, c, h, w = a.shape
    out = xp.zeros((n, c, rows, cols), dtype=a.dtype)
    hh, ww = min(h, rows - top), min(w, cols - left)
    out[:, :, top:top + hh, left:left + ww] = a[:, :, :hh, :ww]
    return out


def _blocks(total: int, per: int, xp: Any) -> list[tuple[int, int]]:
    chunk = _REFERENCE_CHUNK_GPU if xp.__name__ == "cupy" else _REFERENCE_CHUNK
    step = max(1, min(total, chunk // max(1, per)))
    return [(i, min(total, i + step)) for i in range(0, total, step)]


def separable_correlation(inp: Any, u: Any, v: Any, g: SepCorrelation) -> Any:
    """out[n,co,oh,ow] = sum_{ci,j,y,x} U[co,ci,j,y] V[co,ci,j,x] inp[n,ci,oh+y+OFFH,ow+x+OFFW], computed
    as the separable kernels do: a vertical pass with U into a (oh, column) intermediate per
    (co, ci, j), then a horizontal pass with V, summed over ci and j. U and V are the factors as
    the correlation sees them (bwd_data: transposed to [C,K,...] and flipped)."""
    xp = array_module(inp)
    U, V = u, v
    if g.flip:
        U = xp.ascontiguousarray(u.transpose(1, 0, 2, 3)[:, :, :, ::-1])
        V = xp.ascontiguousarray(v.transpose(1, 0, 2, 3)[:, :, :, ::-1])
    cols = g.OW + g.S - 1
    # offsets are <= 0 (padding is smaller than the filter): the input lands at (-OFFH, -OFFW)
    src = _padded(xp, inp, -g.OFFH, -g.OFFW, g.OH + g.R - 1, cols)
    out = xp.zeros((g.N, g.CO, g.OH, g.OW), dtype=inp.dtype)
    for n0, n1 in _blocks(g.N, g.CO * g.CI * g.OH * cols, xp):
        for k0, k1 in _blocks(g.CO, (n1 - n0) * g.CI * g.OH * cols, xp):
            for j in range(g.RANK):
                mid = xp.zeros((n1 - n0, k1 - k0, g.CI, g.OH, cols), dtype=inp.dtype)
                for y in range(g.R):
                    mid += U[None, k0:k1, :, j, y, None, None] * src[n0:n1, None, :, y:y + g.OH, :]
                for x in range(g.S):
                    out[n0:n1, k0:k1] += (V[None, k0:k1, :, j, x, None, None] * mid[..., x:x + g.OW]).sum(axis=2)
    return out


def separable_factor_grads(x: Any, dy: Any, u: Any, v: Any, p: SepConvWgradProblem) -> tuple[Any, Any]:
    """(gu, gv) without the 2D gradient: x filtered along rows by v, correlated with dy over the
    vertical taps, gives gu; x filtered along columns by u, correlated with dy over the horizontal
    taps, gives gv."""
    xp = array_module(x)
    pt, pl = p.padding[0], p.padding[1]
    rows, cols = p.P + p.R - 1, p.Q + p.S - 1
    src = _padded(xp, x, pt, pl, rows, cols)
    gu = xp.zeros(p.factor_shapes["u"], dtype=x.dtype)
    gv = xp.zeros(p.factor_shapes["v"], dtype=x.dtype)
    for n0, n1 in _blocks(p.N, p.K * p.C * rows * cols, xp):
        for k0, k1 in _blocks(p.K, (n1 - n0) * p.C * rows * cols, xp):
            d = dy[n0:n1, k0:k1, None]                        # (n, k, 1, P, Q)
            for j in range(p.rank):
                horiz = xp.zeros((n1 - n0, k1 - k0, p.C, rows, p.Q), dtype=x.dtype)
                for s in range(p.S):
                    horiz += v[None, k0:k1, :, j, s, None, None] * src[n0:n1, None, :, :, s:s + p.Q]
                for r in range(p.R):
                    gu[k0:k1, :, j, r] += (d * horiz[:, :, :, r:r + p.P, :]).sum(axis=(0, 3, 4))
                vert = xp.zeros((n1 - n0, k1 - k0, p.C, p.P, cols), dtype=x.dtype)
                for r in range(p.R):
                    vert += u[None, k0:k1, :, j, r, None, None] * src[n0:n1, None, :, r:r + p.P, :]
                for s in range(p.S):
                    gv[k0:k1, :, j, s] += (d * vert[:, :, :, :, s:s + p.Q]).sum(axis=(0, 3, 4))
    return gu, gv


# -- operations ---------------------------------------------------------------------------------------

class _SepOperation(Operation):
    """A separable convolution: composes the separable formulations (formulations.SEPARABLE)."""

    def separable_macs(self, p: Any) -> int:
        """Multiply-adds of the separable computation, halos left out: per (image, k, c, j) a
        vertical and a horizontal pass over the output map (the 2D kernels do R*S per output)."""
        return p.N * p.K * p.C * p.rank * p.P * p.Q * (p.R + p.S)

    def flops(self, p: Any) -> int:
        return 2 * self.separable_macs(p)


class _SepCorrelationOp(_SepOperation):
    """fwd and bwd_data: one separable correlation, described to the templates by SepCorrelation."""

    shared_templates = ("_common.cuh.j2", "_sep_corr.cuh.j2")

    def _problem_context(self, problem: Any) -> dict[str, Any]:
        act = getattr(problem, "activation", "none")
        return {"act_code": ACTIVATIONS.index(act), "corr": asdict(correlation(problem))}

    def _codegen_helpers(self) -> tuple:
        return (ACTIVATIONS, correlation, SepCorrelation)


class SepConvFwd(_SepCorrelationOp):
    name = "sep_conv_fwd"
    family = "sep_conv_fwd"
    problem_type = SepConvFwdProblem
    inputs = ("x", "u", "v", "bias")
    outputs = ("y",)

    def default_candidates(self, problem: SepConvFwdProblem) -> Sequence[dict[str, Any]]:
        return _by_filter_size(self, problem)

    def min_bytes(self, p: SepConvFwdProblem) -> int:
        t = KernelTypes.of(p.precision)
        return (t.x.size * p.N * p.C * p.H * p.W + t.w.size * (p.K * p.C * p.rank * (p.R + p.S) + (p.K if p.bias else 0))
                + t.y.size * p.N * p.K * p.P * p.Q)


class SepConvBwdData(_SepCorrelationOp):
    name = "sep_conv_bwd_data"
    family = "sep_conv_bwd_data"
    problem_type = SepConvBwdDataProblem
    inputs = ("dy", "u", "v")
    outputs = ("dx",)

    def default_candidates(self, problem: SepConvBwdDataProblem) -> Sequence[dict[str, Any]]:
        return _by_filter_size(self, problem)

    def min_bytes(self, p: SepConvBwdDataProblem) -> int:
        t = KernelTypes.of(p.precision)
        return (t.dy.size * p.N * p.K * p.P * p.Q + t.w.size * p.K * p.C * p.rank * (p.R + p.S)
                + t.dx.size * p.N * p.C * p.H * p.W)


def _by_filter_size(op: _SepOperation, problem: Any) -> list[dict[str, Any]]:
    """The seed's finding (K20m): the register-based kernels win for filters up to 5, the
    shared-memory ones beyond. The one-pass formulation's last candidate fits every problem, so it
    comes last."""
    reg = op.candidates(problem, "sep_register")
    one = op.candidates(problem, "sep_onepass")
    two = op.candidates(problem, "sep_twopass")
    if max(problem.R, problem.S) <= 5:
        return reg + one[:-1] + two + one[-1:]
    return one[:-1] + two + reg + one[-1:]


class SepConvWgrad(_SepOperation):
    name = "sep_conv_wgrad"
    family = "sep_conv_wgrad"
    problem_type = SepConvWgradProblem
    inputs = ("x", "dy", "u", "v")
    outputs = ("gu", "gv", "db")

    def separable_macs(self, p: Any) -> int:
        # per (k, c, j): a filtering pass and a correlation with dy, for each of gu and gv
        return 2 * super().separable_macs(p)

    def min_bytes(self, p: SepConvWgradProblem) -> int:
        t = KernelTypes.of(p.precision)   # u and v read, gu and gv written
        return (t.x.size * p.N * p.C * p.H * p.W + t.dy.size * p.N * p.K * p.P * p.Q
                + (t.w.size + t.dw.size) * p.K * p.C * p.rank * (p.R + p.S) + (t.dw.size * p.K if p.bias else 0))


# -- shapes for tests and benchmarks -----------------------------------------------------------------

SEP_OPS = ("sep_conv_fwd", "sep_conv_bwd_data", "sep_conv_wgrad")
SEED_FILTER_SIZES = (3, 5, 7, 9, 11)


def seed_problems(op: str, ranks: Sequence[int] = (1, 2), N: int = 128) -> list[tuple[str, Any]]:
    """The seed's speed experiment: 64 -> 64 maps of 32x32 ("16 tiles of 16x16"), filter sizes 3-11,
    'same' padding, at each rank."""
    cls = PROBLEM_TYPES[op]
    return [(f"sep64_{f}x{f}_r{r}", cls(N=N, C=64, H=32, W=32, K=64, R=f, S=f, padding=f // 2, rank=r))
            for f in SEED_FILTER_SIZES for r in ranks]


def odd_problems(op: str) -> list[tuple[str, Any]]:
    """Shapes that divide no tile: batch 1 and 3, odd maps, asymmetric padding, non-square filters,
    C and K that are multiples of nothing, full rank."""
    cls = PROBLEM_TYPES[op]
    shapes = [
        ("sep_odd_a", dict(N=3, C=5, H=13, W=11, K=7, R=3, S=5, padding=(1, 2, 0, 1), rank=2)),
        ("sep_odd_b", dict(N=1, C=3, H=17, W=23, K=13, R=5, S=5, padding=(2, 1, 0, 3), rank=1)),
        ("sep_odd_c", dict(N=3, C=7, H=9, W=31, K=10, R=4, S=3, padding=(3, 0, 1, 2), rank=3)),
        ("sep_odd_d", dict(N=2, C=1, H=15, W=15, K=9, R=7, S=7, padding=(3, 3, 2, 2), rank=2)),
        ("sep_odd_e", dict(N=1, C=17, H=6, W=10, K=3, R=2, S=2, rank=1)),
        ("sep_odd_f", dict(N=3, C=11, H=19, W=5, K=5, R=9, S=11, padding=(4, 5, 4, 5), rank=1)),
    ]
    extra = {"bias": True, "activation": "relu"} if op == "sep_conv_fwd" else {}
    return [(name, cls(**geo, **(extra if name in ("sep_odd_a", "sep_odd_d") else {}))) for name, geo in shapes]
