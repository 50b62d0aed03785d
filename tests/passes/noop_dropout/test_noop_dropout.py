"""noop_dropout: a dropout that returns its input (p=0, or training off) is dropped before
autograd, so the compiled graph saves what eager saves (no decomposed clone), with outputs
and gradients equal to eager's; a dropout that draws a mask is left alone."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import fxopt
from fxopt.analysis import measure_saved_bytes
from fxopt.testing import assert_same_as_eager


class Attention(nn.Module):
    """``dropout(softmax(q k^T)) @ v`` as transformers' eager attention writes it; with
    ``p=0`` the matmul reads the dropout's clone, which AOTAutograd would save."""

    def __init__(self, p: float, training_flag: bool = True, dim: int = 12) -> None:
        super().__init__()
        self.p, self.training_flag = p, training_flag
        self.qkv = nn.Linear(dim, 3 * dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        probs = (q @ k.transpose(-1, -2)).softmax(dim=-1)
        probs = F.dropout(probs, p=self.p, training=self.training_flag)
        return torch.dropout(probs @ v, self.p, self.training_flag).tanh()


def _removed(comparison) -> int:
    return sum(r.verdicts.count for r in comparison.passes
               if r.name == "noop_dropout")


@pytest.mark.parametrize("p, training", [(0.0, True), (0.3, False)])
def test_identity_dropout_is_dropped_and_eager_kept(p, training):
    model, x = Attention(p, training), torch.randn(3, 7, 12)
    comparison = assert_same_as_eager(model, (x,), {"codegen": "fx", "memory_budget": 1.0})
    assert comparison.fired("noop_dropout") and _removed(comparison) == 2
    eager = measure_saved_bytes(lambda: model(x), exclude=[*model.parameters(), x]).bytes
    compiled = torch.compile(model, backend=fxopt.backend(codegen="fx", memory_budget=1.0))
    kept = measure_saved_bytes(lambda: compiled(x), exclude=[*model.parameters(), x]).bytes
    assert kept == eager  # without the pass: eager's plus the (3, 7, 7) clone


def test_dropout_that_draws_a_mask_is_left_alone():
    comparison = assert_same_as_eager(Attention(0.25), (torch.randn(3, 7, 12),),
                                      {"codegen": "fx", "memory_budget": 1.0})
    assert not comparison.fired("noop_dropout") and _removed(comparison) == 0
