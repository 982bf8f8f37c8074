"""Optimizers: SGD (momentum, Nesterov), Adam and RPROP (iRprop-).

An optimizer works on named parameters: ``setup(params)`` allocates its state once (arrays of
the parameters' own array module, so state lives on the GPU with a GPU model), and
``step(params, grads)`` updates every parameter in place. Weight decay is classic L2, added to
the gradient before the update (as PyTorch's SGD and Adam do).

The updates allocate nothing: every intermediate goes into state buffers made by ``setup``
(per-parameter scratch, and buffers shared by all parameters, sized for the largest one), with
``out=`` arguments, so a step is a fixed sequence of kernels on fixed buffers.
"""
from __future__ import annotations

import abc
import math
from typing import Any, Mapping

import numpy as np

from .backend import Array, array_module

Params = Mapping[str, Array]


def _positive(owner: str, name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"{owner}: {name} must be a finite number > 0, got {value!r}")
    return float(value)


def _in_range(owner: str, name: str, value: Any, low: float, high: float, low_open: bool = False) -> float:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if ok:
        ok = (low < value if low_open else low <= value) and value < high
    if not ok:
        bracket = "(" if low_open else "["
        raise ValueError(f"{owner}: {name} must lie in {bracket}{low}, {high}), got {value!r}")
    return float(value)


class Optimizer(abc.ABC):
    """Base: state per parameter name, allocated in ``setup``; ``iterations`` counts steps."""

    def __init__(self) -> None:
        self._state: dict[str, dict[str, Array]] = {}
        self._shapes: dict[str, tuple[int, ...]] = {}
        # name -> (dtype, array module name) -> one flat buffer of the largest parameter's size
        self._shared: dict[str, dict[tuple[str, str], Array]] = {}
        self.iterations = 0

    @property
    def is_setup(self) -> bool:
        return bool(self._shapes)

    def matches(self, params: Params) -> bool:
        """Whether the state was set up for exactly these parameter names and shapes."""
        return self._shapes == {name: tuple(p.shape) for name, p in params.items()}

    def setup(self, params: Params) -> None:
        """Allocate the state for these parameters (and forget any earlier state)."""
        if not params:
            raise ValueError(f"{type(self).__name__}: no parameters to optimize")
        self._shapes = {name: tuple(p.shape) for name, p in params.items()}
        self._state = {name: self._init_state(p) for name, p in params.items()}
        self._shared = {}
        for buffer, dtype in self._shared_buffers().items():
            sizes: dict[tuple[str, str], tuple[Any, int]] = {}
            for p in params.values():
                xp = array_module(p)
                key = (np.dtype(p.dtype if dtype is None else dtype).str, xp.__name__)
                sizes[key] = (xp, max(sizes.get(key, (xp, 0))[1], int(p.size)))
            self._shared[buffer] = {key: xp.empty(size, dtype=key[0]) for key, (xp, size) in sizes.items()}
        self.iterations = 0

    def step(self, params: Params, grads: Params) -> None:
        """One in-place update of every parameter from its gradient (sets up on first use)."""
        if not self.is_setup:
            self.setup(params)
        self._check(params, grads)
        self.iterations += 1
        for name, p in params.items():
            self._update(p, grads[name], self._state[name])

    def _check(self, params: Params, grads: Params) -> None:
        if set(params) != set(self._shapes) or set(grads) != set(self._shapes):
            raise ValueError(f"{type(self).__name__} was set up for parameters {sorted(self._shapes)}, "
                             f"got parameters {sorted(params)} and gradients {sorted(grads)}: call setup() again")
        for name, p in params.items():
            if tuple(p.shape) != self._shapes[name] or tuple(grads[name].shape) != self._shapes[name]:
                raise ValueError(f"{type(self).__name__}: parameter {name!r} was {self._shapes[name]} at setup, "
                                 f"now {tuple(p.shape)} (gradient {tuple(grads[name].shape)})")

    @abc.abstractmethod
    def _init_state(self, p: Array) -> dict[str, Array]: ...

    def _shared_buffers(self) -> dict[str, Any]:
        """Work buffers shared by every parameter's update: name -> dtype (None: the parameter's)."""
        return {}

    def _buffer(self, name: str, p: Array, dtype: Any = None) -> Array:
        """The shared work buffer ``name`` as an array of ``p``'s shape (contents undefined)."""
        xp = array_module(p)
        flat = self._shared[name][(np.dtype(p.dtype if dtype is None else dtype).str, xp.__name__)]
        return flat[:p.size].reshape(p.shape)

    @abc.abstractmethod
    def _update(self, p: Array, g: Array, state: dict[str, Array]) -> None: ...

    def state(self, name: str) -> dict[str, Array]:
        """The state arrays of one parameter (read-only use: tests, inspection)."""
        return self._state[name]

    @staticmethod
    def _effective_grad(xp: Any, p: Array, g: Array, weight_decay: float, out: Array) -> Array:
        # g + weight_decay * p into the scratch buffer: the model's gradient buffer stays as computed.
        if weight_decay:
            xp.multiply(p, weight_decay, out=out)
            out += g
        else:
            xp.copyto(out, g)
        return out


class SGD(Optimizer):
    """Stochastic gradient descent: v = momentum*v + g; p -= lr*v (Nesterov: p -= lr*(g + momentum*v))."""

    def __init__(self, lr: float = 0.01, momentum: float = 0.0, weight_decay: float = 0.0,
                 nesterov: bool = False) -> None:
        super().__init__()
        self.lr = _positive("SGD", "lr", lr)
        self.momentum = _in_range("SGD", "momentum", momentum, 0.0, 1.0)
        self.weight_decay = _in_range("SGD", "weight_decay", weight_decay, 0.0, math.inf)
        if not isinstance(nesterov, bool):
            raise ValueError(f"SGD: nesterov must be True or False, got {nesterov!r}")
        if nesterov and self.momentum == 0:
            raise ValueError("SGD: nesterov=True needs momentum > 0")
        self.nesterov = nesterov

    def __repr__(self) -> str:
        return (f"SGD(lr={self.lr}, momentum={self.momentum}, weight_decay={self.weight_decay}, "
                f"nesterov={self.nesterov})")

    def _init_state(self, p: Array) -> dict[str, Array]:
        xp = array_module(p)
        state = {"scratch": xp.zeros_like(p)}
        if self.momentum:
            state["velocity"] = xp.zeros_like(p)
        return state

    def _shared_buffers(self) -> dict[str, Any]:
        return {"tmp": None} if self.nesterov else {}

    def _update(self, p: Array, g: Array, state: dict[str, Array]) -> None:
        xp = array_module(p)
        d = self._effective_grad(xp, p, g, self.weight_decay, state["scratch"])
        if self.momentum:
            v = state["velocity"]
            v *= self.momentum
            v += d
            if self.nesterov:
                d += xp.multiply(v, self.momentum, out=self._buffer("tmp", p))
            else:
                xp.copyto(d, v)
        d *= self.lr
        p -= d


class Adam(Optimizer):
    """Adam (Kingma & Ba) with bias correction; p -= lr * m_hat / (sqrt(v_hat) + eps)."""

    def __init__(self, lr: float = 1e-3, beta1: float = 0.9, beta2: float = 0.999, eps: float = 1e-8,
                 weight_decay: float = 0.0) -> None:
        super().__init__()
        self.lr = _positive("Adam", "lr", lr)
        self.beta1 = _in_range("Adam", "beta1", beta1, 0.0, 1.0)
        self.beta2 = _in_range("Adam", "beta2", beta2, 0.0, 1.0)
        self.eps = _positive("Adam", "eps", eps)
        self.weight_decay = _in_range("Adam", "weight_decay", weight_decay, 0.0, math.inf)

    def __repr__(self) -> str:
        return (f"Adam(lr={self.lr}, beta1={self.beta1}, beta2={self.beta2}, eps={self.eps}, "
                f"weight_decay={self.weight_decay})")

    def _init_state(self, p: Array) -> dict[str, Array]:
        xp = array_module(p)
        return {"m": xp.zeros_like(p), "v": xp.zeros_like(p), "scratch": xp.zeros_like(p)}

    def _shared_buffers(self) -> dict[str, Any]:
        return {"tmp": None}

    def _update(self, p: Array, g: Array, state: dict[str, Array]) -> None:
        xp = array_module(p)
        t = self.iterations
        m, v, d = state["m"], state["v"], state["scratch"]
        self._effective_grad(xp, p, g, self.weight_decay, d)
        m *= self.beta1
        m += xp.multiply(d, 1.0 - self.beta1, out=self._buffer("tmp", p))
        v *= self.beta2
        d *= d
        d *= 1.0 - self.beta2
        v += d
        # The scratch buffer now becomes the denominator sqrt(v_hat) + eps.
        xp.sqrt(v, out=d)
        d /= math.sqrt(1.0 - self.beta2 ** t)
        d += self.eps
        xp.divide(m, d, out=d)
        d *= self.lr / (1.0 - self.beta1 ** t)
        p -= d


class RPROP(Optimizer):
    """Resilient backpropagation, iRprop- (Igel & Huesken 2000), on mini-batch gradients.

    Every weight has its own step size: it grows by ``eta_plus`` while the gradient keeps its
    sign and shrinks by ``eta_minus`` when the sign flips, within [step_min, step_max]; the
    weight moves by -sign(g) * step. After a sign flip the gradient is taken as zero (no move,
    and no flip seen at the next step): that is the "-" of iRprop-.
    """

    def __init__(self, eta_plus: float = 1.2, eta_minus: float = 0.5, step_init: float = 1e-3,
                 step_min: float = 1e-6, step_max: float = 50.0) -> None:
        super().__init__()
        owner = "RPROP"
        self.eta_plus = _positive(owner, "eta_plus", eta_plus)
        if self.eta_plus <= 1:
            raise ValueError(f"{owner}: eta_plus must be > 1, got {eta_plus!r}")
        self.eta_minus = _in_range(owner, "eta_minus", eta_minus, 0.0, 1.0, low_open=True)
        self.step_init = _positive(owner, "step_init", step_init)
        self.step_min = _positive(owner, "step_min", step_min)
        self.step_max = _positive(owner, "step_max", step_max)
        if not self.step_min <= self.step_init <= self.step_max:
            raise ValueError(f"{owner}: need step_min <= step_init <= step_max, got step_min={step_min!r}, "
                             f"step_init={step_init!r}, step_max={step_max!r}")

    def __repr__(self) -> str:
        return (f"RPROP(eta_plus={self.eta_plus}, eta_minus={self.eta_minus}, step_init={self.step_init}, "
                f"step_min={self.step_min}, step_max={self.step_max})")

    def _init_state(self, p: Array) -> dict[str, Array]:
        xp = array_module(p)
        return {"step": xp.full_like(p, self.step_init), "prev_grad": xp.zeros_like(p),
                "scratch": xp.zeros_like(p)}

    def _shared_buffers(self) -> dict[str, Any]:
        return {"factor": None, "same_sign": np.bool_, "flipped": np.bool_}

    def _update(self, p: Array, g: Array, state: dict[str, Array]) -> None:
        xp = array_module(p)
        step, prev, agreement = state["step"], state["prev_grad"], state["scratch"]
        same_sign = self._buffer("same_sign", p, np.bool_)
        flipped = self._buffer("flipped", p, np.bool_)
        factor = self._buffer("factor", p)
        xp.multiply(g, prev, out=agreement)
        xp.greater(agreement, 0, out=same_sign)
        xp.less(agreement, 0, out=flipped)
        # factor = eta_plus where the sign held, eta_minus where it flipped, 1 elsewhere
        xp.copyto(factor, 1.0)
        xp.copyto(factor, self.eta_minus, where=flipped)
        xp.copyto(factor, self.eta_plus, where=same_sign)
        step *= factor
        xp.clip(step, self.step_min, self.step_max, out=step)
        xp.copyto(prev, g)
        xp.copyto(prev, 0.0, where=flipped)
        xp.sign(prev, out=agreement)
        agreement *= step
        p -= agreement


OPTIMIZERS: dict[str, type[Optimizer]] = {"sgd": SGD, "adam": Adam, "rprop": RPROP}


def get_optimizer(spec: str | Optimizer, lr: float | None = None) -> Optimizer:
    """An optimizer by name ("sgd", "adam", "rprop") with its defaults, or the instance itself.

    ``lr`` sets the learning rate of sgd (default 0.01, with momentum 0.9) and adam (default
    1e-3); RPROP has no learning rate (its step sizes adapt), so ``lr`` with it is an error.
    """
    if isinstance(spec, Optimizer):
        if lr is not None:
            raise ValueError("lr= applies to an optimizer given by name; set it on the instance instead")
        return spec
    if not isinstance(spec, str) or spec.lower() not in OPTIMIZERS:
        raise ValueError(f"unknown optimizer {spec!r}; choose one of {', '.join(OPTIMIZERS)} "
                         f"or pass an Optimizer instance")
    name = spec.lower()
    if name == "sgd":
        return SGD(lr=0.01 if lr is None else lr, momentum=0.9)
    if name == "adam":
        return Adam(lr=1e-3 if lr is None else lr)
    if lr is not None:
        raise ValueError("rprop has no learning rate (its per-weight steps adapt); use "
                         "RPROP(step_init=...) to set the initial step instead of lr=")
    return RPROP()
