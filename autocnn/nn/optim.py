"""Optimizers: SGD (momentum, Nesterov), Adam and RPROP (iRprop-).

An optimizer works on named parameters: ``setup(params)`` allocates its state once (arrays of
the parameters' own array module, so state lives on the GPU with a GPU model), and
``step(params, grads)`` updates every parameter in place. Weight decay is classic L2, added to
the gradient before the update (as PyTorch's SGD and Adam do).

The updates allocate nothing: every intermediate goes into state buffers made by ``setup``
(per-parameter scratch, and buffers shared by all parameters, sized for the largest one), with
``out=`` arguments, so a step is a fixed sequence of kernels on fixed buffers.

A step has a host part and a device part. ``begin_step`` counts the step on the host and, for
parameters on a GPU, copies the hyper-parameters to the device when one has changed (a
learning-rate schedule); ``apply`` is the device work alone: on a GPU it advances a step counter
in device memory and runs fused kernels (autocnn.nn.fused) that read everything from there, so
the model can capture ``apply`` in a CUDA graph and replay it while ``begin_step`` keeps running
on the host. ``step`` is both.

When the model keeps its parameters and gradients in one flat buffer each (a ParameterArena,
passed to ``setup``), the state is flat as well and the whole update is one pass over the
arena; ``state(name)`` still gives each parameter's state (views into the flat state).
"""
from __future__ import annotations

import abc
import math
from typing import Any, Mapping

import numpy as np

from autocnn.nn.arena import ParameterArena
from autocnn.nn.backend import Array, array_module

Params = Mapping[str, Array]


def _on_gpu(xp: Any) -> bool:
    return xp is not np and xp.__name__.split(".")[0] == "cupy"


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
        # Set by setup: the arena the state is laid out like (None: per-parameter state), its
        # flat state, and on a GPU the device copies of the hyper-parameters and step counter.
        self._arena: ParameterArena | None = None
        self._flat_state: dict[str, Array] = {}
        self._device_hyper: Array | None = None
        self._device_step: Array | None = None
        self._hyper_on_device: tuple[float, ...] | None = None
        self._first_update = True
        self._skip: Array | None = None   # this step's skip flag (apply's), which the GPU kernels read
        # Bumped by every setup: the model re-captures a graphed step when it changes.
        self.generation = 0

    @property
    def is_setup(self) -> bool:
        return bool(self._shapes)

    def matches(self, params: Params) -> bool:
        """Whether the state was set up for exactly these parameter names and shapes."""
        return self._shapes == {name: tuple(p.shape) for name, p in params.items()}

    def setup(self, params: Params, arena: ParameterArena | None = None) -> None:
        """Allocate the state for these parameters (and forget any earlier state).

        ``arena``: the flat buffer ``params`` are views of (the model passes its own); the state
        is then laid out flat like it, and steps on exactly those views update it in one pass.
        """
        if not params:
            raise ValueError(f"{type(self).__name__}: no parameters to optimize")
        if arena is not None and not arena.holds(params):
            raise ValueError(f"{type(self).__name__}: the parameters are not the views of the given arena")
        self._shapes = {name: tuple(p.shape) for name, p in params.items()}
        self._arena = arena
        if arena is not None:
            self._flat_state = self._init_state(arena.params)
            self._state = {name: {k: arena.view(name, flat) for k, flat in self._flat_state.items()}
                           for name in params}
        else:
            self._flat_state = {}
            self._state = {name: self._init_state(p) for name, p in params.items()}
        self._shared = {}
        xp = array_module(next(iter(params.values())))
        arrays = list(params.values()) + ([arena.params] if arena is not None else [])
        # The fused GPU kernels keep their intermediates in registers: no shared work buffers there.
        for buffer, dtype in ({} if _on_gpu(xp) else self._shared_buffers()).items():
            sizes: dict[tuple[str, str], tuple[Any, int]] = {}
            for p in arrays:
                m = array_module(p)
                key = (np.dtype(p.dtype if dtype is None else dtype).str, m.__name__)
                sizes[key] = (m, max(sizes.get(key, (m, 0))[1], int(p.size)))
            self._shared[buffer] = {key: m.empty(size, dtype=key[0]) for key, (m, size) in sizes.items()}
        if _on_gpu(xp):
            self._device_hyper = xp.zeros(len(self._hyper()), dtype=np.float64)
            self._device_step = xp.zeros(2, dtype=np.int64)   # [step, blocks finished]
        else:
            self._device_hyper = self._device_step = None
        self._hyper_on_device = None
        self.iterations = 0
        self.generation += 1

    def step(self, params: Params, grads: Params) -> None:
        """One in-place update of every parameter from its gradient (sets up on first use)."""
        if not self.is_setup:
            self.setup(params)
        self._check(params, grads)
        self.begin_step()
        self.apply(params, grads)

    def begin_step(self) -> None:
        """The host part of a step: count it; on a GPU, send changed hyper-parameters to the device."""
        self.iterations += 1
        if self._device_hyper is not None:
            values = self._hyper()
            if values != self._hyper_on_device:
                # A stream-ordered copy: steps queued before it still see the old values.
                self._device_hyper.set(np.array(values, dtype=np.float64))
                self._hyper_on_device = values

    def apply(self, params: Params, grads: Params, skip: Array | None = None) -> None:
        """The device part of a step (after ``begin_step``): update every parameter in place.

        Launches only fixed kernels on fixed buffers when the parameters are on a GPU, reading
        the hyper-parameters and the step counter from device memory (so it can be captured in
        a CUDA graph); on the CPU it uses ``iterations`` and the attributes directly.

        ``skip``: a one-element float32 flag (fp16's loss scaler's, autocnn.nn.mixed_precision);
        where it is nonzero the step leaves parameters, state and step count as they were. On a
        GPU the kernels read it there (nothing waits for the device), so the device's step count
        (what Adam's bias correction uses) skips the step while ``iterations``, the host's count,
        does not; on the CPU it is read here, and ``iterations`` is counted back.
        """
        self._first_update = True
        self._skip = skip
        if skip is not None and not _on_gpu(array_module(skip)) and float(skip[0]) != 0.0:
            self.iterations -= 1
            return
        arena = self._arena
        if arena is not None and arena.holds(params) and arena.holds_grads(grads):
            self._update(arena.params, arena.grads, self._flat_state)
            return
        for name, p in params.items():
            self._update(p, grads[name], self._state[name])

    def _hyper(self) -> tuple[float, ...]:
        """The hyper-parameters the fused GPU kernel reads, in its order."""
        return ()

    def _take_first(self) -> bool:
        """True for the first GPU update kernel of a step (it advances the device step counter)."""
        first, self._first_update = self._first_update, False
        return first

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
        # The velocity is kept even without momentum: momentum may be switched on later.
        return {"scratch": xp.zeros_like(p), "velocity": xp.zeros_like(p)}

    def _shared_buffers(self) -> dict[str, Any]:
        return {"tmp": None}

    def _hyper(self) -> tuple[float, ...]:
        return (self.lr, self.momentum, self.weight_decay, float(self.nesterov))

    def _update(self, p: Array, g: Array, state: dict[str, Array]) -> None:
        xp = array_module(p)
        if _on_gpu(xp):
            from autocnn.nn import fused

            fused.sgd(p, g, state["velocity"], self._device_hyper, self._device_step, self._take_first(),
                      skip=self._skip)
            return
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

    def _hyper(self) -> tuple[float, ...]:
        return (self.lr, self.beta1, self.beta2, self.eps, self.weight_decay)

    def _update(self, p: Array, g: Array, state: dict[str, Array]) -> None:
        xp = array_module(p)
        if _on_gpu(xp):
            from autocnn.nn import fused

            fused.adam(p, g, state["m"], state["v"], self._device_hyper, self._device_step, self._take_first(),
                       skip=self._skip)
            return
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

    def _hyper(self) -> tuple[float, ...]:
        return (self.eta_plus, self.eta_minus, self.step_min, self.step_max)

    def _update(self, p: Array, g: Array, state: dict[str, Array]) -> None:
        xp = array_module(p)
        if _on_gpu(xp):
            from autocnn.nn import fused

            fused.rprop(p, g, state["step"], state["prev_grad"], self._device_hyper, self._device_step,
                        self._take_first(), skip=self._skip)
            return
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
