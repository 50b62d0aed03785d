"""What a training step asks of a language model's output, so that its compiled graph makes
no more than that.

transformers' language models, causal and sequence-to-sequence, return the loss and the
(batch x sequence x vocabulary) logits together. Compiled as users compile them
(``torch.compile(model)``, the step ``model(ids, labels=ids).loss.backward()``), the
logits are a graph output, so the graph makes them and keeps them until the output is
dropped: on GPT-2's vocabulary that is the step's largest tensor, and it is made even where
``fuse_linear_cross_entropy`` computes the loss without it (explain: "its logits still made
for another user"). A module forward hook cannot drop them: torch.compile compiles the
module's forward, and the hooks run after it.

:func:`drop_logits` wraps the model's own forward, inside what Dynamo traces, so that a call
that computes a loss returns it without the logits; the Linear then has no user but the
loss, which the pass replaces whole. Measured on transformers GPT-2 (2 layers x 128,
4 x 512 tokens, fp32, Inductor code generation, one thread): the fused loss's step peaks
at 545.6 MiB with the logits returned and 151.8 without (plain Inductor: 1279.8), at
3772 and 1890 ms (plain Inductor: 2448; benchmarks/results/drop_logits_cpu.md).
"""

from __future__ import annotations

import functools
from typing import Any

import torch

__all__ = ["drop_logits", "drops_logits"]


def drop_logits(model: torch.nn.Module) -> torch.nn.Module:
    """Make ``model`` return no logits from a call that computes its loss (``labels``
    given): its output's ``logits`` is None there (a tuple output, ``return_dict=False``,
    gets None in the logits' place); every other field, and every call without a loss, is
    as before. For training steps that read only the loss; metrics that need the logits
    need them returned. Changes ``model`` in place (its forward is kept as
    ``model.forward.__wrapped__``; a second call changes nothing) and returns it; compile
    it afterwards::

        model = torch.compile(fxopt.drop_logits(model), backend="fxopt",
                              options={"memory_budget": "6GiB"})

    Raises TypeError for something that is not an ``nn.Module``."""
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"fxopt.drop_logits: expected an nn.Module, got "
                        f"{type(model).__name__}")
    if drops_logits(model):
        return model
    forward = model.forward

    @functools.wraps(forward)
    def forward_without_logits(*args: Any, **kwargs: Any) -> Any:
        return _without_logits(forward(*args, **kwargs))

    forward_without_logits._fxopt_drops_logits = True  # type: ignore[attr-defined]
    model.forward = forward_without_logits
    return model


def drops_logits(model: Any) -> bool:
    """Whether :func:`drop_logits` has wrapped ``model``'s forward."""
    return getattr(getattr(model, "forward", None), "_fxopt_drops_logits", False)


def _without_logits(output: Any) -> Any:
    """``output`` with its logits dropped where it carries a loss."""
    if isinstance(output, tuple):  # return_dict=False: (loss, logits, ...) with a loss
        if len(output) >= 2 and isinstance(output[0], torch.Tensor) and output[0].dim() == 0:
            return (output[0], None, *output[2:])
        return output
    if getattr(output, "loss", None) is None or getattr(output, "logits", None) is None:
        return output
    fields = {key: value for key, value in output.items() if key != "logits"}
    return type(output)(**fields)
