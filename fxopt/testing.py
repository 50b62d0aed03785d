"""Test helpers every pass's tests use: compiled-vs-eager comparison and test-only passes.

:func:`assert_same_as_eager` runs a model (or function) eagerly and compiled with fxopt on
identical copies, from the same RNG state, and compares outputs, then every gradient
(inputs, parameters) and the buffers a step mutates: shapes and dtypes first, then values
with the tolerance of the dtype (:data:`TOLERANCES`). Non-tensor outputs must be equal;
objects pytree does not open (a model's cache) are compared attribute by attribute. It
fails where fxopt compiled no graph at all (Dynamo ran the model eagerly: eager against
eager proves nothing), and returns the compilation records so a test can also assert that
its pass fired.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from fxopt import _compat, passes
from fxopt.compiler import Backend, GraphRecord
from fxopt.explain import differentiable_outputs
from fxopt.passes import PassSpec
from fxopt.pipeline import PassRecord

__all__ = ["TEMPO_TOLERANCES", "TOLERANCES", "Comparison", "assert_same_as_eager", "extra_passes"]

# (rtol, atol) per dtype. fp32: compiled graphs run the same aten kernels as eager but may
# sum gradients in another order; bf16/fp16: one rounding of the dtype, as torch.testing.
TOLERANCES: dict[torch.dtype, tuple[float, float]] = {
    torch.float64: (1e-7, 1e-7),
    torch.float32: (1e-4, 1e-5),
    torch.bfloat16: (1.6e-2, 1e-2),
    torch.float16: (1e-3, 1e-3),
}

# fp32 under tempo. Tempo's GELU backward reads the derivative from the fp32 output and a
# branch bit: the fit is within 7.5e-5 of the exact derivative on a grid (fit_gelu.py), and
# near GELU's minimum, where y - y_min grows like (x - x_min)**2, a rounding dy of y moves
# the derivative by about sqrt(2 * GELU''(x_min) * dy): 1.6e-4 measured where y is rounded
# once, 3.2e-4 where Inductor's fused erf rounds y a few ulps apart. The norms rebuild
# x_hat as (y - b) / w, one more rounding. The gradients of the layers before are sums of
# such errors weighted by O(1) values, hence 2e-4 absolute on models of a few dozen
# features, from a fixed seed (an unlucky input sitting on the minimum, after a LayerNorm
# whose backward scales by rstd, moved one weight's gradient by 2.3e-3 in 600 seeds).
TEMPO_TOLERANCES: dict[torch.dtype, tuple[float, float]] = {torch.float32: (1e-4, 2e-4)}


@dataclass
class Comparison:
    """What :func:`assert_same_as_eager` compiled; use it to check that a pass fired."""

    graphs: list[GraphRecord]
    eager_output: Any
    compiled_output: Any

    @property
    def passes(self) -> list[PassRecord]:
        return [r for g in self.graphs for r in g.passes]

    def fired(self, name: str) -> bool:
        return any(r.fired for r in self.passes if r.name == name)


def _clone_args(args: Any) -> Any:
    def clone(x: Any) -> Any:
        if isinstance(x, torch.Tensor):
            return x.detach().clone().requires_grad_(x.requires_grad)
        return x

    return _compat.tree_map(clone, args)


def _loss(output: Any, seed: int) -> torch.Tensor | None:
    """A weighted sum of the float outputs, with fixed random weights, so that every
    output element gets a distinct gradient (a plain sum hides many mistakes)."""
    leaves = differentiable_outputs(output)
    if not leaves:
        return None
    generator = torch.Generator().manual_seed(seed)
    return sum((t.float() * torch.randn(t.shape, generator=generator).to(t.device)).sum()
               for t in leaves)


def _assert_close(actual: Any, expected: Any, what: str,
                  tolerances: Mapping[torch.dtype, tuple[float, float]]) -> None:
    if not isinstance(expected, torch.Tensor):
        assert type(actual) is type(expected), f"{what}: {type(actual)} != {type(expected)}"
        if hasattr(expected, "__dict__") and not isinstance(expected, type):
            # an object pytree does not open (e.g. a model's key-value cache): its
            # attributes, tensors with the dtype's tolerance
            _compare_tree(vars(actual), vars(expected), f"{what} ({type(expected).__name__})",
                          tolerances)
        else:
            assert actual == expected, f"{what}: {actual!r} != {expected!r}"
        return
    assert isinstance(actual, torch.Tensor), f"{what}: expected a tensor, got {type(actual)}"
    assert actual.shape == expected.shape, f"{what}: shape {actual.shape} != {expected.shape}"
    assert actual.dtype == expected.dtype, f"{what}: dtype {actual.dtype} != {expected.dtype}"
    rtol, atol = tolerances.get(expected.dtype, (0.0, 0.0))
    torch.testing.assert_close(actual.detach(), expected.detach(), rtol=rtol, atol=atol,
                               msg=lambda m: f"{what}: {m}")


def assert_same_as_eager(model_or_fn: Any, args: Sequence[Any], options: Mapping[str, Any]
                         | None = None, *, kwargs: Mapping[str, Any] | None = None,
                         check_grads: bool = True, dynamic: bool | None = None, seed: int = 0,
                         steps: int = 1, tolerances: Mapping[torch.dtype, tuple[float, float]]
                         | None = None) -> Comparison:
    """Assert that fxopt with ``options`` computes what eager computes, for ``steps`` calls.

    A module is deep-copied for each side; inputs are cloned. Each step seeds the RNG
    identically on both sides (dropout gets the same masks). With ``check_grads``, a
    weighted sum of the outputs is back-propagated and the gradients of every input and
    parameter that requires grad, and every buffer, are compared.
    """
    tolerances = {**TOLERANCES, **(tolerances or {})}
    kwargs = dict(kwargs or {})
    is_module = isinstance(model_or_fn, torch.nn.Module)
    eager = copy.deepcopy(model_or_fn) if is_module else model_or_fn
    backend = Backend(options)
    compiled = torch.compile(copy.deepcopy(model_or_fn) if is_module else model_or_fn,
                             backend=backend, dynamic=dynamic)
    for step in range(steps):
        eager_args, compiled_args = _clone_args((tuple(args), kwargs)), _clone_args(
            (tuple(args), kwargs))
        torch.manual_seed(seed + step)
        expected = eager(*eager_args[0], **eager_args[1])
        torch.manual_seed(seed + step)
        actual = compiled(*compiled_args[0], **compiled_args[1])
        _compare_tree(actual, expected, f"step {step} output", tolerances)
        if check_grads:
            _compare_grads(eager, compiled, eager_args, compiled_args, expected, actual,
                           seed + step, step, tolerances)
    assert backend.graphs, (
        "fxopt compiled no graph: torch.compile ran every step eagerly (Dynamo skipped the "
        "frame, or hit its recompile limit; TORCH_LOGS=recompiles shows why), so the "
        "comparison held eager against eager; call torch._dynamo.reset() between models")
    return Comparison(graphs=list(backend.graphs), eager_output=expected,
                      compiled_output=actual)


def _compare_tree(actual: Any, expected: Any, what: str,
                  tolerances: Mapping[torch.dtype, tuple[float, float]]) -> None:
    expected_leaves, expected_spec = _compat.tree_flatten(expected)
    actual_leaves, actual_spec = _compat.tree_flatten(actual)
    assert len(actual_leaves) == len(expected_leaves), (
        f"{what}: structure {actual_spec} != {expected_spec}")
    for i, (a, e) in enumerate(zip(actual_leaves, expected_leaves)):
        _assert_close(a, e, f"{what} [{i}]", tolerances)


def _compare_grads(eager: Any, compiled: Any, eager_args: Any, compiled_args: Any,
                   expected: Any, actual: Any, seed: int, step: int,
                   tolerances: Mapping[torch.dtype, tuple[float, float]]) -> None:
    expected_loss, actual_loss = _loss(expected, seed), _loss(actual, seed)
    if expected_loss is None:
        return
    expected_loss.backward()
    actual_loss.backward()
    pairs = list(zip(_compat.tree_leaves(compiled_args), _compat.tree_leaves(eager_args)))
    named = [(f"input {i}", a, e) for i, (a, e) in enumerate(pairs)
             if isinstance(e, torch.Tensor) and e.requires_grad]
    if isinstance(eager, torch.nn.Module):
        compiled_module = compiled._orig_mod  # the module torch.compile wraps
        named += [(f"parameter {n}", a, e) for (n, e), (_, a) in zip(
            eager.named_parameters(), compiled_module.named_parameters()) if e.requires_grad]
        for (n, e), (_, a) in zip(eager.named_buffers(), compiled_module.named_buffers()):
            _assert_close(a, e, f"step {step} buffer {n}", tolerances)
    for name, a, e in named:
        if e.grad is None:
            assert a.grad is None, f"step {step} grad of {name}: eager has none, fxopt has one"
            continue
        assert a.grad is not None, f"step {step} grad of {name}: fxopt computed none"
        _assert_close(a.grad, e.grad, f"step {step} grad of {name}", tolerances)


@contextlib.contextmanager
def extra_passes(*specs: PassSpec) -> Iterator[None]:
    """Temporarily add passes to the pipeline (test-only passes, e.g. one that fails)."""
    passes.PIPELINE.extend(specs)
    try:
        yield
    finally:
        for spec in specs:
            passes.PIPELINE.remove(spec)
