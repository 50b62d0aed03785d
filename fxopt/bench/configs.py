"""The configurations each workload runs under: the baselines a user would pick instead
of fxopt (eager, Inductor, Inductor with ``activation_memory_budget``, activation
checkpointing with ``torch.utils.checkpoint``) and fxopt (defaults, each pass alone,
memory budgets). swap_recompute acts only under a budget, so it runs in the budget
configurations; offload_optimizer's configuration also wraps the optimizer.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from fxopt import _compat
from fxopt.bench.workloads import Workload

__all__ = ["Config", "all_configs", "checkpoint_blocks", "checkpoint_each", "get_configs"]


@dataclass(frozen=True)
class Config:
    """``prepare(model, workload)`` returns the model to train (compiled, wrapped);
    ``context()`` is entered around every step (a compiler setting, for example);
    ``optimizer(optimizer, model)`` returns the optimizer to step (wrapped, for example)."""

    name: str
    kind: str   # "baseline" or "fxopt"
    prepare: Callable[[nn.Module, Workload], nn.Module]
    context: Callable[[], contextlib.AbstractContextManager[Any]] = contextlib.nullcontext
    optimizer: Callable[[torch.optim.Optimizer, nn.Module], torch.optim.Optimizer] = (
        lambda optimizer, model: optimizer)


def _eager(model: nn.Module, workload: Workload) -> nn.Module:
    return model


def _inductor(model: nn.Module, workload: Workload) -> nn.Module:
    return torch.compile(model, backend="inductor")


def _checkpointed(model: nn.Module, workload: Workload) -> nn.Module:
    checkpoint_blocks(model, workload.checkpoint_layers(model))
    return model


def checkpoint_blocks(model: nn.Module, layers: list[nn.Module]) -> None:
    """Per-block activation checkpointing as the model's users turn it on: on a
    transformers model, its own switch, non-reentrant (``activation_checkpointing_enable``;
    releases up to 5.17 at least name it ``gradient_checkpointing_enable``, which 5.24
    deprecates); on any other model, :func:`checkpoint_each` of ``layers``.

    transformers' switch also stops the blocks filling a key-value cache in training,
    as checkpointing needs: a cache the blocks fill keeps every block's keys and values
    alive through the forward (bytes checkpointing should have freed), and on transformers
    4.57 its second fill, in the recompute, changes the recomputed shapes
    (``CheckpointError``)."""
    if getattr(model, "supports_gradient_checkpointing", False):
        enable = (getattr(model, "activation_checkpointing_enable", None)
                  or model.gradient_checkpointing_enable)
        enable({"use_reentrant": False})
    else:
        checkpoint_each(layers)


def checkpoint_each(layers: list[nn.Module]) -> None:
    """Each of ``layers`` recomputes its forward in backward (non-reentrant
    ``torch.utils.checkpoint`` around its ``forward``)."""
    from torch.utils.checkpoint import checkpoint

    for layer in layers:
        forward = layer.forward

        @functools.wraps(forward)
        def wrapped(*args: Any, _forward: Callable[..., Any] = forward, **kwargs: Any) -> Any:
            return checkpoint(_forward, *args, use_reentrant=False, **kwargs)

        layer.forward = wrapped


def _fxopt(**options: Any) -> Callable[[nn.Module, Workload], nn.Module]:
    def prepare(model: nn.Module, workload: Workload) -> nn.Module:
        import fxopt

        return torch.compile(model, backend=fxopt.backend(**options))
    return prepare


def _offloaded(optimizer: torch.optim.Optimizer, model: nn.Module) -> torch.optim.Optimizer:
    """Half of the optimizer state on the host (a forced split: the automatic plan keeps
    everything on a device where it fits, which would measure nothing)."""
    import fxopt

    return fxopt.optim.offload(optimizer, model=model, cpu_fraction=0.5)


def all_configs() -> list[Config]:
    """Every configuration, baselines first; one per pass flag."""
    from fxopt.passes import PIPELINE

    configs = [
        Config("eager", "baseline", _eager),
        Config("inductor", "baseline", _inductor),
        Config("inductor-budget-0.5", "baseline", _inductor,
               functools.partial(_compat.activation_memory_budget, 0.5)),
        Config("checkpoint", "baseline", _checkpointed),
        Config("fxopt", "fxopt", _fxopt()),
    ]
    for spec in PIPELINE:
        if not spec.flag or spec.flag == "swap_recompute":
            continue  # swap_recompute acts under a budget: the fxopt-budget-* configurations
        configs.append(Config(f"fxopt+{spec.name}", "fxopt", _fxopt(**{spec.flag: True}),
                              optimizer=_offloaded if spec.name == "offload_optimizer"
                              else Config.optimizer))
    configs += [Config(f"fxopt-budget-{fraction}", "fxopt", _fxopt(memory_budget=fraction))
                for fraction in (0.5, 0.25)]
    return configs


def get_configs(names: list[str] | None) -> list[Config]:
    """The named configurations (all when ``names`` is None); an unknown name raises."""
    configs = {c.name: c for c in all_configs()}
    if names is None:
        return list(configs.values())
    unknown = [n for n in names if n not in configs]
    if unknown:
        raise ValueError(f"unknown configuration(s) {unknown}; configurations: "
                         f"{list(configs)}")
    return [configs[n] for n in names]
