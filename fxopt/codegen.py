"""Which code generator compiles a graph: ``codegen="auto"`` resolved for its device.

fx code generation runs the final graphs as fx Python calling aten ops (and fxopt's own
kernels): one kernel per op, readable, and the only path where fuse_elementwise's kernels
run. Inductor fuses pointwise ops into generated C++/Triton kernels. On CUDA that fusion
saves a launch and a memory round trip per pointwise op (the fx path keeps eager's execution
model), so "auto" takes Inductor there. On the CPU it was measured
(benchmarks/codegen_auto.py, benchmarks/results/codegen_auto_cpu.md): Inductor compiles
transformers 4-40x slower than fx code generation (GPT-2/BERT/Llama, 2-4 layers), for a step
1.0-1.3x faster at issue 17's size (4 layers, hidden 256, batch 4 x 64) and 1.6-1.8x faster
at the benchmark suite's tiny CPU sizes. Without a budget "auto" takes fx there, for the
compile time that short CPU runs (tests, debugging, smoke benchmarks) are dominated by; a
long CPU training run is faster with ``codegen="inductor"``.

Under a fraction ``memory_budget`` "auto" takes Inductor on the CPU too: Inductor's
budgeted min-cut (:mod:`fxopt.passes.swap_recompute.inductor_budget`) recomputes what it
fuses, so it keeps fewer bytes than the fx path's plan, whose recomputed ops run one by one,
and where it recomputes much it is also faster (benchmarks/budget_frontier.py,
benchmarks/results/budget_frontier_cpu.md:
GPT-2 at the suite's size keeps 0.36/0.29/0.17 of eager's bytes at 0.7/0.5/0.3, Inductor's
own points, in 0.89/0.89/0.94x eager's step time, where fx keeps 0.65/0.46/0.27 in
0.99/1.05/1.11x; BERT keeps 0.55 against fx's 0.62 at 0.7, about 6% slower, and the same
bytes as fx at 0.5 and 0.3, the times a tie within noise). Its cost
is compile time (about 40-80 s against fx's 5-12 s there). fx stays where that
measurement does not carry over:

- tempo on: with tempo under a fraction Inductor's step was measured no faster (a tie
  within noise) for about the same bytes, and fx compiles 3-8x faster
  (benchmarks/results/budget_frontier_tempo_cpu.md). That was measured with tempo's custom
  ops, opaque extern kernels to Inductor; under Inductor tempo now inserts aten-only forms
  that it fuses (0.97-1.04x plain torch.compile's step without a budget,
  benchmarks/results/fast_path_tempo_inductor_cpu.md). Re-measured with those on a quiet
  machine (the same file's last section), Inductor is ahead on GPT-2 at 0.5 (0.182 of
  eager's bytes against 0.206, in 0.95x fx's step) and ties on BERT; fx stays for now (it
  compiles about 10x faster), switching is the next step;
- a saved ``plan``: made by ``fxopt plan`` for fx code generation, replayed as made;
- ``force_swap``: it exercises the fx path's swap runtime;
- a byte budget: a bound on the predicted peak, which fxopt simulates on its fx graphs
  and only models for Inductor's fused buffers.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx as fx

from fxopt import _compat
from fxopt.config import Options

__all__ = ["Codegen", "FX", "INDUCTOR", "as_codegen", "resolve_codegen",
           "FRACTION_EVIDENCE", "TEMPO_EVIDENCE"]

FRACTION_EVIDENCE = "benchmarks/results/budget_frontier_cpu.md"
TEMPO_EVIDENCE = "benchmarks/results/budget_frontier_tempo_cpu.md"


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
    def runs_custom_ops_as_extern(self) -> bool:
        """Whether fxopt's custom ops run as opaque extern kernels inside generated code
        (Inductor) rather than as calls of the fx graph."""
        return self._inductor

    @property
    def blocking_copies(self) -> bool:
        """Whether a swap's copies must block: generated code does not wait on fxopt's
        copy stream, so the planner offers only a blocking offload there."""
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
    def partitioner(self) -> Callable[..., tuple[fx.GraphModule, fx.GraphModule]]:
        """The partition function compilation uses for this generator."""
        return (_compat.inductor_partition if self.partitions_by_min_cut
                else _compat.default_partition)

    def decompositions(self) -> dict[Any, Callable[..., Any]]:
        """The decompositions AOTAutograd traces with: Inductor's for Inductor, none for
        fx code generation (aten as the model calls it)."""
        return _compat.inductor_decompositions() if self._inductor else {}


FX = Codegen("fx")
INDUCTOR = Codegen("inductor")


def as_codegen(value: Codegen | str) -> Codegen:
    """``value`` as a :class:`Codegen`: the analyses and the planner take a resolved one, or
    a generator's name from a direct caller (a test, a script)."""
    return value if isinstance(value, Codegen) else Codegen(value, "given by name")


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
        return "inductor", ("auto: on CUDA Inductor's fused kernels make the step faster "
                            "than fx's one kernel per op")
    if options.memory_budget is not None or options.plan is not None:
        kept = _fx_kept_under_budget(options, device)
        if kept is None:
            return "inductor", (f"auto: under a fraction memory_budget Inductor's budgeted "
                                f"min-cut keeps fewer bytes than fx's plan on "
                                f"{device.type.upper()}, mostly in less step time "
                                f"({FRACTION_EVIDENCE})")
        return "fx", f"auto: {kept}"
    return "fx", (f"auto: on {device.type.upper()} fx compiles 4-40x faster than Inductor, "
                  "whose step is 1.0-1.8x faster (benchmarks/results/codegen_auto_cpu.md); "
                  "set codegen='inductor' for a long run")


def _fx_kept_under_budget(options: Options, device: torch.device) -> str | None:
    """Why fx code generation stays under a budget or a saved plan (module doc), or None
    where a fraction goes to Inductor's budgeted min-cut."""
    if options.plan is not None:
        return "a saved plan is replayed as `fxopt plan` made it, for fx code generation"
    if options.force_swap:
        return "force_swap exercises the fx path's swap runtime"
    if options.memory_budget.fraction is None:
        return ("a byte memory_budget bounds the predicted peak, which fxopt simulates on "
                "its fx graphs (Inductor's fused buffers are only modelled)")
    if options.tempo in (True, "auto"):
        return (f"with tempo under a fraction memory_budget Inductor's step was measured no "
                f"faster on {device.type.upper()} and fx compiles 3-8x faster "
                f"({TEMPO_EVIDENCE})")
    return None
