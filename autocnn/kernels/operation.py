"""What every operation provides: the formulations it composes, its search space, defaults,
fingerprints and plans.

An operation composes the formulations registered for it (formulations/; kernels/registry.py says
which): its search space is the union of theirs, its heuristic default their candidates in its
order of preference, and a config is rendered, launched and fingerprinted by the formulation it
names, into a KernelPlan (kernels/plan.py).
"""
from __future__ import annotations

import json
from collections import Counter
from typing import TYPE_CHECKING, Any, Iterator, Mapping, Sequence

from autocnn.device import DeviceLimits
from autocnn.errors import InfeasibleConfigError, InvalidConfigError
from autocnn.kernels.codegen import code_source, render_family, template_fingerprint
from autocnn.kernels.plan import KernelPlan
from autocnn.kernels.rules import Refusal, refusal
from autocnn.kernels.space import Config, Constraint, Param, SearchSpace
from autocnn.kernels.steps import WORKSPACE_ELEMENT
from autocnn.precision import KernelTypes, precision_of

if TYPE_CHECKING:
    from autocnn.kernels.formulations.base import Formulation, OpFormulation


class Operation:
    """Base of the five operations. An operation holds what its problem decides (inputs, outputs,
    the op template's variables, flops) and composes the formulations registered for it
    (formulations/base.py): its space is the union of theirs, and a config is planned, launched
    and fingerprinted by the formulation it names."""

    name: str = ""
    family: str = ""                                # the op template: templates/<family>.cu.j2
    problem_type: type = object
    inputs: tuple[str, ...] = ()
    outputs: tuple[str, ...] = ()
    # What the op template includes besides the formulation's: the helpers, the element types'
    # loads and stores, and the problems' constants.
    shared_templates: tuple[str, ...] = ("_common.cuh.j2", "_common_elements.cuh.j2", "_problem_constants.cuh.j2")

    def __init__(self, registry: Sequence["Formulation"]):
        self.formulations: tuple["OpFormulation", ...] = tuple(
            f.for_op(self.name) for f in registry if f.serves(self.name))
        if not self.formulations:
            raise ValueError(f"no formulation is registered for {self.name}")
        names = self.formulation_names
        if len(set(names)) != len(names):
            raise ValueError(f"{self.name}: two formulations answer to one name in {names}")
        self._code_sources: dict[str, tuple[str, ...]] = {}
        self._code_digests: dict[tuple[str, str, str], str] = {}

    # -- what subclasses provide ------------------------------------------------------------
    def default_candidates(self, problem: Any) -> Sequence[dict[str, Any]]:
        """Configs to try in order for the heuristic default; the last must fit every problem.
        By default each formulation's, in registration order; an operation with a preference
        orders them with ``candidates`` and ``candidates_besides``."""
        return [c for f in self.formulations for c in f.default_candidates(problem)]

    def _problem_context(self, problem: Any) -> dict[str, Any]:
        """Variables of the op template (and every formulation's) beyond the problem itself."""
        return {}

    def _codegen_helpers(self) -> tuple:
        """Functions and constants, besides _problem_context, that decide the code every formulation
        of this operation generates (they are hashed into every fingerprint)."""
        return ()

    def flops(self, problem: Any) -> int:
        raise NotImplementedError

    def min_bytes(self, problem: Any) -> int:
        """Bytes that must cross device memory at least once: each input read and each output written."""
        raise NotImplementedError

    # -- the formulations --------------------------------------------------------------------
    @property
    def formulation_names(self) -> tuple[str, ...]:
        """The values of the "formulation" parameter, in registration order."""
        return tuple(n for f in self.formulations for n in f.names)

    def formulation(self, name: str) -> "OpFormulation":
        """The formulation a config value (e.g. "two_pass") or a formulation's name (e.g. "igemm") selects."""
        for f in self.formulations:
            if name in f.names:
                return f
        for f in self.formulations:
            if name == f.formulation:
                return f
        raise KeyError(f"{self.name} has no formulation {name!r}; it has {', '.join(self.formulation_names)}")

    def formulation_of(self, config: Config | Mapping[str, Any]) -> "OpFormulation | None":
        """The formulation a config names (the only one, for an operation with one), or None."""
        if len(self.formulations) == 1:
            return self.formulations[0]
        name = config.get("formulation")
        return next((f for f in self.formulations if isinstance(name, str) and name in f.names), None)

    def candidates(self, problem: Any, formulation: str) -> list[dict[str, Any]]:
        """One formulation's default candidates (none when it is not registered for this operation)."""
        try:
            return list(self.formulation(formulation).default_candidates(problem))
        except KeyError:
            return []

    def candidates_besides(self, problem: Any, formulations: Sequence[str]) -> list[dict[str, Any]]:
        """The default candidates of the formulations not named, in registration order: where an
        operation's preference order does not place a formulation, it comes last."""
        return [c for f in self.formulations if f.formulation not in formulations
                for c in f.default_candidates(problem)]

    # -- shared behaviour --------------------------------------------------------------------
    def check_problem(self, problem: Any) -> None:
        if not isinstance(problem, self.problem_type):
            raise TypeError(f"{self.name} takes a {self.problem_type.__name__}, not {type(problem).__name__}")

    def space(self, problem: Any, limits: DeviceLimits) -> SearchSpace:
        self.check_problem(problem)
        return compose_space(self.name, self.formulations, problem, limits)

    def default_config(self, problem: Any, limits: DeviceLimits, formulation: str | None = None) -> Config:
        """The first default candidate that fits (of one formulation's, if named)."""
        for config in self.default_configs(problem, limits, formulation):
            return config
        raise AssertionError("default_configs raises when nothing fits")

    def default_configs(self, problem: Any, limits: DeviceLimits, formulation: str | None = None) -> Iterator[Config]:
        """Every default candidate that fits statically, in preference order (a lookup walks them
        until ptxas's report of one shows it runs without spills). Raises when none fits."""
        self.check_problem(problem)
        space = self.space(problem, limits)
        reasons: list[str] = []
        candidates = self.default_candidates(problem) if formulation is None else self.candidates(problem, formulation)
        fitted = 0
        for candidate in candidates:
            try:
                config = space.validate(candidate)
            except InfeasibleConfigError as exc:
                reasons.extend(exc.reasons)
                continue
            except InvalidConfigError as exc:   # a tile the space leaves out for this problem
                reasons.append(str(exc))
                continue
            fitted += 1
            yield config
        if not fitted:
            # Reaching this is a bug in the candidate list, which tests check for every seed shape.
            raise InfeasibleConfigError(self.name, ["no default candidate fits: " + "; ".join(reasons)])

    def refusals(self, problem: Any, limits: DeviceLimits) -> dict[str, str]:
        """Why each formulation that cannot serve ``problem`` at all (its precision, its channel
        groups or dilation, its layout: rules.Refusal) refuses it, by each value of "formulation" that selects it; the others are
        not in it. Read before any config is drawn: what a run holds to a formulation, or runs an
        operation none of whose formulations serve, is refused before a GPU opens."""
        out: dict[str, str] = {}
        for f in self.formulations:
            why = f.grouping_refusal(problem) or f.layout_refusal(problem) or refusal(f.constraints(problem, limits))
            if why is not None:
                out.update({name: why for name in f.names})
        return out

    def template_files(self, formulation: "OpFormulation") -> tuple[str, ...]:
        """Every template file a config of this formulation renders from."""
        return (f"{self.family}.cu.j2", *self.shared_templates, *formulation.templates)

    def _formulation_code(self, formulation: "OpFormulation") -> tuple[str, ...]:
        # The source of the Python that decides a formulation's code and launches: read once (the
        # source does not change under a running process, and lookups ask for it per record).
        key = formulation.formulation
        if key not in self._code_sources:
            parts = [Operation.plan, KernelTypes.of, self._problem_context, *self._codegen_helpers(),
                     formulation.context, formulation.launches, formulation.buffers, *formulation.code_helpers()]
            self._code_sources[key] = tuple(code_source(p) for p in parts)
        return self._code_sources[key]

    def fingerprint(self, formulation: str | None = None) -> str:
        """With a formulation (a config value or a formulation's name): the hash of everything that
        decides its code: the op template, the shared includes, its templates and its Python. Without:
        one hash of all of them (what an Optuna study is named by). A record's key holds the
        fingerprint of its config's formulation, so adding or changing one formulation leaves the
        records of the others current. An operation with one formulation has one fingerprint."""
        if formulation is not None or len(self.formulations) == 1:
            f = self.formulation(formulation) if formulation is not None else self.formulations[0]
            return template_fingerprint(self.template_files(f), self._formulation_code(f))
        each = tuple(f"{f.formulation}:{self.fingerprint(f.names[0])}" for f in self.formulations)
        return template_fingerprint((), each)

    def config_fingerprint(self, config: Config | Mapping[str, Any]) -> str | None:
        """The fingerprint of the code a config generates (its formulation's); None when the config
        names no formulation of this operation."""
        f = self.formulation_of(config)
        return None if f is None else self.fingerprint(f.names[0])

    def key_fingerprint(self, fingerprint: str) -> str:
        """What a record key's fingerprint counts as when keys are compared: any formulation's
        current one counts as the operation's (one record per shape and GPU, whichever formulation
        won: a new winner replaces it), an old one as itself (a stale record stays apart)."""
        current = {self.fingerprint(f.names[0]) for f in self.formulations}
        return self.fingerprint() if fingerprint in current else fingerprint

    def workspace_bytes(self, problem: Any, config: Config) -> int:
        """The scratch memory a config's plan allocates (KernelPlan.workspace_bytes), without rendering."""
        _zero, workspaces = self.formulation_of(config).buffers(problem, config)
        return WORKSPACE_ELEMENT.size * sum(n for _, n in workspaces)

    def code_digest(self, problem: Any, config: Config) -> str:
        """``plan(problem, config).code_digest``, computed once per process for each problem,
        config and fingerprint (loading a database asks it of every record whose fingerprint is
        old, and rendering takes milliseconds)."""
        key = (str(self.config_fingerprint(config)), json.dumps(problem.to_dict(), sort_keys=True), config.key())
        digest = self._code_digests.get(key)
        if digest is None:
            digest = self.plan(problem, config).code_digest
            if len(self._code_digests) >= 4096:   # bounded: a long tuning run makes many records
                self._code_digests.clear()
            self._code_digests[key] = digest
        return digest

    def plan(self, problem: Any, config: Config) -> KernelPlan:
        """Render the kernel for a validated config and describe how to launch it."""
        self.check_problem(problem)
        if config.op != self.name:
            raise ValueError(f"a {config.op} config cannot plan {self.name}")
        formulation = self.formulation_of(config)
        context = {
            "op": self.name, "family": self.family, "shape": problem.shape_string(),
            "config_text": str(config), "p": problem, "c": config.as_dict(),
            "t": KernelTypes.of(precision_of(problem)),
        }
        # Config values are also top-level names: the shared cores are written in terms of them.
        context.update(config.as_dict())
        context.update(self._problem_context(problem))
        context.update(formulation.context(problem, config))
        context["formulation_template"] = formulation.templates[0]
        launches = formulation.launches(problem, config)
        context["planned_threads"] = launches[0].threads
        context["planned_smem"] = max(launch.shared_bytes for launch in launches)
        fingerprint = self.fingerprint(formulation.names[0])
        source = render_family(self.family, context, fingerprint)
        zero, workspaces = formulation.buffers(problem, config)
        return KernelPlan(
            op=self.name, problem=problem, config=config, source=source, fingerprint=fingerprint,
            launches=launches, inputs=self.inputs, outputs=self.outputs,
            zero_first=zero, workspaces=workspaces, target_suffix=formulation.compile_suffix(config),
        )


def compose_space(op: str, formulations: Sequence["OpFormulation"], problem: Any,
                  limits: DeviceLimits) -> SearchSpace:
    """The union of the formulations' spaces: a "formulation" parameter first (where there are
    several), then each formulation's parameters, active when it is chosen, in registration order.
    A parameter name several formulations share becomes one parameter with all their choices; each
    formulation is held to its own choices, and its constraints that touch a shared parameter
    apply to its own configs only."""
    if len(formulations) == 1:
        f = formulations[0]
        mine = f.params(problem)
        return SearchSpace(op, mine, [*f.constraints(problem, limits), *_grouping_refusals(f, problem, mine[0].name)])
    doc = "; ".join(f"{'/'.join(f.names)}: {f.summary}" for f in formulations)
    params: dict[str, Param] = {"formulation": Param("formulation", tuple(n for f in formulations for n in f.names), doc)}
    own = [(f, f.params(problem)) for f in formulations]
    for f, mine in own:
        for p in mine:
            first = params.get(p.name)
            if first is None:
                params[p.name] = Param(p.name, p.choices, p.doc, (("formulation", f.names), *p.active_if))
            else:
                when = dict(first.active_if)
                theirs = {k: v for k, v in when.items() if k != "formulation"}
                if theirs != dict(p.active_if):
                    # One parameter has one activity rule: differing conditions would switch it on or
                    # off for the wrong formulation (a required value it does not use, or none).
                    raise ValueError(f"{op}: parameter {p.name} of {f.formulation} is active under "
                                     f"{dict(p.active_if) or 'no condition'}, but under {theirs or 'no condition'} "
                                     f"in a formulation registered before it: give one of them its own name")
                when["formulation"] = (*when["formulation"], *f.names)
                choices = (*first.choices, *(c for c in p.choices if c not in first.choices))
                params[p.name] = Param(p.name, choices, first.doc, tuple(when.items()))
    declared = Counter(p.name for _, mine in own for p in mine)
    shared = {name for name, n in declared.items() if n > 1}
    constraints: list[Constraint] = []
    for f, mine in own:
        for c in [*f.constraints(problem, limits), *_grouping_refusals(f, problem, "formulation")]:
            constraints.append(_scoped(c, f.names) if shared.intersection(c.params) else c)
        constraints += [_own_choices(p, f.names) for p in mine if params[p.name].choices != p.choices]
    return SearchSpace(op, list(params.values()), constraints)


def _grouping_refusals(f: "OpFormulation", problem: Any, param: str) -> list[Constraint]:
    """The formulation's refusal of the problem's channel groups or dilation, or of its layout, as a
    rule on ``param`` ("formulation", or a parameter of the only formulation), scoped to its configs;
    none where it serves them, so a dense NCHW problem's space is what it was."""
    reason = f.grouping_refusal(problem) or f.layout_refusal(problem)
    if reason is None:
        return []
    if param == "formulation":
        return [Refusal((param,), lambda value: reason if value in f.names else None, reason)]
    return [Refusal((param,), lambda _value: reason, reason)]


def _scoped(constraint: Constraint, names: tuple[str, ...]) -> Constraint:
    """The constraint, applied only to configs of the formulation called ``names``."""
    if "formulation" in constraint.params:
        at = constraint.params.index("formulation")
        return Constraint(constraint.params, lambda *v: None if v[at] not in names else constraint.check(*v))
    return Constraint(("formulation", *constraint.params),
                      lambda f, *v: None if f not in names else constraint.check(*v))


def _own_choices(param: Param, names: tuple[str, ...]) -> Constraint:
    return Constraint(("formulation", param.name),
                      lambda f, v: None if f not in names or v in param.choices
                      else f"{param.name}={v} is not one of {f}'s choices {list(param.choices)}")
