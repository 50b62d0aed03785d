"""Fake values and byte sizes: static and symbolic sizes, multi-output nodes, re-propagation."""

import operator

import pytest
import torch
from analysis_helpers import MODELS, capture
from torch.fx.experimental.proxy_tensor import make_fx

from fxopt import _compat
from fxopt.analysis import (
    ensure_fake_values,
    nbytes,
    size_hint,
    storage_nbytes,
    tensor_values,
)

aten = torch.ops.aten


@pytest.mark.parametrize("value, expected", [
    (torch.empty(3, 5), 60),
    (torch.empty(3, 5, dtype=torch.bfloat16), 30),
    (torch.empty(7, dtype=torch.bool), 7),
    (torch.empty(0, 4), 0),
    (torch.empty(2, 3).t(), 24),           # a view: logical size
    (3, 0), (None, 0), (2.5, 0),
])
def test_nbytes(value, expected):
    assert nbytes(value) == expected


def test_storage_nbytes_follows_strides():
    padded = torch.empty_strided((2, 3), (4, 1))       # rows padded to 4 elements
    assert nbytes(padded) == 24
    assert storage_nbytes(padded) == 7 * 4              # up to the last element reached
    assert storage_nbytes(torch.empty(2, 3)) == 24
    assert storage_nbytes(torch.empty(0, 3)) == 0


def test_tensor_values_flatten_multi_output_nodes():
    def fn(x, w, b):
        return aten.native_layer_norm.default(x, [8], w, b, 1e-5)

    gm = make_fx(fn, tracing_mode="fake")(torch.empty(4, 8), torch.empty(8), torch.empty(8))
    ln = next(n for n in gm.graph.nodes if n.target == aten.native_layer_norm.default)
    shapes = [tuple(t.shape) for t in tensor_values(ln)]
    assert shapes == [(4, 8), (4, 1), (4, 1)]
    first = next(n for n in gm.graph.nodes if n.target is operator.getitem)
    assert [tuple(t.shape) for t in tensor_values(first)] == [(4, 8)]


def _dynamic_block():
    make_model, make_input = MODELS["transformer_block"]
    x = make_input()
    return capture(make_model(), x, dynamic=True), x


def test_symbolic_sizes_resolve_to_their_hints():
    cap, x = _dynamic_block()
    phs = [n for n in cap.fw.graph.nodes if n.op == "placeholder"]
    sym_ints = [n.meta["val"] for n in phs if isinstance(n.meta["val"], torch.SymInt)]
    assert sym_ints, "dynamic=True should give symbolic sizes"
    assert sorted(size_hint(s) for s in sym_ints) == sorted(set(x.shape[:2]))
    x_fake = next(n.meta["val"] for n in phs if isinstance(n.meta["val"], torch.Tensor)
                  and n.meta["val"].dim() == 3)
    assert any(isinstance(s, torch.SymInt) for s in x_fake.shape)
    assert nbytes(x_fake) == x.numel() * 4
    assert tensor_values(next(n for n in phs if isinstance(n.meta["val"], torch.SymInt))) == []


def test_sizes_planned_at_read_those_symbols_at_those_sizes_and_add_no_guard():
    """A byte budget's graph planned again at a larger call (SizeWatch) reads its sizes
    there: the planned symbol at its planned size, expressions of it evaluated, every other
    symbol at its hint."""
    cap, x = _dynamic_block()
    phs = [n for n in cap.fw.graph.nodes if n.op == "placeholder"]
    x_fake = next(n.meta["val"] for n in phs if isinstance(n.meta["val"], torch.Tensor)
                  and n.meta["val"].dim() == 3)
    first, second = x_fake.shape[0], x_fake.shape[1]
    assert isinstance(first, torch.SymInt) and isinstance(second, torch.SymInt)
    guards = len(first.node.shape_env.guards)
    with _compat.sizes_planned_at({str(first): 3 * x.shape[0]}):
        assert size_hint(first) == 3 * x.shape[0]
        assert size_hint(second) == x.shape[1]               # not planned: its hint
        assert size_hint(first * second + 1) == 3 * x.shape[0] * x.shape[1] + 1
        assert nbytes(x_fake) == 3 * x.numel() * 4
    assert size_hint(first) == x.shape[0] and nbytes(x_fake) == x.numel() * 4  # restored
    assert len(first.node.shape_env.guards) == guards


def test_ensure_fake_values_fills_in_new_nodes_with_the_same_symbols():
    cap, _ = _dynamic_block()
    gm = cap.fw
    assert ensure_fake_values(gm) is False            # nothing missing: nothing done
    source = next(n for n in gm.graph.nodes if n.target == aten.gelu.default)
    with gm.graph.inserting_after(source):
        new = gm.graph.call_function(aten.relu.default, (source,))
    source.replace_all_uses_with(new, delete_user_cb=lambda user: user is not new)
    gm.recompile()
    shape_env = source.meta["val"].shape[0].node.shape_env
    guards = len(shape_env.guards)
    assert ensure_fake_values(gm) is True
    val = new.meta["val"]
    assert str(val.shape) == str(source.meta["val"].shape)  # same symbols, not new ones
    assert val.shape[0].node.shape_env is shape_env
    assert len(shape_env.guards) == guards
    assert nbytes(val) == nbytes(source.meta["val"])


def test_ensure_fake_values_needs_a_fake_mode():
    gm = torch.fx.symbolic_trace(lambda x: torch.relu(x) + 1)
    with pytest.raises(ValueError, match="fake mode"):
        ensure_fake_values(gm)
