"""The planner's speed and its solvers' quality on a GPT-2-medium-sized synthetic problem.

What it measures: planning time of :func:`fxopt.planner.solve_activations` (MILP on HiGHS)
and of the greedy fallback, on a saved-activation problem shaped like GPT-2 medium's
training step (24 layers, ~64 saved tensors each, ~1.5k in all, a forward then a mirrored
backward timeline of ~4.6k steps; recompute choices that read a neighbour, swap choices
whose unhidden copy time depends on their window), at budgets from the lowest reachable
peak to the keep-all peak; and the predicted added seconds of both at each budget (the
baseline a user would otherwise get is the greedy heuristic). The problem is synthetic
(seeded), not traced from a model: this is the solver's speed, not a prediction of a
real step. Run ``python benchmarks/planner.py`` (``--smoke``: 2 layers, a second).
"""

from __future__ import annotations

import argparse
import random
import time

from fxopt.planner import ActivationChoice, ActivationProblem, SavedActivation
from fxopt.planner.frontier import pareto_frontier
from fxopt.planner.solvers.greedy import solve_greedy
from fxopt.planner.solvers.milp import lowest_peak, solve_activations


def synthetic_problem(layers: int, per_layer: int, *, seed: int = 0, budget: int = 0,
                      step_seconds: float = 5e-6) -> ActivationProblem:
    """A forward of ``layers`` x ``per_layer`` saved tensors, then a mirrored backward."""
    rng = random.Random(seed)
    fw_steps_per_layer = per_layer + per_layer // 2   # saved tensors plus transients
    fw_steps = layers * fw_steps_per_layer
    bw_steps = 2 * fw_steps
    steps = fw_steps + bw_steps
    base = 1.4e9  # parameters, gradients
    live = [base] * steps
    acts = []
    for layer in range(layers):
        names = []
        for k in range(per_layer):
            born = layer * fw_steps_per_layer + k + k // 2
            last_fw = min(born + rng.randint(1, 4), fw_steps - 1)
            mirror = fw_steps + 2 * (fw_steps - 1 - born)
            first_bw = min(max(mirror - rng.randint(0, 6), fw_steps), steps - 1)
            dies = min(first_bw + rng.randint(1, 6), steps - 1)
            nbytes = rng.choice([1, 1, 1, 4, 4, 16]) * 2 * 1024 * 1024  # 2-32 MiB
            for t in range(born, dies + 1):
                live[t] += nbytes
            name = f"l{layer}_t{k}"
            choices = [ActivationChoice(
                "recompute", (last_fw + 1, first_bw), nbytes / 2e12 * rng.uniform(1, 40),
                requires=(names[-1],) if names and rng.random() < 0.3 else ())]
            copy = nbytes / 50e9
            window_steps = first_bw - last_fw
            hidden = window_steps * step_seconds
            lag = max(1, int(copy / step_seconds))
            if window_steps > 2 * lag:
                choices.append(ActivationChoice(
                    "swap", (last_fw + 1 + lag, first_bw - lag), max(0.0, 2 * copy - hidden)))
            acts.append(SavedActivation(name, nbytes, tuple(choices)))
            names.append(name)
    for t in range(steps):  # transient workspace of the running kernel
        live[t] += rng.choice([0, 0, 8]) * 1024 * 1024
    return ActivationProblem(tuple(int(v) for v in live), tuple(acts), budget)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, seconds, on a CPU")
    parser.add_argument("--layers", type=int, default=24)
    parser.add_argument("--per-layer", type=int, default=64)
    parser.add_argument("--time-limit", type=float, default=10.0)
    parser.add_argument("--step-us", type=float, default=2.0,
                        help="compute per timeline step that hides copies (microseconds)")
    args = parser.parse_args()
    layers, per_layer = (2, 16) if args.smoke else (args.layers, args.per_layer)
    import platform
    import sys

    import scipy
    import torch

    print(f"# python benchmarks/planner.py {' '.join(sys.argv[1:])}: planning runs on the host "
          f"CPU ({platform.processor() or platform.machine()}, {torch.get_num_threads()} "
          f"threads); torch {torch.__version__}, scipy {scipy.__version__}; synthetic problem, "
          "seed 0")
    problem = synthetic_problem(layers, per_layer, step_seconds=args.step_us * 1e-6)
    keep_all = max(problem.live_bytes)
    began = time.perf_counter()
    floor = lowest_peak(problem, time_limit=args.time_limit)
    floor_seconds = time.perf_counter() - began
    print(f"problem: {len(problem.activations)} saved tensors, "
          f"{sum(len(a.choices) for a in problem.activations)} choices, "
          f"{len(problem.live_bytes)} timeline steps")
    print(f"keep-all peak {keep_all / 2**30:.3f} GiB, lowest reachable {floor / 2**30:.3f} GiB "
          f"(found in {floor_seconds:.2f} s)")
    print(f"{'budget GiB':>10} {'milp s':>8} {'milp +ms':>9} {'greedy s':>9} "
          f"{'greedy +ms':>10} {'greedy/milp':>11}  milp status")
    for fraction in (0.02, 0.1, 0.25, 0.5, 0.75):
        budget = int(floor + fraction * (keep_all - floor))
        at = ActivationProblem(problem.live_bytes, problem.activations, budget)
        milp = solve_activations(at, time_limit=args.time_limit)
        began = time.perf_counter()
        greedy = solve_greedy(at)
        greedy_seconds = time.perf_counter() - began
        ratio = (greedy.added_seconds / milp.added_seconds if milp.added_seconds
                 else float("nan"))
        print(f"{budget / 2**30:>10.3f} {milp.details['planning_seconds']:>8.2f} "
              f"{1e3 * milp.added_seconds:>9.3f} {greedy_seconds:>9.2f} "
              f"{1e3 * greedy.added_seconds:>10.3f} {ratio:>11.3f}  "
              f"{milp.details['status']}{'' if milp.feasible else ' (over budget)'}"
              f"{'' if greedy.feasible else '; greedy over budget'}")
    began = time.perf_counter()
    frontier = pareto_frontier(problem, points=8, time_limit=args.time_limit)
    print(f"\nPareto frontier ({len(frontier.points)} points, "
          f"{time.perf_counter() - began:.2f} s):")
    print(frontier.table())


if __name__ == "__main__":
    main()
