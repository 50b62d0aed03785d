"""Capture the joint forward+backward graphs of one training step, for planning offline.

``fxopt plan`` and the planner's tests need the joint graph AOTAutograd builds, without
running fxopt's passes (but for the two rewrites compilation under a budget makes before
autograd, so a saved plan's graphs are compilation's: the dropout calls that return their
input are dropped, whole ``nn.LSTM``/``nn.GRU`` calls become the recomputing op):
:func:`capture_joints` compiles the model with a recording
AOTAutograd backend configured as fxopt's (no decompositions, the default partition,
input mutations kept), runs one step (``model(*inputs)``, then backward from the sum of
the output, so a scalar loss is itself), and returns each graph's joint with its
``num_fwd_outputs``. Gradients the step leaves on the parameters are cleared afterwards.
Private torch APIs only through :mod:`fxopt._compat`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import fx, nn

from fxopt import _compat
from fxopt.codegen import Codegen, as_codegen
from fxopt.passes.fuse_linear_cross_entropy import fuse_linear_cross_entropies
from fxopt.passes.swap_recompute.noop_dropout import drop_noop_dropouts
from fxopt.passes.swap_recompute.recompute_rnn import recompute_whole_rnns

__all__ = ["CapturedJoint", "capture_dynamo", "capture_joints"]


@dataclass(frozen=True)
class CapturedJoint:
    gm: fx.GraphModule
    num_fwd_outputs: int
    removed_bytes: int = 0  # plain saved bytes recompute_rnn took out (a fraction's base)


def capture_joints(model: nn.Module, inputs: Sequence[Any], *, dynamic: bool = False,
                   codegen: Codegen | str = "fx") -> list[CapturedJoint]:
    """The joint graph of every Dynamo graph of one training step of ``model``, traced
    with the decompositions compilation uses for ``codegen``."""
    torch.compiler.reset()
    found: list[CapturedJoint] = []
    removed = [0]  # by the Dynamo graph being traced

    def partition(joint: fx.GraphModule, joint_inputs: Any, **kwargs: Any):
        found.append(CapturedJoint(joint, kwargs["num_fwd_outputs"], removed[0]))
        return _compat.default_partition(joint, joint_inputs, **kwargs)

    def run_as_is(gm: fx.GraphModule, _: Any) -> Any:
        return _compat.boxed_fx_callable(gm)

    aot = _compat.aot_autograd(fw_compiler=run_as_is, bw_compiler=run_as_is,
                               partition_fn=partition, keep_inference_input_mutations=True,
                               decompositions=as_codegen(codegen).decompositions())

    def backend(gm: fx.GraphModule, example_inputs: Any) -> Any:
        # what compilation under a budget does before autograd (swap_recompute's flag)
        dropped, recomputed = drop_noop_dropouts(gm), recompute_whole_rnns(gm)
        fused, _ = fuse_linear_cross_entropies(gm)
        removed[0] = sum(m.bytes for v in (recomputed, fused) for m in v.matched.values())
        if dropped or recomputed.matched or fused.matched:
            gm.recompile()
        return aot(gm, example_inputs)

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
