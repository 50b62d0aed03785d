"""Small models shared by the tests: an MLP (and a wide one a byte budget bites on), a
GPT-style block, a conv net, an LSTM, an
``nn.LSTM``/``nn.GRU`` language model with its loss (and its tokens), an LM head whose
loss a test writes, and a wrapper that
runs a model under bf16 autocast; ``seeded_step``, one measured training step;
``load_benchmark``, a benchmark script's models and measurements for the tests that check
what its committed table shows."""

import importlib.util
import math
import pathlib
import sys
import types

import torch
import torch.nn.functional as F
from torch import nn

from fxopt.analysis import measure_saved_bytes


class MLP(nn.Module):
    def __init__(self, d_in=13, hidden=37, d_out=5):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(d_in, hidden), nn.Linear(hidden, d_out)

    def forward(self, x):
        return self.fc2(F.gelu(self.fc1(x)))


class Block(nn.Module):
    """A pre-LayerNorm transformer block with attention written as matmul/softmax/dropout."""

    def __init__(self, dim=32, heads=4, dropout=0.0):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.fc1, self.fc2 = nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)
        self.drop = nn.Dropout(dropout)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=-1)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        scores = q @ k.transpose(-2, -1) / math.sqrt(d // self.heads)
        mask = torch.ones(t, t, dtype=torch.bool, device=x.device).tril()
        attn = self.drop(scores.masked_fill(~mask, float("-inf")).softmax(-1))
        x = x + self.proj((attn @ v).transpose(1, 2).reshape(b, t, d))
        return x + self.fc2(self.drop(F.gelu(self.fc1(self.ln2(x)))))


class ConvNet(nn.Module):
    def __init__(self, channels=8, classes=7):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, channels, 3, padding=1), nn.BatchNorm2d(channels), nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(channels, 2 * channels, 3, padding=1), nn.BatchNorm2d(2 * channels),
            nn.ReLU(), nn.AdaptiveAvgPool2d(1))
        self.head = nn.Linear(2 * channels, classes)

    def forward(self, x):
        return self.head(self.features(x).flatten(1))


class LSTMModel(nn.Module):
    def __init__(self, vocab=23, hidden=37):
        super().__init__()
        self.embed = nn.Embedding(vocab, hidden)
        self.lstm = nn.LSTM(hidden, hidden, num_layers=2, batch_first=True)
        self.head = nn.Linear(hidden, vocab)

    def forward(self, tokens):
        out, _ = self.lstm(self.embed(tokens))
        return self.head(out)


class RNNLanguageModel(nn.Module):
    """Embedding, a 2-layer ``nn.LSTM`` or ``nn.GRU``, a head, the LM loss."""

    def __init__(self, mode: str, vocab: int = 29, hidden: int = 12, dropout: float = 0.0,
                 batch_first: bool = True):
        super().__init__()
        self.embed = nn.Embedding(vocab, hidden)
        self.rnn = (nn.LSTM if mode == "lstm" else nn.GRU)(
            hidden, hidden, 2, batch_first=batch_first, dropout=dropout)
        self.head = nn.Linear(hidden, vocab)

    def forward(self, ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        states, _ = self.rnn(self.embed(ids))
        return F.cross_entropy(self.head(states).flatten(0, 1), labels.flatten())


def rnn_tokens() -> tuple[torch.Tensor, torch.Tensor]:
    """:class:`RNNLanguageModel`'s inputs and labels: 3 sequences of 11 of its 29 tokens."""
    generator = torch.Generator().manual_seed(1)
    return (torch.randint(0, 29, (3, 11), generator=generator),
            torch.randint(0, 29, (3, 11), generator=generator))


def deep_mlp() -> nn.Module:
    """Four Linear+GELU layers (width 48): enough saved activations for a budget to bite."""
    torch.manual_seed(0)
    layers = [m for _ in range(4) for m in (nn.Linear(48, 48), nn.GELU())]
    return nn.Sequential(*layers, nn.Linear(48, 5))


def wide_mlp() -> nn.Module:
    """Linear 16 -> 256 -> 256 -> 4 with GELUs: at a few hundred rows its activations
    outweigh its weights, so a byte budget has something to recompute."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 256), nn.GELU(), nn.Linear(256, 256), nn.GELU(),
                         nn.Linear(256, 4))


class LMHead(nn.Module):
    """A hidden layer and an LM head (vocabulary 131, hidden 16 by default) whose loss is
    written by ``loss`` ((module, h, labels) -> its output): the fused loss's tests.
    ``logits_bias``: BART's final_logits_bias, a (1, vocab) buffer the loss may add to the
    logits; "trained", a parameter."""

    def __init__(self, loss, bias=False, tied=False, vocab=131, hidden=16, logits_bias=False):
        super().__init__()
        self.embed = nn.Embedding(vocab, hidden)
        self.body = nn.Linear(hidden, hidden)
        self.head = nn.Linear(hidden, vocab, bias=bias)
        if tied:
            self.head.weight = self.embed.weight
        if logits_bias == "trained":
            self.final_logits_bias = nn.Parameter(torch.randn(1, vocab))
        elif logits_bias:
            self.register_buffer("final_logits_bias", torch.randn(1, vocab))
        self.loss = loss

    def forward(self, tokens, labels):
        h = torch.tanh(self.body(self.embed(tokens)))
        return self.loss(self, h, labels)


class BF16Autocast(nn.Module):
    """``inner`` run under CPU bf16 autocast, as a module: a comparison with eager deep-copies
    it, so each side trains its own parameters and their gradients are compared."""

    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def forward(self, *args):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return self.inner(*args)


def seeded_step(model: nn.Module, compiled, x: torch.Tensor):
    """Loss, gradients and measured saved bytes (saved-tensor hooks, parameters and input
    excluded) of one step of ``compiled`` (``model`` or a compiled form of it), seeded so
    that dropout draws the same masks in every call."""
    model.zero_grad(set_to_none=True)
    holder = {}

    def forward():
        holder["loss"] = compiled(x)
    torch.manual_seed(1)
    saved = measure_saved_bytes(forward, exclude=[*model.parameters(), x]).bytes
    holder["loss"].backward()
    return holder["loss"].detach(), [p.grad.clone() for p in model.parameters()], saved


def load_benchmark(name: str) -> types.ModuleType:
    """``benchmarks/<name>.py`` as a module, loaded once per process (registered in
    ``sys.modules`` under ``name``: its dataclasses look their module up there)."""
    if name not in sys.modules:
        path = pathlib.Path(__file__).parents[1] / "benchmarks" / f"{name}.py"
        spec = importlib.util.spec_from_file_location(name, path)
        sys.modules[name] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(sys.modules[name])
    return sys.modules[name]
