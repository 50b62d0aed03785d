"""Quickstart: train a small GPT-style model with torch.compile(backend="fxopt").

    python examples/quickstart.py              # CPU, or CUDA when there is one
    python examples/quickstart.py --steps 200 --options '{"codegen": "inductor"}'
    python examples/quickstart.py --options '{}'            # fxopt's defaults only

The model learns a synthetic task (each token predicts the next one of a repeating
pattern), so the loss visibly falls. By default it trains with Tempo's memory-lean layers
and a memory budget of 70% of the activation memory plain autograd keeps (the planner
picks which saved activations to recompute), with fxopt's default code generator
(codegen="auto": Inductor, on the CPU as on CUDA, with Tempo's fusible forms; the explain
report says which ran and why; Tempo and the budget work under fx too). At the end it prints
fxopt's explain report: which graphs were captured, what each pass did, the plan, and the
predicted memory of a training step with plain autograd and with fxopt.
"""

from __future__ import annotations

import argparse
import json
import math
import time

import torch
import torch.nn.functional as F
from torch import nn

import fxopt


class CausalSelfAttention(nn.Module):
    def __init__(self, dim: int, heads: int, dropout: float) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(x).split(d, dim=-1)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        scores = q @ k.transpose(-2, -1) / math.sqrt(d // self.heads)
        causal = torch.ones(t, t, dtype=torch.bool, device=x.device).tril()
        weights = self.dropout(scores.masked_fill(~causal, float("-inf")).softmax(dim=-1))
        return self.proj((weights @ v).transpose(1, 2).reshape(b, t, d))


class Block(nn.Module):
    def __init__(self, dim: int, heads: int, dropout: float) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.attn = CausalSelfAttention(dim, heads, dropout)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim),
                                 nn.Dropout(dropout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class TinyGPT(nn.Module):
    def __init__(self, vocab: int = 64, dim: int = 64, heads: int = 4, layers: int = 2,
                 context: int = 32, dropout: float = 0.1) -> None:
        super().__init__()
        self.tokens = nn.Embedding(vocab, dim)
        self.positions = nn.Embedding(context, dim)
        self.blocks = nn.ModuleList(Block(dim, heads, dropout) for _ in range(layers))
        self.ln = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(idx.shape[1], device=idx.device)
        x = self.tokens(idx) + self.positions(positions)
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.ln(x))
        return F.cross_entropy(logits.flatten(0, 1), targets.flatten())


def batch(vocab: int, size: int, context: int, device: torch.device,
          generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Sequences that count up modulo a random period: predictable from the context."""
    start = torch.randint(0, vocab, (size, 1), generator=generator)
    period = torch.randint(3, 9, (size, 1), generator=generator)
    steps = torch.arange(context + 1)
    seq = (start + steps % period) % vocab
    return seq[:, :-1].to(device), seq[:, 1:].to(device)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--options", default='{"tempo": true, "memory_budget": 0.7}',
                        help="fxopt options as JSON (default: %(default)s)")
    args = parser.parse_args()

    torch.manual_seed(0)
    device = torch.device(args.device)
    options = json.loads(args.options)
    model = TinyGPT().to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    compiled = torch.compile(model, backend="fxopt", options=options)
    generator = torch.Generator().manual_seed(0)
    vocab, context = model.tokens.num_embeddings, model.positions.num_embeddings

    print(f"training TinyGPT ({sum(p.numel() for p in model.parameters()):,} parameters) "
          f"on {device} with backend='fxopt', options={options}")
    start = time.perf_counter()
    for step in range(1, args.steps + 1):
        idx, targets = batch(vocab, args.batch, context, device, generator)
        loss = compiled(idx, targets)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if step == 1:
            print(f"step    1  loss {loss.item():.3f}  (first step compiles: "
                  f"{time.perf_counter() - start:.1f}s)")
        elif step % 10 == 0 or step == args.steps:
            print(f"step {step:4d}  loss {loss.item():.3f}")
    print(f"{args.steps} steps in {time.perf_counter() - start:.1f}s\n")

    idx, targets = batch(vocab, args.batch, context, device, generator)
    print(fxopt.explain(model, idx, targets, options=options))


if __name__ == "__main__":
    main()
