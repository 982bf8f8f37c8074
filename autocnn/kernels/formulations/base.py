"""What a formulation is, and how to add one.

A formulation is one way of computing operations: a direct tiled correlation, an implicit GEMM, a
gather per output position... Everything that decides its code lives in its folder, beside its
templates:

    formulations/<name>/__init__.py         a Formulation: its name, and an OpFormulation per
                                            operation it serves
    formulations/<name>/<name>_<op>.cu.j2   the kernels of one operation (the glue between the
                                            operation's tensors and the formulation's core); the op
                                            template (templates/<op>.cu.j2, the problem's constants
                                            and what every formulation shares) includes it
    formulations/<name>/_<core>.cuh.j2      a core of its own that its operations share, if any

What several formulations share (a GEMM core's rules, sizes and templates, the staging of operands,
transforms) lives in formulations/cores/, which each of them imports or includes (its __init__.py
lists what is there), not in one of them. A template is named by its file name alone, wherever it
lives (kernels/codegen.py finds it; two files of one name are an error).

An OpFormulation says, for one operation:

    names                         the values of the operation's "formulation" parameter that select
                                  it: usually the formulation's name; conv_wgrad's implicit GEMM answers
                                  to "atomic" and "two_pass" (how its split sums meet), the values
                                  stored records carry
    templates                     its own template files; the first is the one the op template includes
    params(problem)               its parameters; the operation makes them conditional on "formulation"
    constraints(problem, limits)  static feasibility: threads, shared memory, registers, grid limits
    default_candidates(problem)   configs for the heuristic default, most preferred first
    context(problem, config)      template variables beyond the problem, the config and the op's own
    launches(problem, config)     each kernel's grid, block, shared memory and arguments, in order
    buffers(problem, config)      (buffers to zero before the first launch, workspaces)
    code_helpers()                the other functions, classes and constants that decide its code or
                                  launches (their source goes into the fingerprint)

To add a formulation: make its folder, formulations/<name>/, with its module (__init__.py) and its
templates (a file name no other template has), add its package to pyproject.toml's packages, and
append its Formulation to the end of REGISTRY (or to the registry of its operations) in
formulations/__init__.py, and its name to tests/test_formulation_order.py: the order of a registry
is stored (choice indices), so nothing is inserted before what is there. Each operation it serves
then offers it after the ones registered before it (the defaults of today's shapes do not change
unless the operation's preference order names it), and records of other formulations stay current:
a record's fingerprint hashes only the op template, the shared includes, the templates of its
config's formulation and the source of that formulation's context, launches, buffers and
code_helpers (Operation.fingerprint).

Parameter names may repeat across the formulations of one operation (an implicit GEMM on tensor
cores has tiles BM, BN, BK too): the operation merges them into one parameter with every choice,
restricts each formulation to its own choices, and applies each formulation's constraints to its
own configs only. An operation with a single formulation has no "formulation" parameter (its
configs name none). A formulation that serves only some problems of an operation (a precision, an
architecture) says so with a constraint whose reason tells the user why. Channel groups and
dilation are refused for every formulation by default (OpFormulation.grouping_refusal, which the
operation adds to its rules); one that serves them overrides it. So are layouts other than NCHW
(OpFormulation.layout_refusal): one that serves them lists them in ``layouts``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from autocnn.device import DeviceLimits
from autocnn.kernels.geometry import next_pow2
from autocnn.kernels.space import Config, Constraint, Param
from autocnn.kernels.steps import Launch
from autocnn.layout import NCHW, Layout, layout_of

FULL_UNROLL = 0   # an unroll value of 0 renders as a plain "#pragma unroll" (unroll completely)

Buffers = tuple[tuple[str, ...], tuple[tuple[str, int], ...]]


def choices_upto(choices: tuple[int, ...], bound: int) -> tuple[int, ...]:
    """The choices not above ``bound`` (the smallest always stays)."""
    kept = tuple(c for c in choices if c <= bound)
    return kept or choices[:1]


def choices_with_own(choices: tuple[int, ...], n: int, bound: int = 16) -> tuple[int, ...]:
    """The (ascending) choices up to n's next power of two, plus n itself when it is at most
    ``bound``: 5 filters should not pay for a tile of 8."""
    return tuple(sorted(set(choices_upto(choices, next_pow2(n))) | ({n} if n <= bound else set())))


def grouping_text(problem: Any) -> str:
    """A convolution's groups and dilation as the refusals name them."""
    dh, dw = problem.dilation
    return f"groups={problem.groups}, dilation={dh if dh == dw else f'{dh},{dw}'}"


def pragma_unroll(value: int) -> str:
    """An unroll parameter as the argument of "#pragma unroll": 0 (FULL_UNROLL) unrolls completely."""
    return "" if value == FULL_UNROLL else str(value)


class OpFormulation:
    """How one formulation computes one operation. Subclasses set the class attributes and
    override what applies; the defaults are those of a formulation without extras."""

    formulation: str = ""                 # the name of the Formulation it belongs to
    op: str = ""                          # the operation it computes
    summary: str = ""                     # a few words for the "formulation" parameter's description
    templates: tuple[str, ...] = ()       # its own template files; the first is included by the op template
    target_suffix: str = ""               # "a": compiled for the architecture-specific target (sm_90a)
    layouts: tuple[Layout, ...] = (NCHW,)  # the layouts (autocnn/layout.py) whose problems it computes

    @property
    def names(self) -> tuple[str, ...]:
        """Values of the operation's "formulation" parameter that select it."""
        return (self.formulation,)

    def params(self, problem: Any) -> list[Param]:
        return []

    def constraints(self, problem: Any, limits: DeviceLimits) -> list[Constraint]:
        return []

    def default_candidates(self, problem: Any) -> list[dict[str, Any]]:
        return []

    def context(self, problem: Any, config: Config) -> dict[str, Any]:
        return {}

    def launches(self, problem: Any, config: Config) -> tuple[Launch, ...]:
        raise NotImplementedError

    def buffers(self, problem: Any, config: Config) -> Buffers:
        return (), ()

    def code_helpers(self) -> tuple:
        return ()

    def grouping_refusal(self, problem: Any) -> str | None:
        """Why it cannot compute ``problem``'s channel groups or dilation (the operation turns this
        into a rules.Refusal); None where it can. Every formulation computes dense, undilated
        convolutions; one that serves more says so here."""
        if not getattr(problem, "grouped_or_dilated", False):
            return None
        return (f"{self.formulation} computes dense, undilated convolutions only (groups=1, dilation=1; "
                f"{grouping_text(problem)} given): its index maps read all C channels for every filter, "
                "at consecutive taps")

    def layout_refusal(self, problem: Any) -> str | None:
        """Why it cannot compute ``problem`` in its layout (the operation turns this into a
        rules.Refusal, as grouping_refusal's); None where ``layouts`` holds it."""
        layout = layout_of(problem)
        if layout in self.layouts:
            return None
        served = ", ".join(f"{s.name} ({s.activation_axes} activations, {s.filter_axes} filters)" for s in self.layouts)
        return (f"{self.formulation} computes {self.op} in the {served} layout only ({layout.name} given): "
                f"its index maps read and write that memory order")

    def compile_suffix(self, config: Config) -> str:
        """The target suffix a config is compiled for: the formulation's, unless some of its
        configs need the architecture-specific target and others not (winograd's wgmma products)."""
        return self.target_suffix


@dataclass(frozen=True)
class Formulation:
    """One formulation: its name and how it computes each operation it serves."""

    name: str
    implementations: tuple[OpFormulation, ...]

    def __post_init__(self) -> None:
        ops = [i.op for i in self.implementations]
        if len(set(ops)) != len(ops):
            raise ValueError(f"formulation {self.name} implements an operation twice: {ops}")
        for i in self.implementations:
            if i.formulation != self.name:
                raise ValueError(f"{type(i).__name__} belongs to {i.formulation!r}, not {self.name!r}")

    @property
    def ops(self) -> tuple[str, ...]:
        return tuple(i.op for i in self.implementations)

    def serves(self, op: str) -> bool:
        return op in self.ops

    def for_op(self, op: str) -> OpFormulation:
        for i in self.implementations:
            if i.op == op:
                return i
        raise KeyError(f"formulation {self.name} does not compute {op}")
