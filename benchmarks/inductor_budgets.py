"""Budgets under Inductor on the CPU, in exact bytes: what ``codegen="auto"`` rests on when it
takes Inductor for a byte ``memory_budget`` and for tempo under a fraction
(``fxopt/codegen.py``: ``BYTES_EVIDENCE``, ``TEMPO_EVIDENCE``).

``bytes``: a deep MLP (``tests/models.deep_mlp``, batch 512), two pre-LayerNorm transformer
blocks (``tests/models.Block``, width 64, batch 4 x 64) and transformers' GPT-2 at the
benchmark suite's smoke size with its loss in the module (``benchmarks/planner_accuracy.py``),
compiled with ``codegen`` (default ``inductor``) without a budget, then under byte budgets
at 0.9 / 0.8 / 0.7 of the predicted keep-all peak. Per row: the plan's predicted peak (the
compiled step's simulation, what explain shows), whether the plan says it fits, the
measured peak (``fxopt.profile_memory``: the profiler's allocations, exact) and their ratio.
A plan that fits must measure within its budget.

``tempo``: transformers' BERT and GPT-2 at a tiny size (``benchmarks/budget_reach.py``'s
build: 2 layers, hidden 32, batch 2 x 16), SDPA attention, bf16 autocast as users run them,
``memory_budget=0.5, strict=True``: the bytes the step keeps for backward (saved-tensor
hooks) with the budget alone, with ``tempo=True`` and with ``tempo="auto"``, under
``codegen="auto"`` and under ``codegen="fx"`` (what "auto" took with tempo before).

Bytes are exact on a loaded machine; no time is measured here.

    PYTHONPATH=. python benchmarks/inductor_budgets.py > benchmarks/results/inductor_budgets_cpu.md
"""

from __future__ import annotations

import argparse
import platform
import sys
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parents[1] / "tests"))
import budget_reach  # noqa: E402  (benchmarks/budget_reach.py: the models and their step)
import planner_accuracy  # noqa: E402  (the GPT-2 with its loss in the module)
from models import Block, deep_mlp  # noqa: E402  (tests/models.py)

from fxopt.compiler import Backend  # noqa: E402
from fxopt.planner import InfeasibleBudget  # noqa: E402
from fxopt.profile import profile_memory  # noqa: E402

BYTE_FRACTIONS = (0.9, 0.8, 0.7)
TEMPO_FRACTION = 0.5


def _peak_model(kind: str):
    """(model, inputs, loss_fn) of the ``bytes`` part."""
    torch.manual_seed(0)
    if kind == "mlp":
        return deep_mlp(), torch.randn(512, 48), None
    if kind == "blocks":
        return torch.nn.Sequential(Block(64, 4), Block(64, 4)), torch.randn(4, 64, 64), None
    size = planner_accuracy.SIZES["smoke"]
    ids = torch.randint(0, size["vocab"], (size["batch"], size["seq"]))
    return planner_accuracy.build(kind, "smoke").train(), {"input_ids": ids}, lambda loss: loss


def _peak_step(kind: str, options: dict) -> tuple[int, int, dict]:
    """Measured peak, explain's predicted peak and swap_recompute's stats of one step."""
    torch._dynamo.reset()
    model, inputs, loss_fn = _peak_model(kind)
    backend = Backend(options)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # an unreachable budget warns; the row says so
        measured = profile_memory(torch.compile(model, backend=backend), inputs, steps=1,
                                  loss_fn=loss_fn).peak_bytes
    (record,) = backend.graphs
    stats = next((r.stats for r in record.pass_records("swap_recompute")), {})
    return measured, record.memory["fxopt"].peak_bytes, stats


def bytes_part(models: list[str], codegen: str) -> None:
    print(f"## Byte budgets under codegen={codegen!r}: predicted and measured peak\n")
    print("| model | budget | budget bytes | plan fits | predicted peak | measured peak "
          "| measured / predicted | measured within budget |")
    print("| --- | --- | ---: | --- | ---: | ---: | ---: | --- |")
    for kind in models:
        measured, predicted, _ = _peak_step(kind, {"codegen": codegen})
        print(f"| {kind} | none | | | {predicted:,} | {measured:,} | "
              f"{measured / predicted:.3f} | |", flush=True)
        for fraction in BYTE_FRACTIONS:
            bound = int(fraction * predicted)
            got, predicted_now, stats = _peak_step(kind, {"codegen": codegen,
                                                          "memory_budget": bound})
            fits = bool(stats.get("feasible"))
            within = got <= bound
            print(f"| {kind} | {fraction:g} x keep-all | {bound:,} | {fits} | "
                  f"{predicted_now:,} | {got:,} | {got / predicted_now:.3f} | "
                  f"{within}{'' if within or not fits else ' (PLAN SAID IT FITS)'} |",
                  flush=True)
    print()


def _saved(name: str, options: dict | None) -> tuple[int, str]:
    """Saved bytes of one bf16-autocast step of ``name`` (eager where ``options`` is None)
    and the code generator that compiled it."""
    torch._dynamo.reset()
    model, kwargs = budget_reach.build(name, hidden=32, seq=16, batch=2)
    model.config._attn_implementation = "sdpa"
    if options is None:
        return budget_reach.step(model, kwargs, model, autocast=torch.bfloat16)[2], ""
    backend = Backend({"strict": True, "memory_budget": TEMPO_FRACTION, **options})
    compiled = torch.compile(model, backend=backend)
    budget_reach.step(model, kwargs, compiled, autocast=torch.bfloat16)
    saved = budget_reach.step(model, kwargs, compiled, autocast=torch.bfloat16)[2]
    return saved, "/".join(sorted({g.codegen.name for g in backend.graphs}))


def tempo_part(models: list[str]) -> None:
    print(f"## tempo under memory_budget={TEMPO_FRACTION} (strict): bytes kept for "
          "backward\n")
    print("| model | configuration | codegen | saved bytes | x eager |")
    print("| --- | --- | --- | ---: | ---: |")
    for name in models:
        eager, _ = _saved(name, None)
        print(f"| {name} | eager | | {eager:,} | 1.000 |", flush=True)
        for codegen in ("auto", "fx"):
            for label, tempo in (("budget alone", {}), ("tempo=True", {"tempo": True}),
                                 ("tempo='auto'", {"tempo": "auto"})):
                try:
                    saved, used = _saved(name, {"codegen": codegen, **tempo})
                except InfeasibleBudget as error:
                    print(f"| {name} | {label} | {codegen} | infeasible: {error} | |")
                    continue
                print(f"| {name} | {label} | {codegen} -> {used} | {saved:,} | "
                      f"{saved / eager:.3f} |", flush=True)
    print()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--parts", nargs="+", default=["bytes", "tempo"],
                        choices=["bytes", "tempo"])
    parser.add_argument("--peak-models", nargs="+", default=["mlp", "blocks", "gpt2"])
    parser.add_argument("--tempo-models", nargs="+", default=["bert", "gpt2"])
    parser.add_argument("--codegen", default="inductor", choices=["inductor", "fx", "auto"])
    args = parser.parse_args()
    print("# Budgets under Inductor on the CPU (benchmarks/inductor_budgets.py)\n")
    print(f"command: PYTHONPATH=. python benchmarks/inductor_budgets.py {' '.join(sys.argv[1:])}"
          .rstrip() + "\n")
    print(f"torch {torch.__version__}, {platform.machine()}, {torch.get_num_threads()} "
          "thread(s); bytes are exact, no time is measured\n")
    if "bytes" in args.parts:
        bytes_part(args.peak_models, args.codegen)
    if "tempo" in args.parts:
        tempo_part(args.tempo_models)


if __name__ == "__main__":
    main()
