"""Which code generator compiles a graph: ``codegen="auto"`` resolved for its device.

fx code generation runs the final graphs as fx Python calling aten ops (and fxopt's own
kernels): one kernel per op, readable, quick to compile, and the only path where
fuse_elementwise's kernels run. Inductor fuses pointwise ops into generated C++/Triton
kernels, so it never stores the intermediates eager (and the fx path) stores, and on CUDA
it saves a launch and a memory round trip per pointwise op.

"auto" takes Inductor, on the CPU and on CUDA, with or without a budget: a fraction is met
by Inductor's budgeted min-cut (:mod:`fxopt.passes.swap_recompute.inductor_budget`), a
byte budget's plan is applied as recompute tags min-cut honours and swaps whose copies
overlap compute as under fx (:mod:`fxopt.runtime.swap`), bounded by the memory
simulation's model of Inductor's buffers
(:func:`fxopt.analysis.memory.inductor_buffers`), tempo inserts its aten-only forms, and
``fxopt plan`` captures with the generator compilation resolves, so a saved plan replays
there. Each reason names the results file that measured the choice. fx stays where it is
asked for: ``codegen="fx"`` (debugging, fast compiles) and ``fuse_elementwise=True`` (its
kernels run only there).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx as fx

from fxopt import _compat
from fxopt.config import Options

__all__ = ["Codegen", "FX", "INDUCTOR", "as_codegen", "graph_device", "peak_target",
           "resolve_codegen", "BYTES_EVIDENCE", "CUDA_EVIDENCE", "FRACTION_EVIDENCE",
           "PEAK_EVIDENCE", "TEMPO_EVIDENCE"]

# the measurements each choice of "auto" rests on, named in its reason
CUDA_EVIDENCE = "benchmarks/results/gpu_h100_2026-11-26.md"
BYTES_EVIDENCE = "benchmarks/results/inductor_budgets_cpu.md"
FRACTION_EVIDENCE = "benchmarks/results/budget_frontier_cpu.md"
PEAK_EVIDENCE = "benchmarks/results/default_peak_cpu.md"
TEMPO_EVIDENCE = "benchmarks/results/inductor_budgets_cpu.md"
# Codegen.peak_margin under Inductor: above the largest excess of its measured peak over
# the simulated one in BYTES_EVIDENCE
INDUCTOR_PEAK_MARGIN = 0.05


def peak_target(bound_bytes: int, margin: float) -> int:
    """The simulated peak a byte bound holds a plan to: the bound less the code generator's
    margin (:attr:`Codegen.peak_margin`), for the planner, the fused loss's pieces and the
    re-plan of a larger call alike."""
    return bound_bytes - int(bound_bytes * margin)


@dataclass(frozen=True)
class Codegen:
    """The code generator of one graph, resolved once (:func:`resolve_codegen`) and read
    everywhere through its named properties: no other module compares a generator's name
    or reads ``options.codegen`` (tests/test_layout.py checks it).

    ``reason`` says why it was chosen, in words for explain; it takes no part in equality.
    """

    name: str  # "fx" | "inductor"
    reason: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        if self.name not in ("fx", "inductor"):
            raise ValueError(f"fxopt: codegen {self.name!r} is neither 'fx' nor 'inductor'")

    def __str__(self) -> str:
        return self.name

    @property
    def _inductor(self) -> bool:
        return self.name == "inductor"

    @property
    def compiles_by_inductor(self) -> bool:
        """Whether the final graphs go to Inductor's per-graph compiler (in its graph
        context) rather than run as fx Python."""
        return self._inductor

    @property
    def fuses_pointwise(self) -> bool:
        """Whether the generator fuses pointwise ops itself: tempo then inserts the ops'
        aten-only forms it can fuse, and fuse_elementwise declines."""
        return self._inductor

    @property
    def partitions_by_min_cut(self) -> bool:
        """Whether the joint graph is partitioned by Inductor's min-cut (which recomputes
        what it fuses; a fraction budget is then met there) rather than by AOTAutograd's
        default partition (save what autograd saves)."""
        return self._inductor

    @property
    def models_fused_buffers(self) -> bool:
        """Whether the memory simulation models Inductor's fused buffers (values that
        generated code never stores) instead of storing every node's value."""
        return self._inductor

    @property
    def peak_margin(self) -> float:
        """The share of a byte budget a plan leaves free for the generator's own kernel
        order. fx code runs the graph's order, which the memory simulation follows: none.
        Inductor orders its fused kernels itself (an extern matmul after the kernels that
        read its neighbours, a fused norm backward after the attention it spans), which
        keeps some buffers longer than the graph's order does: its measured peak was above
        the simulated one by less than this (:data:`BYTES_EVIDENCE`)."""
        return INDUCTOR_PEAK_MARGIN if self._inductor else 0.0

    @property
    def partitioner(self) -> Callable[..., tuple[fx.GraphModule, fx.GraphModule]]:
        """The partition function compilation uses for this generator."""
        return (_compat.inductor_partition if self.partitions_by_min_cut
                else _compat.default_partition)

    def decompositions(self) -> dict[Any, Callable[..., Any]]:
        """The decompositions AOTAutograd traces with: Inductor's for Inductor, none for
        fx code generation (aten as the model calls it)."""
        return _compat.inductor_decompositions() if self._inductor else {}

    def trace(self, gm: fx.GraphModule, example_inputs: Sequence[Any], *,
              partition: Callable[..., Any] | None = None,
              fw_compiler: Callable[..., Any] | None = None,
              bw_compiler: Callable[..., Any] | None = None,
              inference_compiler: Callable[..., Any] | None = None) -> Any:
        """AOTAutograd on ``gm`` with compilation's flags for this generator (its
        decompositions, input mutations kept, Inductor's graph context under Inductor):
        ``partition`` (default: :attr:`partitioner`) gets the joint graph, the compilers
        (default: run as fx Python) the partitioned graphs; AOTAutograd's callable. The one
        caller of AOTAutograd (tests/test_layout_decisions.py), so every capture of a step
        (compilation, ``fxopt plan``, explain's plain baseline, tempo='auto''s variants)
        traces the joint graph compilation traces."""
        def as_is(g: fx.GraphModule, _: Any) -> Any:
            return _compat.boxed_fx_callable(g)

        compilers = {} if inference_compiler is None else {
            "inference_compiler": inference_compiler}
        aot = _compat.aot_autograd(
            fw_compiler=fw_compiler or as_is, bw_compiler=bw_compiler or as_is,
            partition_fn=partition or self.partitioner, decompositions=self.decompositions(),
            keep_inference_input_mutations=True, **compilers)
        with (_compat.inductor_graph_context(example_inputs) if self.compiles_by_inductor
              else contextlib.nullcontext()):
            return aot(gm, list(example_inputs))


FX = Codegen("fx")
INDUCTOR = Codegen("inductor")


def as_codegen(value: Codegen | str) -> Codegen:
    """``value`` as a :class:`Codegen`: the analyses and the planner take a resolved one, or
    a generator's name from a direct caller (a test, a script)."""
    return value if isinstance(value, Codegen) else Codegen(value, "given by name")


def graph_device(example_inputs: Sequence[Any]) -> torch.device:
    """The device a graph's code is generated for: its inputs' accelerator, else the CPU."""
    devices = {v.device for v in example_inputs if isinstance(v, torch.Tensor)}
    accelerators = sorted((d for d in devices if d.type != "cpu"), key=str)
    return accelerators[0] if accelerators else torch.device("cpu")


def resolve_codegen(options: Options, device: torch.device) -> Codegen:
    """The code generator for a graph on ``device`` under the user's ``options``, with why
    in words for explain: the one resolution of ``codegen="auto"``."""
    name, reason = _choose(options, device)
    return Codegen(name, reason)


def _choose(options: Options, device: torch.device) -> tuple[str, str]:
    if options.codegen != "auto":
        return options.codegen, "set by the codegen option"
    if options.inductor_max_autotune:
        return "inductor", "auto: inductor_max_autotune asks for Inductor's tuned kernels"
    if options.fuse_elementwise is True:
        return "fx", ("auto: fuse_elementwise=True asks for fxopt's fused kernels, which "
                      "run under fx code generation (Inductor fuses on its own)")
    if device.type == "cuda":
        return "inductor", (f"auto: on CUDA Inductor's fused kernels make the step faster "
                            f"than fx's one kernel per op ({CUDA_EVIDENCE})")
    budget = options.memory_budget
    if budget is not None and budget.fraction is not None:
        if options.tempo in (True, "auto"):
            return "inductor", (f"auto: tempo under a fraction memory_budget: Inductor's "
                                f"min-cut with tempo's fusible forms keeps no more than "
                                f"the budget alone ({TEMPO_EVIDENCE})")
        return "inductor", (f"auto: under a fraction memory_budget Inductor's budgeted "
                            f"min-cut keeps fewer bytes than fx's plan ({FRACTION_EVIDENCE})")
    if budget is not None:
        return "inductor", (f"auto: a byte memory_budget's plan runs as recompute tags "
                            f"under Inductor, its peak bounded by the model of Inductor's "
                            f"buffers ({BYTES_EVIDENCE})")
    if options.plan is not None:
        return "inductor", ("auto: a saved plan replays under Inductor, the generator "
                            "`fxopt plan` captures with (its --codegen)")
    return "inductor", (f"auto: on {device.type.upper()} fx code generation keeps eager's "
                        "intermediates and peaks at eager's memory, Inductor at "
                        f"torch.compile's ({PEAK_EVIDENCE}); set codegen='fx' for a fast "
                        "compile")
