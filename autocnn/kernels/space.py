"""Search spaces: finite choices per template parameter, conditional parameters, static constraints.

A Config is only ever produced by ``SearchSpace.validate`` (or by enumeration of the space), so
every value that reaches a template is one the space offers: a config read from a file can never
inject text into CUDA source.
"""
from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator, Mapping, Sequence

from autocnn.errors import InfeasibleConfigError, InvalidConfigError

Value = int | str | bool


@dataclass(frozen=True)
class Param:
    """One template parameter. ``active_if`` maps earlier parameters to the values that enable it."""

    name: str
    choices: tuple[Value, ...]
    doc: str = ""
    active_if: tuple[tuple[str, tuple[Value, ...]], ...] = ()

    def is_active(self, assigned: Mapping[str, Value]) -> bool:
        return all(assigned.get(name) in allowed for name, allowed in self.active_if)


@dataclass(frozen=True)
class Constraint:
    """A static feasibility rule over some parameters; ``check`` returns a reason when violated.

    A rule applies only when all of its parameters are active in the config.
    """

    params: tuple[str, ...]
    check: Callable[..., str | None]

    def violation(self, values: Mapping[str, Value]) -> str | None:
        return self.check(*(values[p] for p in self.params))


@dataclass(frozen=True)
class Config:
    """One choice per active parameter, in the space's parameter order. Hashable and JSON-friendly."""

    op: str
    items: tuple[tuple[str, Value], ...]

    def __getitem__(self, name: str) -> Value:
        for k, v in self.items:
            if k == name:
                return v
        raise KeyError(name)

    def get(self, name: str, default: Any = None) -> Any:
        for k, v in self.items:
            if k == name:
                return v
        return default

    def __contains__(self, name: str) -> bool:
        return any(k == name for k, _ in self.items)

    def as_dict(self) -> dict[str, Value]:
        return dict(self.items)

    def key(self) -> str:
        """Canonical text of the config: equal configs have equal keys."""
        return json.dumps(self.as_dict(), sort_keys=True, separators=(",", ":"))

    def __str__(self) -> str:
        return " ".join(f"{k}={v}" for k, v in self.items)


def _same_value(a: Any, b: Value) -> bool:
    # 8 and 8.0 and "8" and True are different things to a template; only exact types match.
    return type(a) is type(b) and a == b


class SearchSpace:
    """The finite space of one operation for one problem on one class of device."""

    def __init__(self, op: str, params: Sequence[Param], constraints: Sequence[Constraint] = ()):
        self.op = op
        self.params = tuple(params)
        self.constraints = tuple(constraints)
        self._index = {p.name: i for i, p in enumerate(self.params)}
        if len(self._index) != len(self.params):
            raise ValueError(f"{op}: duplicate parameter names")
        for p in self.params:
            for name, _ in p.active_if:
                if self._index.get(name, len(self.params)) >= self._index[p.name]:
                    raise ValueError(f"{op}: {p.name} depends on {name}, which must come earlier")
        # Each constraint is checked at the parameter that completes it, which lets enumeration prune.
        self._due: dict[int, list[Constraint]] = {}
        for c in self.constraints:
            for name in c.params:
                if name not in self._index:
                    raise ValueError(f"{op}: constraint names unknown parameter {name}")
            last = max(self._index[n] for n in c.params)
            self._due.setdefault(last, []).append(c)
        self._feasible: list[Config] | None = None

    # -- single configs ---------------------------------------------------------------------
    def param(self, name: str) -> Param:
        return self.params[self._index[name]]

    def active_params(self, values: Mapping[str, Value]) -> list[Param]:
        active: list[Param] = []
        assigned: dict[str, Value] = {}
        for p in self.params:
            if p.is_active(assigned) and p.name in values:
                assigned[p.name] = values[p.name]
            if p.is_active(assigned):
                active.append(p)
        return active

    def violations(self, values: Mapping[str, Value]) -> list[str]:
        return [why for _, why in self._broken(values)]

    def validate(self, values: Mapping[str, Any] | Config, *, check_feasible: bool = True) -> Config:
        """Turn a mapping into a Config, or raise InvalidConfigError / InfeasibleConfigError."""
        if isinstance(values, Config):
            values = values.as_dict()
        if not isinstance(values, Mapping):
            raise InvalidConfigError(self.op, "config", values, "a mapping of parameter names to values")
        known = set(self._index)
        for name in values:
            if name not in known:
                raise InvalidConfigError(self.op, str(name), values[name],
                                         f"parameters are {', '.join(self._index)}")
        assigned: dict[str, Value] = {}
        for p in self.params:
            if not p.is_active(assigned):
                if p.name in values:
                    raise InvalidConfigError(
                        self.op, p.name, values[p.name],
                        "nothing here: it applies only when " + _describe_condition(p))
                continue
            if p.name not in values:
                raise InvalidConfigError(self.op, p.name, None,
                                         f"a value is required; choices are {list(p.choices)}")
            v = values[p.name]
            match = next((c for c in p.choices if _same_value(v, c)), None)
            if match is None and not any(_same_value(v, c) for c in p.choices):
                raise InvalidConfigError(self.op, p.name, v, f"one of {list(p.choices)}")
            assigned[p.name] = v
        config = Config(self.op, tuple((p.name, assigned[p.name]) for p in self.params if p.name in assigned))
        if check_feasible:
            reasons = self.violations(assigned)
            if reasons:
                raise InfeasibleConfigError(self.op, reasons)
        return config

    def complete(self, values: Mapping[str, Any] | Config, *, check_feasible: bool = True) -> Config:
        """``values`` with every active parameter it lacks at that parameter's first choice, then
        validated. A parameter added to a formulation lists the code it had before first, so a
        config written before the addition completes to the code it named. Only for first guesses
        that are measured anew (the old winners of a stale record), or for a record whose completed
        config is shown to plan the very code it was tuned with (its plan digest), never otherwise
        for a config to run."""
        given = dict(values.as_dict() if isinstance(values, Config) else values)
        # What validation refuses (an inactive or unknown parameter given) stays given, so it is refused.
        return self.validate({**given, **self._active_values(given)}, check_feasible=check_feasible)

    def with_choice(self, config: Config, name: str, value: Any) -> Config:
        """``config`` with parameter ``name`` at ``value``, validated: parameters the change leaves
        inactive are dropped (a tiled multiply-accumulate's FB under a per-thread one) and ones it
        makes active take their first choice, as ``complete`` fills them. For variants of a config
        that are measured anew (``autocnn tune --vary``), never for a config to run unmeasured."""
        return self.validate(self._active_values({**config.as_dict(), name: value}))

    def nearest_with_choice(self, config: Config, name: str, value: Any, *, held: Sequence[str] = (),
                            max_changes: int = 2) -> Config:
        """``with_choice``, and where the rules refuse the result, the feasible config nearest to it
        that keeps ``name`` at ``value``: the fewest other parameters changed (at most
        ``max_changes``), each of them named by a rule that the config breaks at that point. A
        tile's rows that need fewer outputs a thread, a stage count that needs a smaller block: one
        parameter's new value often breaks a rule that another one's change restores, and without
        the repair such a variant is never measured. Each moved parameter tries its choices nearest
        to its value first; ties go to the earlier parameter and choice, so the result is
        deterministic. The parameters ``held`` never move (the formulation: another
        kernel is not a repair). Raises InvalidConfigError for a value that is not a choice
        and InfeasibleConfigError (the unrepaired config's reasons) where no such config exists.
        For variants measured anew (``autocnn tune --vary``), as ``with_choice``."""
        start = self._active_values({**config.as_dict(), name: value})
        # A value that is not a choice, or a parameter that the config leaves off: refused as such.
        self.validate({**start, name: value}, check_feasible=False)
        frontier, seen = [start], {json.dumps(start, sort_keys=True)}
        for depth in range(max_changes + 1):
            broken_of = []   # each rule checked once a config: feasibility and the moves both read it
            for values in frontier:
                broken = self._broken(values)
                if not broken:
                    return self.validate(values)
                broken_of.append((values, broken))
            if depth == max_changes:
                break
            following: list[dict[str, Any]] = []
            for values, broken in broken_of:
                movable = [n for c, _ in broken for n in c.params if n != name and n not in held]
                for other in sorted(set(movable), key=self._index.__getitem__):
                    for choice in self._nearest_choices(other, values[other]):
                        moved = self._active_values({**values, other: choice})
                        key = json.dumps(moved, sort_keys=True)
                        # The chosen parameter stays (a change may not turn it off).
                        if key in seen or not _same_value(moved.get(name), start[name]):
                            continue
                        seen.add(key)
                        following.append(moved)
            frontier = following
        raise InfeasibleConfigError(self.op, self.violations(start))

    def _nearest_choices(self, name: str, value: Value) -> list[Value]:
        """``name``'s other choices, the nearest to ``value`` in the choices' order first (8 outputs a
        thread that must shrink becomes 4 before 1), the earlier of two as near first."""
        choices = self.param(name).choices
        at = next(i for i, c in enumerate(choices) if _same_value(value, c))
        others = sorted((i for i in range(len(choices)) if i != at), key=lambda i: (abs(i - at), i))
        return [choices[i] for i in others]

    def _broken(self, values: Mapping[str, Value]) -> list[tuple[Constraint, str]]:
        """The rules that ``values`` breaks (of those whose parameters it all has), with their reasons."""
        broken = []
        for c in self.constraints:
            if all(n in values for n in c.params):
                why = c.violation(values)
                if why:
                    broken.append((c, why))
        return broken

    def _active_values(self, values: Mapping[str, Any]) -> dict[str, Any]:
        """The active parameters of ``values``, in order, each at its given value or else its first
        choice (whether a parameter is active depends on the earlier ones' values)."""
        active: dict[str, Any] = {}
        for p in self.params:
            if p.is_active(active):
                active[p.name] = values.get(p.name, p.choices[0])
        return active

    def is_feasible(self, config: Config) -> bool:
        return not self.violations(config.as_dict())

    # -- the whole space --------------------------------------------------------------------
    def enumerate(self) -> Iterator[Config]:
        """Every feasible config, pruning partial assignments as soon as a constraint fails."""
        assigned: dict[str, Value] = {}
        n = len(self.params)

        def walk(i: int) -> Iterator[Config]:
            if i == n:
                yield Config(self.op, tuple((p.name, assigned[p.name]) for p in self.params
                                            if p.name in assigned))
                return
            p = self.params[i]
            options: Sequence[Value | None] = p.choices if p.is_active(assigned) else (None,)
            for v in options:
                if v is not None:
                    assigned[p.name] = v
                ok = True
                for c in self._due.get(i, ()):
                    if all(name in assigned for name in c.params) and c.violation(assigned):
                        ok = False
                        break
                if ok:
                    yield from walk(i + 1)
                if v is not None:
                    del assigned[p.name]

        yield from walk(0)

    def feasible_configs(self) -> list[Config]:
        if self._feasible is None:
            self._feasible = list(self.enumerate())
        return self._feasible

    def size(self) -> int:
        return len(self.feasible_configs())

    def sample(self, rng: random.Random, count: int, exclude: Sequence[Config] = (),
               max_attempts: int = 200, exclude_keys: Iterable[str] = ()) -> list[Config]:
        """Up to ``count`` distinct feasible configs, none of ``exclude`` (nor of ``exclude_keys``).

        Each draw picks a value of the first parameter (the formulation, where a family has several)
        uniformly, then walks the remaining parameters choosing uniformly among the values that no
        completed constraint rules out, so no enumeration of a large space is needed.
        """
        seen = {c.key() for c in exclude} | set(exclude_keys)
        out: list[Config] = []
        misses = 0
        while len(out) < count and misses < max_attempts:
            config = self._random_walk(rng)
            if config is None or config.key() in seen:
                misses += 1
                continue
            seen.add(config.key())
            out.append(config)
        return out

    def _random_walk(self, rng: random.Random) -> Config | None:
        assigned: dict[str, Value] = {}
        for i, p in enumerate(self.params):
            if not p.is_active(assigned):
                continue
            options = list(p.choices)
            rng.shuffle(options)
            for v in options:
                assigned[p.name] = v
                due = self._due.get(i, ())
                if not any(all(n in assigned for n in c.params) and c.violation(assigned) for c in due):
                    break
                del assigned[p.name]
            else:
                return None   # dead end: every value of this parameter violates a rule
        return Config(self.op, tuple((p.name, assigned[p.name]) for p in self.params if p.name in assigned))

    def restrict(self, fixed: Mapping[str, Value]) -> "SearchSpace":
        """The subspace with some parameters held at one value (each must be one of its choices)."""
        params = []
        for p in self.params:
            if p.name in fixed:
                v = fixed[p.name]
                if not any(_same_value(v, c) for c in p.choices):
                    raise InvalidConfigError(self.op, p.name, v, f"one of {list(p.choices)}")
                params.append(Param(p.name, (v,), p.doc, p.active_if))
            else:
                params.append(p)
        unknown = sorted(set(fixed) - set(self._index))
        if unknown:
            raise InvalidConfigError(self.op, unknown[0], fixed[unknown[0]], f"parameters are {', '.join(self._index)}")
        return SearchSpace(self.op, params, self.constraints)

    def describe(self) -> list[dict[str, Any]]:
        return [{"name": p.name, "choices": list(p.choices), "doc": p.doc,
                 "when": _describe_condition(p) if p.active_if else ""} for p in self.params]


def _describe_condition(p: Param) -> str:
    return " and ".join(f"{name} in {list(vals)}" for name, vals in p.active_if)
