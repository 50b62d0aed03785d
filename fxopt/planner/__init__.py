"""The planner's plain data: what the machine can do, and what a plan may decide.

- :mod:`~fxopt.planner.hardware`: a :class:`HardwareProfile` (FLOP rates, bandwidths,
  optimizer-update throughput, capacity) with documented defaults per device, and the
  roofline time of a node on it.
- :mod:`~fxopt.planner.activations`: the saved-activation decision problem (keep, recompute
  or swap each tensor the forward keeps for backward) as plain data, and the pure functions
  that evaluate a choice of actions: the memory timeline, its peak and the added step time.

- :mod:`~fxopt.planner.milp`: the exact solver (an MILP on scipy's HiGHS) of that problem,
  :func:`solve_activations`, with :mod:`~fxopt.planner.greedy` as its fallback.
- :mod:`~fxopt.planner.frontier`: the predicted time-vs-memory Pareto frontier.
- :mod:`~fxopt.planner.joint` builds the problem from a joint graph;
  :mod:`~fxopt.planner.plan` holds the answer as JSON data (:class:`Plan`) and the compile
  path's entry, :func:`plan_for_joint_graph`.
- :mod:`~fxopt.planner.symbolic`: the step's memory and time as functions of the graph's
  symbolic sizes (:func:`symbolic_step`), e.g. the largest batch that fits a budget.
- :mod:`~fxopt.planner.calibrate` measures a device and caches its profile;
  :mod:`~fxopt.planner.capture` captures a step's joint graphs (``fxopt plan`` and
  ``fxopt calibrate`` are :mod:`fxopt.cli.planner`).

Passes build these problems from their graphs and apply the decisions; deciding (a
heuristic in a pass, or a solver) never touches an fx graph. That is the seam between the
passes and the solver-based planner.
"""

from fxopt.planner.activations import (
    ACTIONS,
    ActivationChoice,
    ActivationProblem,
    Decision,
    SavedActivation,
    added_seconds,
    evaluate,
    peak_bytes,
    timeline_bytes,
)
from fxopt.planner.frontier import Frontier, FrontierPoint, pareto_frontier
from fxopt.planner.greedy import solve_greedy
from fxopt.planner.hardware import HardwareProfile, profile_for
from fxopt.planner.milp import lowest_peak, lowest_peak_plan, solve_activations
from fxopt.planner.plan import Plan, plan_for_joint_graph
from fxopt.planner.symbolic import SymbolicStep, symbolic_step

__all__ = [
    "ACTIONS", "ActivationChoice", "ActivationProblem", "Decision", "Frontier", "FrontierPoint",
    "HardwareProfile", "Plan", "SavedActivation", "SymbolicStep", "added_seconds", "evaluate",
    "lowest_peak", "lowest_peak_plan", "pareto_frontier", "peak_bytes", "plan_for_joint_graph",
    "profile_for", "solve_activations", "solve_greedy", "symbolic_step", "timeline_bytes",
]
