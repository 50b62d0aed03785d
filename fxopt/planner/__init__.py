"""The planner's plain data: what the machine can do, and what a plan may decide.

- :mod:`~fxopt.planner.hardware`: a :class:`HardwareProfile` (FLOP rates, bandwidths,
  optimizer-update throughput, capacity) with documented defaults per device, and the
  roofline time of a node on it.
- :mod:`~fxopt.planner.activations`: the saved-activation decision problem (keep, recompute
  or swap each tensor the forward keeps for backward) as plain data, and the pure functions
  that evaluate a choice of actions: the memory timeline, its peak and the added step time.

- :mod:`~fxopt.planner.step`: :func:`plan_step`, the one way a plan is made (the
  ``swap_recompute`` pass, ``fxopt plan`` and explain all go through it): a step's problem
  (:class:`StepProblem`, plain data), a budget and a machine in, a :class:`Plan` out.
- :mod:`~fxopt.planner.solvers`: the solvers together: the MILP on scipy's HiGHS
  (:func:`solve_activations`), the greedy solver (its fallback, and the DELTA-style
  heuristic as its ``delta`` mode) and the fraction budget's saved-bytes search.
- :mod:`~fxopt.planner.frontier`: the predicted time-vs-memory Pareto frontier.
- :mod:`~fxopt.planner.joint` builds the problem from a joint graph (reading it only);
  :mod:`~fxopt.planner.plan` holds the answer as JSON data (:class:`Plan`).
- :mod:`~fxopt.planner.symbolic`: the step's memory and time as functions of the graph's
  symbolic sizes (:func:`symbolic_step`), e.g. the largest batch that fits a budget.
- :func:`profile_for` reads the profile ``fxopt calibrate`` cached; measuring a device
  (:mod:`fxopt.cli.calibrate`) and capturing a model's joint graphs
  (:mod:`fxopt.cli.capture`) run models, so they are the command line's, not the planner's.

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
from fxopt.planner.hardware import HardwareProfile, profile_for
from fxopt.planner.plan import Plan
from fxopt.planner.solvers.greedy import solve_greedy
from fxopt.planner.solvers.milp import lowest_peak, lowest_peak_plan, solve_activations
from fxopt.planner.step import InfeasibleBudget, StepProblem, plan_step
from fxopt.planner.symbolic import SymbolicStep, symbolic_step

__all__ = [
    "ACTIONS", "ActivationChoice", "ActivationProblem", "Decision", "Frontier", "FrontierPoint",
    "HardwareProfile", "InfeasibleBudget", "Plan", "SavedActivation", "StepProblem",
    "SymbolicStep", "added_seconds", "evaluate", "lowest_peak", "lowest_peak_plan",
    "pareto_frontier", "peak_bytes", "plan_step", "profile_for", "solve_activations",
    "solve_greedy", "symbolic_step", "timeline_bytes",
]
