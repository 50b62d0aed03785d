"""The planner's predictions against CPU measurements: step time and peak, per model and
budget (issue 16's done-when: time within 15%, peak within 5%).

For transformers' GPT-2, BERT and Llama at the benchmark suite's CPU size (4 layers,
hidden 256, 4 heads, batch 4 x 128 tokens, vocabulary 1000, dropout 0.1, training mode;
the loss computed in the compiled module, so each model is one graph) and each budget
(none, fractions 0.7 and 0.5, bytes at 90% and 80% of the keep-all step's predicted peak),
it compiles with fxopt (``codegen="fx"``, the CPU default) and compares:

- predicted step time: the plan's (the steps' node times with everything kept, plus the
  time its actions add; without a budget the keep-all steps' node times), each node the
  calibrated profile's roofline plus its per-node overhead;
- measured step time: forward + backward, one thread, the budgets interleaved step by
  step, median of ``--steps`` steps after two warm-up rounds, with the min-max spread.
  Timed as the process's CPU time (``time.process_time``): on a machine shared with other
  work, wall-clock time also counts the time the thread waits for a core (on the 2-core
  machine these results come from, wall-clock medians of one configuration moved by 15%
  between runs); the wall-clock median is printed beside it;
- predicted peak: the plan's (the compiled step's simulation, what explain shows);
- measured peak: ``fxopt.profile_memory`` of one compiled step (the profiler's allocation
  records).

Run on a calibrated profile (one thread, as measured here); ``XDG_CACHE_HOME`` keeps the
profile away from other users of the machine's cache:

    XDG_CACHE_HOME=/tmp/xdg python -m fxopt calibrate --device cpu --threads 1
    XDG_CACHE_HOME=/tmp/xdg PYTHONPATH=. python benchmarks/planner_accuracy.py
"""

from __future__ import annotations

import argparse
import copy
import platform
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).parent))
from codegen_auto import SIZES  # noqa: E402  (benchmarks/codegen_auto.py: the models)
from codegen_auto import build as build_model  # noqa: E402

from fxopt.compiler import Backend
from fxopt.planner import profile_for
from fxopt.planner.joint import analyse_joint
from fxopt.profile import profile_memory

SIZE = SIZES["suite"] = {"layers": 4, "hidden": 256, "heads": 4, "vocab": 1000,
                         "positions": 128, "batch": 4, "seq": 128}
TIME_TOLERANCE, PEAK_TOLERANCE = 0.15, 0.05


class LossOf(torch.nn.Module):
    """A language model and its loss in one module (one Dynamo graph)."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        logits = self.model(input_ids=input_ids).logits
        return torch.nn.functional.cross_entropy(logits.flatten(0, 1), input_ids.flatten())


def build(kind: str, size: str = "suite") -> torch.nn.Module:
    """``kind`` at a size of :data:`codegen_auto.SIZES`, its loss in the compiled module."""
    model, _ = build_model(kind, size)
    return LossOf(model)


@dataclass
class Row:
    model: str
    budget: Any
    compiled: Any = None
    predicted_s: float = 0.0
    predicted_peak: int = 0
    measured_peak: int = 0
    steps: list[float] = field(default_factory=list)   # CPU seconds per step
    wall: list[float] = field(default_factory=list)    # wall-clock seconds per step
    actions: str = ""


def compile_row(model: torch.nn.Module, name: str, budget: Any,
                inputs: dict[str, torch.Tensor]) -> Row:
    """Compile ``model`` under ``budget``, run one step, read the plan's predictions."""
    options = {"codegen": "fx", "strict": True}
    if budget is not None:
        options["memory_budget"] = budget
    backend = Backend(options)
    row = Row(name, budget, torch.compile(model, backend=backend))
    row.compiled(**inputs).backward()
    (record,) = backend.graphs
    plans = [r.stats.get("plan") for r in record.pass_records("swap_recompute")]
    plan = next((p for p in plans if p), None)
    if plan is None:  # nothing planned: everything kept
        joint = record.graphs["joint"]
        row.predicted_s = sum(analyse_joint(joint, 1, profile_for("cpu")).step_seconds)
        row.predicted_peak = record.memory["fxopt"].peak_bytes
    else:
        p = plan["predictions"]
        row.predicted_s = p["step_seconds"] + p["added_seconds"]
        row.predicted_peak = int(p["peak_bytes"])
        counts = {a: sum(1 for v in plan["actions"].values() if v == a)
                  for a in ("recompute", "swap")}
        row.actions = ", ".join(f"{n} {a}" for a, n in counts.items() if n)
    return row


def time_step(row: Row, inputs: dict[str, torch.Tensor]) -> tuple[float, float]:
    """(CPU seconds of this process, wall seconds) of one forward + backward."""
    wall, cpu = time.perf_counter(), time.process_time()
    row.compiled(**inputs).backward()
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    for p in row.compiled.parameters():
        p.grad = None
    return cpu, wall


def measure_model(kind: str, steps: int) -> list[Row]:
    base = build(kind)
    inputs = {"input_ids": torch.randint(0, SIZE["vocab"], (SIZE["batch"], SIZE["seq"]))}
    keep_all = compile_row(copy.deepcopy(base), kind, None, inputs)
    budgets = [0.7, 0.5, int(0.9 * keep_all.predicted_peak), int(0.8 * keep_all.predicted_peak)]
    rows = [keep_all] + [compile_row(copy.deepcopy(base), kind, b, inputs) for b in budgets]
    for round_ in range(steps + 2):  # interleaved, the first two rounds warm up
        for row in rows[round_ % len(rows):] + rows[:round_ % len(rows)]:
            cpu, wall = time_step(row, inputs)
            if round_ >= 2:
                row.steps.append(cpu)
                row.wall.append(wall)
    for row in rows:
        row.measured_peak = profile_memory(row.compiled, inputs, steps=1, warmup=0,
                                           loss_fn=lambda loss: loss).peak_bytes
    torch._dynamo.reset()
    return rows


def budget_name(budget: Any) -> str:
    if budget is None:
        return "none"
    return f"{budget:g}" if isinstance(budget, float) else f"{budget / 2**20:.1f} MiB"


def table(rows: list[Row]) -> str:
    lines = ["| model | budget | plan | predicted ms | measured CPU ms (median) | spread ms "
             "| wall ms (median) | time error | time | predicted peak MiB "
             "| measured peak MiB | peak error | peak |", "|" + " --- |" * 13]
    for r in rows:
        median = statistics.median(r.steps)
        time_error = r.predicted_s / median - 1
        peak_error = r.predicted_peak / r.measured_peak - 1
        lines.append(
            f"| {r.model} | {budget_name(r.budget)} | {r.actions or 'keep all'} "
            f"| {1e3 * r.predicted_s:.1f} | {1e3 * median:.1f} "
            f"| {1e3 * min(r.steps):.1f}-{1e3 * max(r.steps):.1f} "
            f"| {1e3 * statistics.median(r.wall):.1f} | {time_error:+.1%} "
            f"| {'ok' if abs(time_error) <= TIME_TOLERANCE else 'MISS'} "
            f"| {r.predicted_peak / 2**20:.2f} | {r.measured_peak / 2**20:.2f} "
            f"| {peak_error:+.2%} | {'ok' if abs(peak_error) <= PEAK_TOLERANCE else 'MISS'} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=["gpt2", "bert", "llama"])
    parser.add_argument("--steps", type=int, default=7)
    args = parser.parse_args()
    torch.set_num_threads(1)
    profile = profile_for("cpu")
    print(f"# planner_accuracy: predicted vs measured step time and peak, CPU "
          f"({platform.machine()}, torch {torch.__version__}, one thread)")
    print(f"# profile: {profile.source} ({profile.notes}); matmul fp32 "
          f"{profile.flops['float32'] / 1e9:.0f} GFLOP/s, memory "
          f"{profile.memory_bandwidth / 1e9:.1f} GB/s, per node "
          f"{profile.node_overhead_seconds * 1e6:.1f} us")
    print(f"# size: {SIZE}, dropout 0.1; {args.steps} timed steps per row, interleaved\n")
    rows = [row for kind in args.models for row in measure_model(kind, args.steps)]
    print(table(rows))


if __name__ == "__main__":
    main()
