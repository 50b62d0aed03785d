"""fxopt's own ops compose with a fraction budget: tempo's and fuse_rnn's outputs are
recomputed like aten ops (the op runs again in the backward), and the step is bitwise the
step without the budget."""

import pytest
import torch
from torch import nn

import fxopt


class CellLoop(nn.Module):
    """An nn.LSTMCell stepped through a sequence: fuse_rnn's lstm_cell per step."""

    def __init__(self) -> None:
        super().__init__()
        self.cell = nn.LSTMCell(12, 12)
        self.head = nn.Linear(12, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = c = x.new_zeros(x.shape[0], 12)
        for t in range(x.shape[1]):
            h, c = self.cell(x[:, t], (h, c))
        return self.head(h).square().mean()


def _mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(16, 64), nn.GELU(), nn.Linear(64, 16), nn.LayerNorm(16))


def _run(model: nn.Module, x: torch.Tensor, options: dict):
    backend = fxopt.backend(**options)
    compiled = torch.compile(model, backend=backend)
    model.zero_grad(set_to_none=True)
    out = compiled(x)
    loss = out if out.dim() == 0 else out.square().mean()
    loss.backward()
    return loss.detach(), [p.grad.clone() for p in model.parameters()], backend.graphs[0]


@pytest.mark.parametrize("flag, build, shape, op", [
    ("tempo", _mlp, (8, 16), "tempo_"),
    ("fuse_rnn", CellLoop, (2, 5, 12), "lstm_cell"),
], ids=["tempo", "fuse_rnn"])
def test_custom_op_outputs_are_recomputed_and_the_step_is_unchanged(flag, build, shape, op):
    torch.manual_seed(0)
    x = torch.randn(*shape)
    model = build()
    reference = _run(model, x, {flag: True})
    torch._dynamo.reset()
    loss, grads, graph = _run(model, x, {flag: True, "codegen": "fx", "memory_budget": 0.1,
                                       "strict": True})
    (pass_record,) = graph.pass_records(flag)
    assert pass_record.fired
    (record,) = graph.pass_records("swap_recompute")
    assert record.fired and record.stats["feasible"]
    recomputed = [n for n in graph.graphs["backward"].graph.nodes
                  if n.op == "call_function" and op in str(n.target)
                  and "backward" not in str(n.target)]
    assert recomputed, f"no {op} op rebuilt in the backward"
    assert torch.equal(loss, reference[0])
    assert all(torch.equal(a, b) for a, b in zip(grads, reference[1]))
