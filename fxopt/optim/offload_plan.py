"""The offload plan as data: where each optimizer subgroup's state lives and updates, with
the predicted cost, JSON-serialisable (:meth:`OffloadPlan.to_dict`), and what it says about
itself (:meth:`OffloadPlan.summary`, :meth:`OffloadPlan.keeps_up`).

:mod:`fxopt.optim.model` makes plans (:func:`~fxopt.optim.model.plan_offload`) and
re-exports these; :mod:`fxopt.optim.runtime` executes them. Apart from the model to keep
each module small.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

__all__ = ["DEFAULT_CONTENTION", "MAX_SLOWDOWN", "OffloadPlan", "SubgroupPlan"]

DEFAULT_CONTENTION = 1.1
# The step-time target for offloading: at most this many times the plain step (issue 30).
MAX_SLOWDOWN = 1.3


@dataclass(frozen=True)
class SubgroupPlan:
    index: int
    params: tuple[int, ...]
    numel: int
    placement: str
    gpu_state_bytes: int
    finish_seconds: float

    @property
    def on_host(self) -> bool:
        """Whether its state lives on the host ("cpu" or "staged")."""
        return self.placement != "gpu"


@dataclass(frozen=True)
class OffloadPlan:
    """The chosen placement per subgroup, in update order, with its predicted cost.

    JSON-serialisable through :meth:`to_dict`/:meth:`from_dict`. ``params`` of a subgroup
    are keys of :class:`ParamInfo` (the runtime: indices into the optimizer's parameters in
    ``state_dict`` order). ``gpu_state_bytes`` is everything the optimizer holds on the
    device: the "gpu" subgroups' state and ``staging_bytes``; ``staging_note`` says which
    subgroups are staged and why (or why none is).
    """

    subgroups: tuple[SubgroupPlan, ...]
    predicted_seconds: float
    all_gpu_seconds: float
    all_cpu_seconds: float
    gpu_state_bytes: int
    all_gpu_state_bytes: int
    host_bytes: int
    hardware: str
    gpu_state_budget_bytes: int | None = None
    cpu_fraction: float | None = None
    states_per_param: int = 2
    contention: float = DEFAULT_CONTENTION
    counter_bytes: tuple[int, int] = (0, 0)
    backward_seconds: float = 0.0  # the backward's predicted length (0: unknown)
    staged: bool | float | None = None  # the option the plan was made with
    staging_bytes: int = 0
    staging_note: str = ""
    # the host's update rate the plan assumed (parameters/s; 0: not recorded)
    host_update_rate: float = 0.0

    @property
    def host_overhead_seconds(self) -> float:
        """What the host-resident subgroups add to the step: the predicted optimizer phase
        beyond the all-on-the-device one."""
        return max(0.0, self.predicted_seconds - self.all_gpu_seconds)

    def keeps_up(self, limit: float = MAX_SLOWDOWN) -> bool | None:
        """Whether the host's overhead is within ``limit - 1`` of the backward's length,
        which keeps the step within ``limit`` times the plain one; None when the backward's
        length is unknown (no recorded gradient order)."""
        if self.host_overhead_seconds == 0.0:
            return True
        if self.backward_seconds <= 0.0:
            return None
        return self.host_overhead_seconds <= (limit - 1.0) * self.backward_seconds

    def summary(self) -> str:
        """One line: the share on the host, the device bytes it frees, the host's overhead
        (with the update rate it assumed) against the backward, then which subgroups are
        staged and why."""
        freed = self.all_gpu_state_bytes - self.gpu_state_bytes
        staged = (f" and {self.staged_share:.0%} on the device with their state kept on "
                  f"the host (staged)" if self.staged_share else "")
        line = (f"{self._share(('cpu',)):.0%} of parameters update on the host{staged}, "
                f"freeing {freed / 2**20:.1f} MiB of device state; the host adds "
                f"{self.host_overhead_seconds * 1e3:.3g} ms to the step")
        if self.host_update_rate and self._share(("cpu",)):
            line += f" (its update at {self.host_update_rate / 1e9:.3g}e9 parameters/s)"
        verdict = self.keeps_up()
        if verdict is None:
            line += " (the backward's length is unknown)"
        else:
            line += (f" against a backward of {self.backward_seconds * 1e3:.3g} ms: "
                     + ("the host keeps up" if verdict else
                        f"the host cannot keep up (more than {MAX_SLOWDOWN - 1:.0%} of it)"))
        return line + (f"; {self.staging_note}" if self.staging_note else "")

    def _share(self, placements: tuple[str, ...]) -> float:
        total = sum(s.numel for s in self.subgroups)
        return (sum(s.numel for s in self.subgroups if s.placement in placements) / total
                if total else 0.0)

    @property
    def cpu_share(self) -> float:
        """The share of parameters whose state lives on the host ("cpu" and "staged"): what
        ``cpu_fraction`` forces."""
        return self._share(("cpu", "staged"))

    @property
    def staged_share(self) -> float:
        """The share of parameters whose host-resident state updates on the device."""
        return self._share(("staged",))

    def placement_of(self) -> dict[int, str]:
        return {key: s.placement for s in self.subgroups for key in s.params}

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["cpu_share"] = self.cpu_share
        out["subgroups"] = [{**asdict(s), "params": list(s.params)} for s in self.subgroups]
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> OffloadPlan:
        data = {k: v for k, v in data.items() if k != "cpu_share"}
        if "counter_bytes" in data:  # a list in JSON
            data["counter_bytes"] = tuple(data["counter_bytes"])
        subgroups = tuple(SubgroupPlan(**{**s, "params": tuple(s["params"])})
                          for s in data.pop("subgroups"))
        return cls(subgroups=subgroups, **data)
