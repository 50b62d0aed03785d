"""What a pass is: its contract with the runner (`fxopt.pipeline`).

A pass is a function ``name(gm, ctx) -> PassResult``; its function name is its name and its
flag in `fxopt.config.Options` has the same name. It reads and rewrites ``gm`` (the runner
hands it a private copy, so a pass that raises half-way leaves the user's graph intact), and
returns the graph module, whether it changed anything, and its :class:`Verdicts`: what it
matched (per kind, a count and bytes) and what it declined (per site, the reason), the one
vocabulary explain, the debug dump and the tests read (README.md here); ``stats`` holds only
what is the pass's own (a plan, a search's table). Cross-cutting work (flags, timing, lint,
recompile, snapshots, failure handling) is the runner's, never the pass's. The rules a pass
keeps are in README.md here.
"""

from __future__ import annotations

import enum
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
import torch.fx as fx

from fxopt.codegen import Codegen, resolve_codegen

if TYPE_CHECKING:
    from fxopt.analysis.memory import MemoryEstimate
    from fxopt.config import Options
    from fxopt.planner.ledger import BudgetLedger

__all__ = ["Stage", "GraphKind", "PassResult", "PassContext", "PassSpec", "RewriteCounter",
           "Matched", "Decline", "Verdicts", "WHOLE_GRAPH", "REMOVED_SAVED_BYTES"]


# The stat by which a pre-autograd pass says how many of plain autograd's saved bytes it
# took out of the graph (recompute_rnn): swap_recompute adds them back to a fraction's base,
# so that the fraction stays one of eager's bytes, not of what is left after the rewrite.
REMOVED_SAVED_BYTES = "plain_saved_bytes_removed"


class Stage(str, enum.Enum):
    """Where in the pipeline a pass runs; the order here is the pipeline's order."""

    PRE_AUTOGRAD = "pre_autograd"  # Dynamo's torch-level graph, before AOTAutograd
    JOINT = "joint"                # AOTAutograd's joint forward+backward graph, before partition
    FORWARD = "forward"            # the partitioned forward graph (or the inference graph)
    BACKWARD = "backward"          # the partitioned backward graph


class GraphKind(str, enum.Enum):
    """Which graph a stage is looking at (an inference graph goes through the FORWARD stage)."""

    DYNAMO = "dynamo"
    JOINT = "joint"
    FORWARD = "forward"
    BACKWARD = "backward"
    INFERENCE = "inference"


@dataclass
class RewriteCounter:
    """Counts a pass's rewrites and stops them after ``limit`` (bisecting a bad rewrite).

    A pass calls :meth:`allow` before each rewrite and skips the rewrite when it says no; the
    ``rewrite_limit`` option ({"pass": N}) sets the limit.
    """

    limit: int | None = None
    done: int = 0
    refused: int = 0

    def allow(self) -> bool:
        if self.limit is not None and self.done >= self.limit:
            self.refused += 1
            return False
        self.done += 1
        return True


@dataclass
class PassContext:
    """What a pass may know about the graph it is given, beyond the graph itself."""

    options: Options
    stage: Stage
    graph_kind: GraphKind
    graph_name: str                  # e.g. "g0/forward": Dynamo graph index / kind
    device: torch.device             # where the graph's tensors live (cpu when it has none)
    example_inputs: tuple[Any, ...] = ()
    # Predicted step memory for a graph of this stage (None where it cannot be predicted,
    # e.g. before autograd). The runner calls it before and after each pass.
    estimate_memory: Callable[[fx.GraphModule], MemoryEstimate | None] = lambda gm: None
    rewrites: RewriteCounter = field(default_factory=RewriteCounter)
    # Stage-specific facts: at the joint stage {"num_fwd_outputs": 3, REMOVED_SAVED_BYTES:
    # the sum of that stat over the graph's pre-autograd passes that fired}.
    facts: dict[str, Any] = field(default_factory=dict)
    # The model's fraction budget, shared by the graphs one Backend compiles
    # (fxopt.planner.ledger); None: this graph alone.
    budget_ledger: BudgetLedger | None = None
    # The code generator, resolved once per graph by the compiler (None: resolved here from
    # the options and the device, as the compiler does); passes read its properties.
    codegen: Codegen | None = None

    def __post_init__(self) -> None:
        if self.codegen is None:
            self.codegen = resolve_codegen(self.options, self.device)

    @property
    def is_cuda(self) -> bool:
        return self.device.type == "cuda"


# The site of a decline that concerns the whole graph (no codegen for it, no budget set).
WHOLE_GRAPH = "(graph)"


@dataclass(frozen=True)
class Matched:
    """What a pass rewrote of one kind: how many sites, and the bytes the rewrites take out
    of the step (saved for backward, or moved; 0 where the pass saves no bytes)."""

    count: int = 0
    bytes: int = 0


@dataclass(frozen=True)
class Decline:
    """A site a pass looked at and left alone: the node (or :data:`WHOLE_GRAPH`) and why."""

    site: str
    reason: str


@dataclass
class Verdicts:
    """What a pass did, in the one vocabulary every pass reports: ``matched`` per kind of
    site (a count and bytes), ``declined`` per site (the reason). A pass records each
    verdict where it makes it (:meth:`match`, :meth:`decline`: one place per decision); the
    runner logs each decline at DEBUG on ``fxopt.pipeline`` (the "why not" of a node)."""

    matched: dict[str, Matched] = field(default_factory=dict)
    declined: list[Decline] = field(default_factory=list)

    def match(self, kind: str, *, bytes: int = 0, count: int = 1) -> None:
        before = self.matched.get(kind, Matched())
        self.matched[kind] = Matched(before.count + count, before.bytes + bytes)

    def decline(self, site: str, reason: str) -> None:
        self.declined.append(Decline(site, reason))

    @property
    def count(self) -> int:
        """Sites matched, of every kind."""
        return sum(m.count for m in self.matched.values())

    def counts(self) -> dict[str, int]:
        """kind -> sites matched."""
        return {kind: m.count for kind, m in self.matched.items()}

    def reasons(self) -> dict[str, int]:
        """reason -> sites declined for it (in first-seen order)."""
        return dict(Counter(d.reason for d in self.declined))

    def as_dict(self) -> dict[str, Any]:
        """Plain data (the debug dump's index)."""
        return {"matched": {k: {"count": m.count, "bytes": m.bytes}
                            for k, m in self.matched.items()},
                "declined": [{"site": d.site, "reason": d.reason} for d in self.declined]}


@dataclass
class PassResult:
    """A pass's answer: the (possibly new) graph module, whether it changed, its
    :class:`Verdicts`, and ``stats``: plain data that is the pass's own (a plan, a search's
    table), never what the verdicts say."""

    graph_module: fx.GraphModule
    modified: bool
    verdicts: Verdicts = field(default_factory=Verdicts)
    stats: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.verdicts, Verdicts):
            raise TypeError(f"fxopt: PassResult's third argument is the pass's Verdicts, got "
                            f"{type(self.verdicts).__name__}; give plain data as stats=...")

    @classmethod
    def declined_graph(cls, gm: fx.GraphModule, reason: str,
                       stats: dict[str, Any] | None = None) -> PassResult:
        """The whole graph left alone, and why (no budget set, no generator to run on)."""
        verdicts = Verdicts()
        verdicts.decline(WHOLE_GRAPH, reason)
        return cls(gm, False, verdicts, dict(stats or {}))


PassFn = Callable[[fx.GraphModule, PassContext], PassResult]


@dataclass(frozen=True)
class PassSpec:
    """A pass as the registry lists it.

    ``default`` decides whether the pass runs when its flag is unset (None);
    ``default_text`` says the same in words for `fxopt passes`. ``flag`` is None for
    internal passes, which ``default`` alone decides.
    """

    name: str
    stages: tuple[Stage, ...]
    description: str
    run: PassFn
    default: Callable[[PassContext], bool] = lambda ctx: False
    default_text: str = "off"
    flag: str | None = None

    def decide(self, ctx: PassContext) -> tuple[bool, str]:
        """Whether to run on this graph, and why, in words for the report."""
        if ctx.stage not in self.stages:
            return False, f"runs at stage {'/'.join(s.value for s in self.stages)}"
        value = getattr(ctx.options, self.flag) if self.flag else None
        if value is True:
            return True, "on (option)"
        if value is False:
            return False, "off (option)"
        on = self.default(ctx)
        return on, f"default: {self.default_text}"
