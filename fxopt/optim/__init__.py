"""fxopt.optim: optimizer-state offload with interleaved CPU and GPU updates.

    optimizer = fxopt.optim.offload(torch.optim.AdamW(model.parameters()), model,
                                    gpu_state_budget_bytes=2 * 2**30)

The idea is Deep Optimizer States': parameters split into subgroups in gradient-ready order;
each subgroup's optimizer state lives on the device or on the host CPU, and a host-resident
subgroup updates on the host (fp32 master weights there) or on the device, its state staged
in and written back, chosen by a performance model so that host updates, device updates and
copies overlap. The parts:

- :mod:`~fxopt.optim.model`: the performance model and the plan, pure functions on plain data
  (the planner can call :func:`plan_offload` or fold it into its solver), the plan's data in
  :mod:`~fxopt.optim.offload_plan`;
- :mod:`~fxopt.optim.runtime`: :class:`OffloadedOptimizer`, a ``torch.optim.Optimizer`` that
  executes a plan and stays checkpoint-compatible with the optimizer it wraps, with its host
  thread in :mod:`~fxopt.optim.worker`, its staged updates in :mod:`~fxopt.optim.staging`
  and its gradients' copies to the host in :mod:`~fxopt.optim.host_grads`, started where
  the compiled backward produces each gradient (:mod:`~fxopt.optim.grad_ready`);
- :mod:`~fxopt.optim.link`: :func:`offload`, which finds the gradient order (the plan the
  ``offload_optimizer`` pass recorded, or the parameters' order) and builds the wrapper.
"""

from fxopt.optim.link import offload
from fxopt.optim.model import (
    OffloadPlan,
    ParamInfo,
    Prediction,
    Subgroup,
    SubgroupPlan,
    plan_offload,
    simulate,
    split_subgroups,
)
from fxopt.optim.runtime import OffloadedOptimizer

__all__ = [
    "OffloadPlan", "OffloadedOptimizer", "ParamInfo", "Prediction", "Subgroup",
    "SubgroupPlan", "offload", "plan_offload", "simulate", "split_subgroups",
]
