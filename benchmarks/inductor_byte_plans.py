"""A byte ``memory_budget`` under Inductor: the plan the timeline model takes alone against
the plan loosened while the compiled step's simulation fits (``fxopt/planner/step.py``,
``_loosened``).

The model is ``benchmarks/dynamic_shapes.py``'s transformers Llama (2 layers x 128,
vocabulary 32000, batch 4, fp32, its own loss) wrapped in ``fxopt.drop_logits``, at 512
tokens, compiled with ``codegen="inductor"``. The timeline model puts this step's every
plan about 10 MiB above what the compiled step simulates and measures (Inductor's
partition recomputes what it fuses), so under a budget it took its lowest plan, the one
that recomputes most. The rows without loosening are planned with
``fxopt.planner.step._LOOSEN_ROUNDS = 0`` (the planner before the loosening step).

Per row: tensors recomputed, the plan's predicted added time (the CPU profile's), its
simulated peak, the measured peak (``fxopt.profile_memory``, exact), the planning time,
and the step time on one thread, every configuration timed in the same rounds
(``fxopt.bench.timing.interleaved``): median (min-max).

    PYTHONPATH=. python benchmarks/inductor_byte_plans.py \
        [--out benchmarks/results/inductor_byte_plans_cpu.md]
"""

from __future__ import annotations

import argparse
import platform
import sys
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from dynamic_shapes import _ids, llama  # noqa: E402  (the Llama and its tokens)

import fxopt  # noqa: E402
import fxopt.planner.step as planner_step  # noqa: E402
from fxopt.bench.timing import interleaved, one_thread  # noqa: E402

MiB = 2**20
TOKENS = 512
BUDGETS_MIB = (95, 93)


def compiled(options: dict | None, loosen: bool = True):
    """(the compiled model, its backend or None, its step) for ``options`` (None: plain
    Inductor), planned with or without the loosening step."""
    model = fxopt.drop_logits(llama())
    ids = _ids(TOKENS)
    backend = fxopt.backend(codegen="inductor", **options) if options is not None else None
    model_compiled = torch.compile(model, backend=backend or "inductor")

    def step() -> None:
        model.zero_grad(set_to_none=True)
        model_compiled(input_ids=ids, labels=ids).loss.backward()

    rounds = planner_step._LOOSEN_ROUNDS
    planner_step._LOOSEN_ROUNDS = rounds if loosen else 0
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # an unmet budget warns; the row says so
            peak = fxopt.profile_memory(model_compiled, {"input_ids": ids, "labels": ids},
                                        steps=1, loss_fn=lambda out: out.loss).peak_bytes
    finally:
        planner_step._LOOSEN_ROUNDS = rounds
    return peak, backend, step


def plan_cells(backend) -> list[str]:
    """Recomputed, predicted added ms, simulated peak, fits, planning seconds."""
    if backend is None:
        return ["", "", "", "", ""]
    (graph,) = backend.graphs
    stats = graph.pass_records("swap_recompute")[0].stats
    plan = stats.get("plan") or {}
    return [str(len(plan.get("actions", {}))), f"{stats['added_ms']:.1f}",
            f"{stats['peak_after'] / MiB:.2f}", str(stats["feasible"]),
            f"{plan.get('planning_seconds', 0.0):.1f}"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    configurations = {"plain Inductor": (None, None, True),
                      "fxopt 1 GiB (every activation kept)": ("1GiB", None, True)}
    for mib in BUDGETS_MIB:
        configurations[f"fxopt {mib} MiB, the model's plan"] = (f"{mib}MiB", mib, False)
        configurations[f"fxopt {mib} MiB, loosened"] = (f"{mib}MiB", mib, True)
    rows, steps = {}, {}
    with one_thread():
        for name, (budget, mib, loosen) in configurations.items():
            options = None if budget is None else {"memory_budget": budget}
            peak, backend, steps[name] = compiled(options, loosen)
            within = "" if mib is None else str(peak <= mib * MiB)
            rows[name] = [*plan_cells(backend), f"{peak / MiB:.2f}", within]
            print(name, rows[name], flush=True)
        timings = interleaved(steps, "cpu", warmup=1, rounds=args.rounds)
    lines = [
        "# A byte budget under Inductor: the model's plan and the loosened plan "
        "(benchmarks/inductor_byte_plans.py)", "",
        "command: `" + " ".join(["PYTHONPATH=. python benchmarks/inductor_byte_plans.py",
                                 *sys.argv[1:]]) + "`", "",
        f"torch {torch.__version__}, {platform.machine()}, one thread; transformers Llama "
        f"2 x 128, vocabulary 32000, batch 4 x {TOKENS} tokens, fxopt.drop_logits, "
        f"codegen='inductor'; step times from {args.rounds} interleaved rounds", "",
        "| configuration | recomputed | predicted added ms | simulated peak MiB | plan fits "
        "| planning s | measured peak MiB | within budget | step ms |",
        "| --- | ---: | ---: | ---: | --- | ---: | ---: | --- | ---: |",
    ]
    lines += [f"| {name} | {' | '.join(cells)} | {timings[name].text()} |"
              for name, cells in rows.items()]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
