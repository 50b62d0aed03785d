"""Graph capture and models for the analysis tests.

:func:`capture` compiles a model with a recording AOTAutograd backend configured as fxopt's
(no decompositions, the default partition, input mutations kept) and runs one training
step (or one no_grad forward), so the tests see exactly the graphs fxopt sees. The models
are sized so that activations, not parameters, dominate memory (MB-scale tensors), and have
no dropout: eager ``Dropout(p=0)`` returns its input, while the traced graph clones it,
which would make eager's saved bytes differ from the graph's for a reason unrelated to the
analysis.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from functorch.compile import make_boxed_func
from models import ConvNet  # tests/models.py: the conv net the backend tests use too
from torch import fx, nn
from torch._dynamo.backends.common import aot_autograd
from torch._functorch.partitioners import default_partition


@dataclass
class Captured:
    inputs: list[Any] = field(default_factory=list)   # real Dynamo example inputs = primals
    graphs: dict[str, fx.GraphModule] = field(default_factory=dict)
    num_fwd_outputs: int = 0

    @property
    def fw(self) -> fx.GraphModule:
        return self.graphs["forward"]

    @property
    def bw(self) -> fx.GraphModule:
        return self.graphs["backward"]


def capture(model: nn.Module, x: torch.Tensor, *, dynamic: bool = False,
            train: bool = True) -> Captured:
    torch._dynamo.reset()
    captured = Captured()

    def recorder(kind: str):
        def compiler(gm: fx.GraphModule, example_inputs: Any) -> fx.GraphModule:
            captured.graphs[kind] = gm
            return make_boxed_func(gm)
        return compiler

    def partition(joint: fx.GraphModule, joint_inputs: Any, **kwargs: Any):
        captured.graphs["joint"] = joint
        captured.num_fwd_outputs = kwargs["num_fwd_outputs"]
        return default_partition(joint, joint_inputs, **kwargs)

    aot = aot_autograd(fw_compiler=recorder("forward"), bw_compiler=recorder("backward"),
                       inference_compiler=recorder("inference"), partition_fn=partition,
                       keep_inference_input_mutations=True)

    def backend(gm: fx.GraphModule, example_inputs: list[Any]) -> Any:
        captured.inputs = list(example_inputs)
        return aot(gm, example_inputs)

    compiled = torch.compile(model, backend=backend, dynamic=dynamic)
    if train:
        out = compiled(x)
        out.backward(torch.ones_like(out))  # the backward graph is compiled lazily
        model.zero_grad(set_to_none=True)
    else:
        with torch.no_grad():
            compiled(x)
    return captured


class MLP(nn.Module):
    def __init__(self, d_in: int = 256, hidden: int = 1024, d_out: int = 256) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(d_in, hidden), nn.Linear(hidden, d_out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.relu(self.fc1(x)))


class TransformerBlock(nn.Module):
    """Pre-LayerNorm block; causal attention written with matmul/softmax; GELU MLP."""

    def __init__(self, dim: int = 64, heads: int = 4) -> None:
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.fc1, self.fc2 = nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.proj(self._attention(self.ln1(x)))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))

    def _attention(self, h: torch.Tensor) -> torch.Tensor:
        # One expression per tensor and a separate method, so that eager Python locals do
        # not keep intermediates alive longer than the compiled graph does (the eager step
        # is one of the measurements the predictions are checked against).
        b, t, d = h.shape
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2)
                   for z in self.qkv(h).split(d, dim=-1))
        mask = torch.ones(t, t, dtype=torch.bool, device=h.device).tril()
        attn = (q @ k.transpose(-2, -1) / math.sqrt(d // self.heads)).masked_fill(
            ~mask, float("-inf")).softmax(-1)
        return (attn @ v).transpose(1, 2).reshape(b, t, d)


# (name, model factory, input factory): activations of a few MB to ~16 MB each.
MODELS = {
    "mlp": (lambda: MLP(), lambda: torch.randn(2048, 256)),
    "transformer_block": (lambda: TransformerBlock(), lambda: torch.randn(8, 128, 64)),
    "convnet": (lambda: ConvNet(channels=16, classes=10), lambda: torch.randn(16, 3, 64, 64)),
}
