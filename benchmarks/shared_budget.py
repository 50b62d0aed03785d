"""Issue 16's done-when on the CPU: the shared-budget plan against the best separately chosen one.

For transformers GPT-2, BERT and Llama at the benchmark suite's CPU size (4 layers, hidden
256, seq 128, batch 4, dropout 0.1, eager attention), with an offloaded optimizer
(AdamW-like: 2 states per parameter, 4 subgroups) and 6 byte budgets from the lowest
reachable to everything kept:

- **joint**: :func:`fxopt.optim.shared_budget.plan_model` (tempo kinds x the activation MILP x the
  subgroups' placement, chosen together under one budget);
- **separate**: the best of tempo off and tempo on (every kind), each with the activation
  MILP under the whole budget and then the fastest optimizer placement in what is left
  (the passes chosen one after another, as before issue 16);
- **measured**: the model compiled with the shared-budget choice (``memory_budget`` = the budget
  minus the optimizer's resident bytes, tempo as chosen: off, on, or ``"auto"`` for a
  subset, which redoes the same search), one step profiled by ``fxopt.profile_memory``;
  the budget holds when the measured step peak plus the resident optimizer bytes is
  within it.

Predicted times come from the planner's cost model (``profile_for("cpu")``), not from a
stopwatch: this compares plans, the planner's accuracy is benchmarks/planner_accuracy.py's.

    PYTHONPATH=. python benchmarks/shared_budget.py --out benchmarks/results/shared_budget_cpu.md
"""

from __future__ import annotations

import argparse
import time
import warnings

import torch
from codegen_auto import SIZES, build

import fxopt
from fxopt.cli.capture import capture_dynamo
from fxopt.config import MemoryBudget
from fxopt.optim.model import offload_frontier
from fxopt.optim.shared_budget import plan_model, resident_bytes, subgroups_of
from fxopt.passes.tempo.auto import tempo_variants
from fxopt.planner import profile_for
from fxopt.planner.search import predicted_seconds, quiet_plan
from fxopt.units import format_bytes

SIZES["suite"] = {"layers": 4, "hidden": 256, "heads": 4, "vocab": 1000, "positions": 256,
                  "batch": 4, "seq": 128}
SUBGROUPS = 4


class Step(torch.nn.Module):
    """The model's training step with positional input ids (what capture and plan take)."""

    def __init__(self, model, extra):
        super().__init__()
        self.model, self.extra = model, extra

    def forward(self, input_ids):
        return self.model(input_ids=input_ids, labels=input_ids, **self.extra).loss


def separate(graphs, budget, hardware, subgroups, kinds_wanted):
    """Tempo fixed (every kind or none), activations under the whole budget, then the
    fastest placement in what the main graph leaves: (seconds, fits)."""
    main = max(range(len(graphs)), key=lambda i: graphs[i][()].baseline_bytes)
    frontier = offload_frontier(subgroups, hardware)
    total, fits, resident = 0.0, True, 0
    order = [main] + [i for i in range(len(graphs)) if i != main]
    for index in order:
        variants = graphs[index]
        kinds = max(variants, key=len) if kinds_wanted else ()
        problem = variants[kinds]
        bound = budget if index == main else budget - resident
        plan = quiet_plan(problem, MemoryBudget(bytes=bound), hardware)
        total += predicted_seconds(problem, plan)
        fits &= plan.feasible
        if index == main:
            left = budget - int(plan.predictions["peak_bytes"])
            fitting = [o for o in frontier if resident_bytes(o, hardware) <= left]
            offload = min(fitting or frontier[:1], key=lambda o: o.predicted_seconds)
            resident = resident_bytes(offload, hardware)
            fits &= bool(fitting)
            total += offload.predicted_seconds
    return total, fits


def measure(name, budget, resident, tempo):
    model, kwargs = build(name, "suite")
    step = Step(model, {k: v for k, v in kwargs.items() if k not in ("input_ids", "labels")})
    options = {"memory_budget": max(1, budget - resident), "tempo": tempo}
    compiled = torch.compile(step, backend=fxopt.backend(**options))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        profile = fxopt.profile_memory(compiled, (kwargs["input_ids"],), steps=1,
                                       loss_fn=lambda loss: loss)
    torch.compiler.reset()
    return profile.peak_bytes, [str(w.message)[:80] for w in caught
                                if "fxopt" in str(w.message)]


def run(name, hardware, rows):
    model, kwargs = build(name, "suite")
    step = Step(model, {k: v for k, v in kwargs.items() if k not in ("input_ids", "labels")})
    began = time.perf_counter()
    graphs = [tempo_variants(gm, example, hardware, name=f"g{i}")
              for i, (gm, example) in enumerate(capture_dynamo(step, (kwargs["input_ids"],)))]
    traced = time.perf_counter() - began
    subgroups = subgroups_of(step.parameters(), SUBGROUPS)
    main = max(range(len(graphs)), key=lambda i: graphs[i][()].baseline_bytes)
    least_resident = min(resident_bytes(o, hardware)
                         for o in offload_frontier(subgroups, hardware))
    # the lowest peak the planner reaches (its plan for a 1-byte budget), as simulated
    low = min(int(quiet_plan(p, MemoryBudget(bytes=1), hardware).predictions["peak_bytes"])
              for p in graphs[main].values())
    high = graphs[main][()].keep_all_peak_bytes
    budgets = [int(low + least_resident + i * (high - low) / 5) + 1 for i in range(6)]
    for budget in budgets:
        began = time.perf_counter()
        choices = plan_model(graphs, MemoryBudget(bytes=budget), hardware, subgroups=subgroups)
        searched = time.perf_counter() - began
        joint = sum(c.chosen.seconds for c in choices)
        joint_fits = all(c.chosen.feasible for c in choices)
        main_choice = max(choices, key=lambda c: c.chosen.resident_bytes).chosen
        sep = [separate(graphs, budget, hardware, subgroups, on) for on in (False, True)]
        fitting = [s for s, ok in sep if ok]
        best_separate = min(fitting) if fitting else None
        kinds = main_choice.tempo
        every = max(graphs[main], key=len)
        tempo = False if not kinds else True if kinds == every else "auto"
        peak, warned = measure(name, budget, main_choice.resident_bytes, tempo)
        measured = peak + main_choice.resident_bytes
        rows.append({
            "model": name, "budget": budget, "joint_ms": 1e3 * joint, "joint_fits": joint_fits,
            "separate_ms": None if best_separate is None else 1e3 * best_separate,
            "tempo": ",".join(kinds) or "-",
            "host": sum(s.placement == "cpu" for s in main_choice.offload.subgroups),
            "recompute": sum(a == "recompute" for a in main_choice.plan.actions.values()),
            "predicted": main_choice.peak_bytes, "measured": measured,
            "holds": measured <= budget, "search_s": searched, "trace_s": traced,
            "warned": warned})
        print(rows[-1], flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=["gpt2", "bert", "llama"])
    parser.add_argument("--out", default="benchmarks/results/shared_budget_cpu.md")
    args = parser.parse_args()
    torch.set_num_threads(1)
    hardware = profile_for("cpu")
    rows: list[dict] = []
    for name in args.models:
        run(name, hardware, rows)
    lines = ["# Joint plan vs the best separately chosen plan (CPU, predicted times)", "",
             "`PYTHONPATH=. python benchmarks/shared_budget.py` (hardware profile: "
             f"{hardware.name}, {hardware.source}; {SUBGROUPS} optimizer subgroups, "
             "2 states per parameter)", "",
             "| model | budget | joint ms | best separate ms | joint <= separate | tempo taken "
             "| recompute | optimizer subgroups on host | predicted peak + state | measured "
             "peak + state | holds | search s |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        sep = "misses" if r["separate_ms"] is None else f"{r['separate_ms']:.3f}"
        better = r["separate_ms"] is None or r["joint_ms"] <= r["separate_ms"] + 1e-9
        lines.append(
            f"| {r['model']} | {format_bytes(r['budget'])} | {r['joint_ms']:.3f}"
            f"{'' if r['joint_fits'] else ' (misses)'} | {sep} | {'yes' if better else 'NO'} "
            f"| {r['tempo']} | {r['recompute']} | {r['host']}/{SUBGROUPS} "
            f"| {format_bytes(r['predicted'])} | {format_bytes(r['measured'])} "
            f"| {'yes' if r['holds'] else 'NO'} | {r['search_s']:.1f} |")
    traced = {r["model"]: r["trace_s"] for r in rows}
    lines += ["", "Tracing the tempo variants (once per model, every subset of its site kinds): "
              + ", ".join(f"{m} {s:.1f} s" for m, s in traced.items()) + "; `search s`: the "
              "shared-budget search per budget (MILPs over variants x optimizer placements)."]
    warned = sorted({w for r in rows for w in r["warned"]})
    if warned:
        lines += ["", "Warnings while measuring:", *[f"- {w}" for w in warned]]
    with open(args.out, "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
