"""fxopt.testing's comparison itself: what it calls equal and what not."""

import pytest
import torch

from fxopt.testing import TOLERANCES, _compare_tree, assert_same_as_eager


class Cache:
    """An output object pytree does not open (like a model's key-value cache)."""

    def __init__(self, keys, length):
        self.keys, self.length = keys, length


def test_objects_are_compared_attribute_by_attribute():
    keys = [torch.ones(2, 3)]
    _compare_tree((Cache(keys, 3),), (Cache([k.clone() for k in keys], 3),), "out", TOLERANCES)
    with pytest.raises(AssertionError, match=r"out \[0\] \(Cache\).*not close"):
        _compare_tree((Cache([keys[0] + 1], 3),), (Cache(keys, 3),), "out", TOLERANCES)
    with pytest.raises(AssertionError, match="4 != 3"):
        _compare_tree((Cache(keys, 4),), (Cache(keys, 3),), "out", TOLERANCES)


def test_non_tensor_leaves_must_be_equal():
    _compare_tree((1, "a", torch.float32), (1, "a", torch.float32), "out", TOLERANCES)
    with pytest.raises(AssertionError, match="torch.bfloat16 != torch.float32"):
        _compare_tree((torch.bfloat16,), (torch.float32,), "out", TOLERANCES)
    with pytest.raises(AssertionError, match="<class 'int'> != <class 'float'>"):
        _compare_tree((1,), (1.0,), "out", TOLERANCES)


def test_a_comparison_that_compiled_nothing_fails():
    """Where Dynamo runs the model eagerly (here every op sits behind
    torch.compiler.disable; in a sweep of models, its recompile limit), eager is compared
    with eager: the comparison must fail, not pass."""
    def step(x):
        return torch.nn.functional.gelu(x * 2)

    def only_eager(x):
        return torch.compiler.disable(step)(x)

    x = torch.randn(3, 5, requires_grad=True)
    assert assert_same_as_eager(step, (x,), {"codegen": "fx"}).graphs
    with pytest.raises(AssertionError, match="fxopt compiled no graph"):
        assert_same_as_eager(only_eager, (x,), {"codegen": "fx"})
