"""How a separable Conv2d runs on each backend: the factors, the forward, backward-data and the
projected weight update (the layer, autocnn.nn.conv_layer, decides when; this module does it).

* numpy backend (``NumpySeparable``): the float64 power method (separable.svd) on the host, then
  the same math as the GPU through the 2D NumPy references with W_eff = sum_j u_j v_j^T: forward
  conv(x, W_eff), backward-data with W_eff, and from the 2D weight gradient G the factor gradients
  gu = G v, gv = u^T G and the projection P(G) (separable.projection). Float64 models make all of
  it checkable by finite differences.
* cuda backend (``CudaSeparable``): the generated batched SVD (separable.svd_cuda) into the layer's
  u and v buffers, then the separable operations of autocnn.kernels.sep_conv (sep_conv_fwd,
  sep_conv_bwd_data) and the update by one of two routes, the same math: *factored*
  (sep_conv_wgrad: gu, gv and db with 1D passes, then the projection kernel) or *dense* (the 2D
  conv_wgrad into G, whose tuned formulations include tensor cores, then the projection kernel
  from G, which forms gu and gv). The route is measured once when the layer is built, and the
  faster taken: on an H100 at the heuristic defaults, 64->64 maps, batch 64, rank 1, the dense
  route's conv_wgrad took 0.23-0.97x the time of sep_conv_wgrad over filter sizes 3-11. The forward
  and backward-data never fall back to 2D kernels, which would compute something else than was
  asked for: another backend gets SeparableUnavailableError.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from autocnn.kernels import reference
from autocnn.kernels.sep_conv import SepConvFwdProblem
from autocnn.separable.projection import factor_gradients, tangent_projection
from autocnn.separable.svd import SvdReport, SvdSettings, effective_filters, power_svd

SEP_OPS = ("sep_conv_fwd", "sep_conv_bwd_data", "sep_conv_wgrad")
WGRAD_ROUTES = ("factored", "dense")
ROUTE_TIMING_BUDGET_S = 0.05   # per route, once per build: a few ms of a layer's setup


class SeparableUnavailableError(RuntimeError):
    """Separable filters cannot run on this backend (they run on the numpy and cuda backends)."""


def separable_problems(fwd: Any, rank: int, needs_input_grad: bool) -> list[Any]:
    """The problems of a separable layer whose 2D forward problem is ``fwd``: the separable
    operations', and the 2D weight gradient of the dense update route (CudaSeparable), so that
    tuning a separable model tunes both routes."""
    geometry = fwd.geometry()
    sep_fwd = SepConvFwdProblem(**geometry, bias=fwd.bias, activation=fwd.activation, rank=rank)
    problems = [sep_fwd]
    if needs_input_grad:
        problems.append(sep_fwd.with_op("sep_conv_bwd_data"))
    problems.append(sep_fwd.with_op("sep_conv_wgrad", bias=fwd.bias))
    problems.append(fwd.with_op("conv_wgrad", bias=fwd.bias))
    return problems


class NumpySeparable:
    """The separable layer's work on the numpy backend (see the module docstring); ``fwd`` is the
    layer's 2D forward problem (its geometry and epilogue)."""

    def __init__(self, backend: Any, fwd: Any, rank: int, settings: SvdSettings):
        K, C, R, S = fwd.w_shape
        weight_shape = fwd.w_shape
        self.backend, self.fwd, self.rank, self.settings = backend, fwd, rank, settings
        self.u = backend.zeros((K, C, rank, R))
        self.v = backend.zeros((K, C, rank, S))
        self.gu = backend.zeros((K, C, rank, R))
        self.gv = backend.zeros((K, C, rank, S))
        self._w_eff = backend.zeros(weight_shape)
        self._report: SvdReport | None = None
        self.route = "dense"   # from the 2D reference gradient, as CudaSeparable's dense route

    def factorize(self, w: Any, warm_start: bool = True) -> None:
        # v holds the previous call's vectors (zeros before the first: a cold start).
        result = power_svd(w, self.rank, self.settings, start=self.v if warm_start else None)
        self.u[...] = result.u.reshape(self.u.shape)
        self.v[...] = result.v.reshape(self.v.shape)
        self._w_eff[...] = effective_filters(self.u, self.v)
        self._report = result.report()

    def report(self) -> SvdReport | None:
        return self._report

    def effective_filters(self) -> Any:
        return self._w_eff

    def forward(self, x: Any, bias: Any, y: Any) -> None:
        fwd = self.fwd
        self.backend.kernel_calls["sep_conv_fwd"] += 1
        y[...] = reference.conv_fwd(x, self._w_eff, stride=fwd.stride, padding=fwd.padding, bias=bias,
                                    activation=fwd.activation)

    def backward_data(self, dz: Any, dx: Any) -> None:
        fwd = self.fwd
        self.backend.kernel_calls["sep_conv_bwd_data"] += 1
        dx[...] = reference.conv_bwd_data(dz, self._w_eff, input_hw=(fwd.H, fwd.W), stride=fwd.stride,
                                          padding=fwd.padding)

    def weight_gradient(self, x: Any, dz: Any, dw: Any, db: Any) -> None:
        fwd = self.fwd
        self.backend.kernel_calls["sep_conv_wgrad"] += 1
        g, bias_grad = reference.conv_wgrad(x, dz, kernel_hw=(fwd.R, fwd.S), stride=fwd.stride,
                                            padding=fwd.padding, bias=db is not None)
        gu, gv = factor_gradients(g, self.u, self.v)
        self.gu[...], self.gv[...] = gu, gv
        dw[...] = tangent_projection(self.gu, self.gv, self.u, self.v)
        if db is not None:
            db[...] = bias_grad


class CudaSeparable:
    """The separable layer's work on the cuda backend (see the module docstring); ``problems``: the
    layer's separable problems (separable_problems), which the backend prepared at build time."""

    def __init__(self, backend: Any, problems: list[Any], rank: int, settings: SvdSettings,
                 route: str | None = None):
        from autocnn.separable.svd_cuda import shared

        if route is not None and route not in WGRAD_ROUTES:
            raise ValueError(f"separable weight-gradient route {route!r}: one of {', '.join(WGRAD_ROUTES)}, "
                             f"or None to measure both")
        self.problems = {p.op: p for p in problems}
        K, C, R, S = self.problems["sep_conv_fwd"].w_shape
        self.backend, self.rank, self.settings = backend, rank, settings
        self.svd = shared()
        self.u = backend.zeros((K, C, rank, R))
        self.v = backend.zeros((K, C, rank, S))   # zeros: the first call starts cold
        self.gu = backend.zeros((K, C, rank, R))
        self.gv = backend.zeros((K, C, rank, S))
        self.g = backend.zeros((K, C, R, S))      # the dense route's 2D gradient
        self.iterations = backend.zeros((K * C, rank), dtype=np.int32)
        self.status = backend.zeros((K * C, rank), dtype=np.int32)
        self._call: Any = None
        # Measured and verified now, at build time, so that no training step tunes.
        self.svd.prepare(K * C, R, S, rank, settings)
        self.route_us: dict[str, float] = {}
        self.route = route if route is not None else self._measure_routes()

    def _measure_routes(self) -> str:
        """Time both update routes once on scratch data (the kernels the backend prepares for the two
        weight-gradient problems) and return the faster."""
        from autocnn.measurement.measure import time_callable

        sep = self.problems["sep_conv_wgrad"]
        self.backend.prepare([sep, self.problems["conv_wgrad"]])
        cp = self.backend.cp
        gen = cp.random.RandomState(0)
        x = gen.standard_normal(sep.x_shape, dtype=cp.float32)
        dz = gen.standard_normal(sep.y_shape, dtype=cp.float32)
        dw = cp.empty(self.g.shape, dtype=cp.float32)
        db = cp.empty((sep.K,), dtype=cp.float32) if sep.bias else None
        saved = (self.u.copy(), self.v.copy())
        self.u[...] = gen.standard_normal(self.u.shape, dtype=cp.float32)
        self.v[...] = gen.standard_normal(self.v.shape, dtype=cp.float32)
        try:
            for route in WGRAD_ROUTES:
                timing = time_callable(lambda route=route: self._weight_gradient(route, x, dz, dw, db),
                                       budget_s=ROUTE_TIMING_BUDGET_S)
                self.route_us[route] = timing.median_us
        finally:   # the warm start's vectors, as they were
            self.u[...], self.v[...] = saved
        return min(WGRAD_ROUTES, key=lambda r: self.route_us[r])

    def factorize(self, w: Any, warm_start: bool = True) -> None:
        self._call = self.svd.decompose(w, self.u, self.v, self.iterations, self.status, self.settings,
                                        warm_start=warm_start)

    def report(self) -> SvdReport | None:
        return None if self._call is None else self._call.report()

    def effective_filters(self) -> Any:
        return effective_filters(self.u, self.v)

    def forward(self, x: Any, bias: Any, y: Any) -> None:
        self.backend.run_operation(self.problems["sep_conv_fwd"], {"x": x, "u": self.u, "v": self.v, "bias": bias, "y": y})

    def backward_data(self, dz: Any, dx: Any) -> None:
        self.backend.run_operation(self.problems["sep_conv_bwd_data"], {"dy": dz, "u": self.u, "v": self.v, "dx": dx})

    def weight_gradient(self, x: Any, dz: Any, dw: Any, db: Any) -> None:
        self._weight_gradient(self.route, x, dz, dw, db)

    def _weight_gradient(self, route: str, x: Any, dz: Any, dw: Any, db: Any) -> None:
        from autocnn.separable.projection_cuda import tangent_projection, tangent_projection_from_g

        if route == "dense":
            self.backend.conv_wgrad(self.problems["conv_wgrad"], x, dz, self.g, db)
            tangent_projection_from_g(self.g, self.u, self.v, self.gu, self.gv, dw)
            return
        self.backend.run_operation(self.problems["sep_conv_wgrad"], {"x": x, "dy": dz, "u": self.u, "v": self.v,
                                                                     "gu": self.gu, "gv": self.gv, "db": db})
        tangent_projection(self.gu, self.gv, self.u, self.v, dw)


def make_execution(backend: Any, fwd: Any, problems: list[Any], rank: int, settings: SvdSettings) -> Any:
    """The separable work for ``backend``: NumpySeparable on the numpy backend (``fwd``: the layer's
    2D forward problem), CudaSeparable on cuda (``problems``: its separable problems)."""
    if backend.name == "numpy":
        return NumpySeparable(backend, fwd, rank, settings)
    if backend.name == "cuda":
        return CudaSeparable(backend, problems, rank, settings)
    raise SeparableUnavailableError(f"separable filters run on the numpy and cuda backends, not {backend.name!r}")
