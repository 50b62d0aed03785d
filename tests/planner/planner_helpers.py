"""Capture of the joint graph AOTAutograd hands to fxopt's partition, for the planner tests."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from functorch.compile import make_boxed_func
from torch import fx, nn
from torch._dynamo.backends.common import aot_autograd
from torch._functorch.partitioners import default_partition


@dataclass
class Joint:
    gm: fx.GraphModule
    num_fwd_outputs: int


def capture_joint(model: nn.Module, *args: Any, dynamic: bool = False) -> Joint:
    """Compile ``model`` with a recording backend, run one training step, return its joint
    graph (the first one, for a model without graph breaks)."""
    torch._dynamo.reset()
    found: list[Joint] = []

    def partition(joint: fx.GraphModule, joint_inputs: Any, **kwargs: Any):
        found.append(Joint(joint, kwargs["num_fwd_outputs"]))
        return default_partition(joint, joint_inputs, **kwargs)

    def keep(gm: fx.GraphModule, _: Any) -> Any:
        return make_boxed_func(gm)

    backend = aot_autograd(fw_compiler=keep, bw_compiler=keep, partition_fn=partition,
                           keep_inference_input_mutations=True)
    out = torch.compile(model, backend=backend, dynamic=dynamic)(*args)
    out.sum().backward()
    model.zero_grad(set_to_none=True)
    return found[0]
