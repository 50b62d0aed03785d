"""The training workloads of the benchmark suite, each at a real size and a smoke size.

Transformers are built from ``transformers`` configs with random weights (GPT-2 small and
medium, BERT base and large, a Llama-style decoder); the ResNet-50-class conv net and the
LSTM language model are written here in plain torch (no torchvision). A workload builds
its model and makes a batch of inputs of any size, so the suite can search for the
largest batch that fits; ``checkpoint_layers`` names the repeated blocks that the
``torch.utils.checkpoint`` configuration wraps.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

__all__ = ["WORKLOADS", "LSTMCellLoopLM", "LSTMLanguageModel", "Workload", "get_workloads",
           "gpt2"]


@dataclass(frozen=True)
class Workload:
    """``build(smoke)`` returns the model; ``inputs(model, batch, smoke, device)`` a batch
    (positional tuple or keyword dict) whose loss the model's output gives (see
    `fxopt.profile.default_loss`); ``items`` the tokens or images per sample, for
    throughput."""

    name: str
    build: Callable[[bool], nn.Module]
    inputs: Callable[[nn.Module, int, bool, torch.device], Any]
    batch: int
    smoke_batch: int
    items: Callable[[bool], int]
    unit: str                                       # what ``items`` counts
    checkpoint_layers: Callable[[nn.Module], list[nn.Module]]
    in_smoke: bool = True   # False: its smoke model is another workload's (a larger size)


# ---- transformers from configs ---------------------------------------------------------

def _hf(kind: str, smoke: bool, **real: int) -> nn.Module:
    import transformers

    sizes = dict(layers=2, hidden=32, heads=2, vocab=101, positions=64) if smoke else real
    if kind == "gpt2":
        return gpt2(sizes["layers"], sizes["hidden"], sizes["heads"], sizes["vocab"],
                    sizes["positions"])
    if kind == "bert":
        config = transformers.BertConfig(
            num_hidden_layers=sizes["layers"], hidden_size=sizes["hidden"],
            num_attention_heads=sizes["heads"], intermediate_size=4 * sizes["hidden"],
            max_position_embeddings=sizes["positions"], vocab_size=sizes["vocab"])
        return transformers.BertForMaskedLM(config)
    config = transformers.LlamaConfig(
        num_hidden_layers=sizes["layers"], hidden_size=sizes["hidden"],
        num_attention_heads=sizes["heads"], num_key_value_heads=sizes["heads"],
        intermediate_size=int(8 / 3 * sizes["hidden"]) // 16 * 16 or 16,
        max_position_embeddings=sizes["positions"], vocab_size=sizes["vocab"])
    return transformers.LlamaForCausalLM(config)


def _token_inputs(seq: int, smoke_seq: int) -> Callable[..., Any]:
    def make(model: nn.Module, batch: int, smoke: bool, device: torch.device) -> Any:
        ids = torch.randint(0, model.config.vocab_size, (batch, smoke_seq if smoke else seq),
                            device=device)
        return {"input_ids": ids, "labels": ids}
    return make


def _hf_layers(model: nn.Module) -> list[nn.Module]:
    base = getattr(model, model.base_model_prefix)
    layers = getattr(base, "h", None) or getattr(base, "layers", None) or base.encoder.layer
    return list(layers)


def _lm(name: str, kind: str, batch: int, seq: int, in_smoke: bool = True,
        **real: int) -> Workload:
    return Workload(name, lambda smoke: _hf(kind, smoke, **real), _token_inputs(seq, 32),
                    batch, 2, lambda smoke: 32 if smoke else seq, "tokens", _hf_layers,
                    in_smoke)


# ---- a ResNet-50-class conv net in plain torch -------------------------------------------

class Bottleneck(nn.Module):
    def __init__(self, cin: int, width: int, stride: int) -> None:
        super().__init__()
        cout = 4 * width
        self.body = nn.Sequential(
            nn.Conv2d(cin, width, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU(inplace=True),
            nn.Conv2d(width, width, 3, stride, 1, bias=False), nn.BatchNorm2d(width),
            nn.ReLU(inplace=True), nn.Conv2d(width, cout, 1, bias=False), nn.BatchNorm2d(cout))
        self.skip = (nn.Identity() if stride == 1 and cin == cout else nn.Sequential(
            nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.body(x) + self.skip(x))


class ResNet(nn.Module):
    """ResNet-50's layout (bottleneck blocks 3-4-6-3, widths 64..512); ``base`` scales it."""

    def __init__(self, blocks: tuple[int, ...] = (3, 4, 6, 3), base: int = 64,
                 classes: int = 1000) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, base, 7, 2, 3, bias=False), nn.BatchNorm2d(base),
                                  nn.ReLU(inplace=True), nn.MaxPool2d(3, 2, 1))
        layers, cin = [], base
        for stage, count in enumerate(blocks):
            width = base * 2**stage
            for i in range(count):
                layers.append(Bottleneck(cin, width, 2 if i == 0 and stage > 0 else 1))
                cin = 4 * width
        self.blocks = nn.Sequential(*layers)
        self.head = nn.Linear(cin, classes)
        self.classes = classes

    def forward(self, images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        features = self.blocks(self.stem(images)).mean((2, 3))
        return nn.functional.cross_entropy(self.head(features), labels)


def _resnet_inputs(model: nn.Module, batch: int, smoke: bool, device: torch.device) -> Any:
    size = 32 if smoke else 224
    return (torch.randn(batch, 3, size, size, device=device),
            torch.randint(0, model.classes, (batch,), device=device))


# ---- an LSTM language model ------------------------------------------------------------

class LSTMLanguageModel(nn.Module):
    """Embedding(vocab, embed) -> ``nn.LSTM(embed, hidden, layers, batch_first)`` ->
    Linear(hidden, vocab); ``embed`` defaults to ``hidden``. The one nn.LSTM LM of the
    benchmarks (the suite's ``lstm-lm``, the GPU check's, fuse_rnn's and budget_reach's).

    ``model(tokens)`` is the next-token loss of ``tokens`` (batch x (seq + 1));
    ``model(input_ids=..., labels=...)`` the loss of each position against ``labels``
    (transformers' keyword convention, unshifted).
    """

    def __init__(self, vocab: int, hidden: int, layers: int = 2,
                 embed: int | None = None) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, embed or hidden)
        self.lstm = nn.LSTM(embed or hidden, hidden, num_layers=layers, batch_first=True)
        self.head = nn.Linear(hidden, vocab)
        self.vocab = vocab

    def logits(self, tokens: torch.Tensor) -> torch.Tensor:
        out, _ = self.lstm(self.embed(tokens))
        return self.head(out)

    def forward(self, input_ids: torch.Tensor,
                labels: torch.Tensor | None = None) -> torch.Tensor:
        return _lm_loss(self.logits, input_ids, labels)


class LSTMCellLoopLM(nn.Module):
    """The same kind of model with its layers as ``nn.LSTMCell`` stepped in a Python loop
    over time (EcoRNN's case; the GPU check's "LSTMCell loop"); ``model(tokens)`` as
    :class:`LSTMLanguageModel`."""

    def __init__(self, vocab: int, hidden: int, layers: int = 1,
                 embed: int | None = None) -> None:
        super().__init__()
        width = embed or hidden
        self.embed = nn.Embedding(vocab, width)
        self.cells = nn.ModuleList(nn.LSTMCell(width if i == 0 else hidden, hidden)
                                   for i in range(layers))
        self.head = nn.Linear(hidden, vocab)
        self.vocab, self.hidden = vocab, hidden

    def logits(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        batch, steps = x.shape[:2]
        for cell in self.cells:
            h = c = x.new_zeros(batch, self.hidden)
            outputs = []
            for t in range(steps):
                h, c = cell(x[:, t], (h, c))
                outputs.append(h)
            x = torch.stack(outputs, dim=1)
        return self.head(x)

    def forward(self, input_ids: torch.Tensor,
                labels: torch.Tensor | None = None) -> torch.Tensor:
        return _lm_loss(self.logits, input_ids, labels)


def _lm_loss(logits: Callable[[torch.Tensor], torch.Tensor], ids: torch.Tensor,
             labels: torch.Tensor | None) -> torch.Tensor:
    if labels is None:
        ids, labels = ids[:, :-1], ids[:, 1:]
    return nn.functional.cross_entropy(logits(ids).flatten(0, 1), labels.flatten())


def gpt2(layers: int, hidden: int, heads: int, vocab: int, positions: int,
         dropout: float = 0.1) -> nn.Module:
    """transformers' GPT2LMHeadModel from a config (random weights, no download), SDPA
    attention (transformers' default), ``dropout`` on residuals, embeddings and attention."""
    import transformers

    config = transformers.GPT2Config(
        n_layer=layers, n_embd=hidden, n_head=heads, n_positions=positions,
        vocab_size=vocab, bos_token_id=vocab - 1, eos_token_id=vocab - 1,
        resid_pdrop=dropout, embd_pdrop=dropout, attn_pdrop=dropout)
    return transformers.GPT2LMHeadModel(config)


def _lstm_inputs(model: nn.Module, batch: int, smoke: bool, device: torch.device) -> Any:
    return (torch.randint(0, model.vocab, (batch, 17 if smoke else 129), device=device),)


WORKLOADS: dict[str, Workload] = {w.name: w for w in [
    _lm("gpt2-small", "gpt2", 8, 1024, layers=12, hidden=768, heads=12, vocab=50257,
        positions=1024),
    _lm("gpt2-medium", "gpt2", 4, 1024, in_smoke=False, layers=24, hidden=1024, heads=16,
        vocab=50257, positions=1024),
    _lm("bert-base", "bert", 16, 512, layers=12, hidden=768, heads=12, vocab=30522,
        positions=512),
    _lm("bert-large", "bert", 8, 512, in_smoke=False, layers=24, hidden=1024, heads=16,
        vocab=30522, positions=512),
    _lm("llama-style", "llama", 4, 1024, layers=16, hidden=1024, heads=16, vocab=32000,
        positions=2048),
    Workload("resnet50", lambda smoke: ResNet((1, 1, 1, 1), 8, 10) if smoke else ResNet(),
             _resnet_inputs, 64, 2, lambda smoke: 1, "images",
             lambda model: list(model.blocks)),
    Workload("lstm-lm", lambda smoke: LSTMLanguageModel(*((50, 32, 2) if smoke else
                                                          (10000, 1024, 2))),
             _lstm_inputs, 32, 2, lambda smoke: 16 if smoke else 128, "tokens",
             lambda model: [model.lstm]),
]}


def get_workloads(names: list[str] | None, smoke: bool = False) -> list[Workload]:
    """The named workloads; when ``names`` is None, all (with ``smoke``, all whose tiny
    model is not another's: GPT-2 medium and BERT large shrink to GPT-2 small's and BERT
    base's). An unknown name raises."""
    if names is None:
        return [w for w in WORKLOADS.values() if w.in_smoke or not smoke]
    unknown = [n for n in names if n not in WORKLOADS]
    if unknown:
        raise ValueError(f"unknown workload(s) {unknown}; workloads: {sorted(WORKLOADS)}")
    return [WORKLOADS[n] for n in names]
