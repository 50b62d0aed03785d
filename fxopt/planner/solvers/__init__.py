"""The planner's solvers, together; each is plain data in and a decision out.

- :mod:`.milp`: the exact solver of the saved-activation problem (an MILP on scipy's HiGHS);
- :mod:`.greedy`: the greedy solver, the MILP's fallback, with the DELTA-style heuristic
  as its ``delta`` mode (``swap_recompute`` with ``planner=False``);
- :mod:`.fraction`: the fraction budget's search over saved bytes (recompute chains).

Only :func:`fxopt.planner.plan_step` chooses among them.
"""
