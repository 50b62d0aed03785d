"""Capture the joint forward+backward graphs of one training step, for planning offline.

``fxopt plan`` and the planner's tests need the joint graph AOTAutograd builds as
compilation builds it: :func:`capture_joints` captures each Dynamo graph through
compilation's one capture (:func:`fxopt.pipeline.capture_step`): the pre-autograd passes
compilation under a budget runs (swap_recompute's flag: the dropout calls that return
their input dropped, whole ``nn.LSTM``/``nn.GRU`` calls made the recomputing op; tempo is
planned apart, ``--tempo auto``), then AOTAutograd with the code generator's flags, the
generator resolved from the options and the graph's device as compilation resolves it.
It runs one step (``model(*inputs)``, then backward from the sum of the output, so a
scalar loss is itself) and returns each graph's joint with its ``num_fwd_outputs``.
Gradients the step leaves on the parameters are cleared afterwards.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import fx, nn

from fxopt import _compat, config
from fxopt.codegen import FX, Codegen, graph_device, resolve_codegen
from fxopt.config import Options
from fxopt.passes import GraphKind, PassContext, Stage
from fxopt.passes.base import activation_inputs
from fxopt.pipeline import PassRecord, capture_step, removed_saved_bytes
from fxopt.planner.joint import activation_placeholders

__all__ = ["CapturedJoint", "capture_dynamo", "capture_joints"]


@dataclass(frozen=True)
class CapturedJoint:
    gm: fx.GraphModule
    num_fwd_outputs: int
    removed_bytes: int = 0  # plain saved bytes recompute_rnn took out (a fraction's base)
    codegen: Codegen = FX  # the code generator compilation resolves for the graph
    # placeholders that are another graph's outputs (counted by a fraction when kept)
    activation_inputs: frozenset[str] = frozenset()


def capture_joints(model: nn.Module, inputs: Sequence[Any], *, dynamic: bool = False,
                   options: Options | None = None) -> list[CapturedJoint]:
    """The joint graph of every Dynamo graph of one training step of ``model``, captured
    as compilation under ``options`` (default: the resolved defaults) captures it, with
    swap_recompute's pre-autograd passes on and tempo off (module doc)."""
    options = options if options is not None else config.resolve()
    passes = dataclasses.replace(options, swap_recompute=True, tempo=None)
    torch.compiler.reset()
    found: list[CapturedJoint] = []

    def backend(gm: fx.GraphModule, example_inputs: Any) -> Any:
        device = graph_device(example_inputs)
        ctx = PassContext(options=passes, stage=Stage.PRE_AUTOGRAD,
                          graph_kind=GraphKind.DYNAMO, graph_name=f"g{len(found)}/dynamo",
                          device=device, example_inputs=tuple(example_inputs),
                          codegen=resolve_codegen(options, device))
        records: list[PassRecord] = []

        def partition(joint: fx.GraphModule, joint_inputs: Any, **kwargs: Any):
            found.append(CapturedJoint(
                joint, kwargs["num_fwd_outputs"], removed_saved_bytes(records), ctx.codegen,
                activation_placeholders(joint, activation_inputs(example_inputs),
                                        len(example_inputs))))
            return _compat.default_partition(joint, joint_inputs, **kwargs)

        return capture_step(gm, example_inputs, ctx, records, partition=partition)

    _backward(model, torch.compile(model, backend=backend, dynamic=dynamic)(*inputs))
    return found


def _first_tensor(value: Any) -> torch.Tensor | None:
    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, dict):  # transformers' ModelOutput too: loss first when given
        value = list(value.values())
    if isinstance(value, (tuple, list)):
        return next((t for t in map(_first_tensor, value) if t is not None), None)
    return None


def capture_dynamo(model: nn.Module, inputs: Sequence[Any]) -> list[tuple[fx.GraphModule,
                                                                          list[Any]]]:
    """Every Dynamo graph of one training step of ``model`` with its example inputs (run
    as captured), for planning what happens before autograd (tempo's variants)."""
    torch.compiler.reset()
    found: list[tuple[fx.GraphModule, list[Any]]] = []

    def record(gm: fx.GraphModule, example_inputs: Any) -> Any:
        found.append((gm, list(example_inputs)))
        return gm.forward

    _backward(model, torch.compile(model, backend=record)(*inputs))
    return found


def _backward(model: nn.Module, out: Any) -> None:
    """Backward from the step's output (its first tensor, summed), then clear gradients."""
    loss = _first_tensor(out)
    if loss is None or not loss.requires_grad:
        raise ValueError("fxopt: the model's output has no tensor that requires grad: "
                         "planning needs a training step (model(*inputs), then backward)")
    loss.sum().backward()
    model.zero_grad(set_to_none=True)
    torch.compiler.reset()
