"""How far ``memory_budget`` gets: bytes kept for backward, measured, as a fraction of plain
autograd's, on transformers' GPT-2, BERT, Llama, T5, ResNet and ViT (2 layers or stages,
64 wide, random weights, dropout where the config has it, training mode), a 3-block MLP
(Linear-GELU-Linear-LayerNorm, batch 32), an ``nn.LSTM`` language model and a hand-written
LSTM (a Python loop over an LSTM cell).

    PYTHONPATH=. python benchmarks/budget_reach.py [--budgets 0.9 0.7 0.5 0.3] \
        [--models gpt2 bert llama t5 resnet vit mlp lstm handlstm] [--tempo] [--fuse-rnn] \
        [--codegen fx] [--suite-size]

``--suite-size``: the benchmark suite's CPU size (4 layers, hidden 256, seq 128, batch 4;
the image and LSTM models at the sizes :func:`suite_size` names) instead of the tiny one.
``--codegen`` is always passed to the backend (default ``"fx"``: fxopt's own plan), never
left to ``"auto"``. ``--codegen inductor``: Inductor code generation; the reference is then
fxopt with Inductor and no budget (Inductor's fused kernels round differently from eager's ops), and
Inductor calls eager's random ops (``fallback_random``), so the masks are eager's.

For each model and fraction ``f`` it compiles with ``memory_budget=f, strict=True``, runs
one forward under saved-tensor hooks (:func:`fxopt.analysis.measure_saved_bytes`;
parameters, buffers and inputs excluded) and prints the bytes kept against eager autograd's
(measured the same way). A row says ``OVER f x 1.05`` where the bytes kept exceed that,
and ``RISES as f falls`` where they exceed the next larger budget's. Where ``strict``
raises ``InfeasibleBudget`` (f below the floor) the row is the run without ``strict``:
the floor's plan, the warning's floor quoted, and kept checked against the floor x 1.05.
It also checks that the loss and every gradient equal eager's bitwise (dropout included:
the same seed in both runs).
Measured bytes, not timings: the figures are the same on any CPU.
"""

from __future__ import annotations

import argparse
import contextlib
import warnings
from dataclasses import dataclass

import torch
from torch import nn

import fxopt
from fxopt import _compat
from fxopt.analysis import measure_saved_bytes
from fxopt.bench.workloads import LSTMLanguageModel
from fxopt.passes.swap_recompute import InfeasibleBudget


class MLP(nn.Module):
    def __init__(self, dim: int = 64, hidden: int = 256, blocks: int = 3) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(
            nn.Sequential(nn.Linear(dim, hidden), nn.GELU(), nn.Linear(hidden, dim),
                          nn.LayerNorm(dim)) for _ in range(blocks))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return x.square().mean()


class HandLSTM(nn.Module):
    """An LSTM cell as research code writes it (gate order i, f, o, g), stepped in a loop."""

    def __init__(self, features: int = 32, hidden: int = 64) -> None:
        super().__init__()
        self.hidden = hidden
        self.wi, self.wh = nn.Linear(features, 4 * hidden), nn.Linear(hidden, 4 * hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = c = x.new_zeros(x.shape[1], self.hidden)
        for t in range(x.shape[0]):
            h, c = self.cell(x[t], h, c)
        return h.square().mean()

    def cell(self, x: torch.Tensor, h: torch.Tensor, c: torch.Tensor
             ) -> tuple[torch.Tensor, torch.Tensor]:
        """One step: the next (h, c)."""
        i, f, o, g = (self.wi(x) + self.wh(h)).chunk(4, dim=-1)
        c = f.sigmoid() * c + i.sigmoid() * g.tanh()
        return o.sigmoid() * c.tanh(), c


MODELS = ("gpt2", "bert", "llama", "t5", "resnet", "vit", "mlp", "lstm", "handlstm")
RNN_MODELS = ("lstm", "handlstm")  # the models fuse_rnn applies to


def _transformers_model(name: str, hidden: int, seq: int, layers: int = 2,
                        image: int = 32) -> nn.Module:
    """A randomly initialised transformers model at ``layers`` layers, no download. ResNet:
    2 bottleneck stages of 16 and 32 channels at the tiny size (``layers`` 2), ResNet-18's
    layout (basic blocks, 64-512 channels, 2 blocks a stage) otherwise."""
    import transformers as tf

    small = {"vocab_size": 97, "num_hidden_layers": layers, "num_attention_heads": 2,
             "intermediate_size": 2 * hidden, "hidden_size": hidden}
    if name == "gpt2":
        return tf.GPT2LMHeadModel(tf.GPT2Config(
            vocab_size=97, n_positions=2 * seq, n_embd=hidden, n_layer=layers, n_head=2,
            bos_token_id=96, eos_token_id=96))
    if name == "bert":
        return tf.BertForMaskedLM(tf.BertConfig(**{**small, "intermediate_size": 4 * hidden},
                                                max_position_embeddings=2 * seq))
    if name == "llama":
        return tf.LlamaForCausalLM(tf.LlamaConfig(**small, num_key_value_heads=2,
                                                  max_position_embeddings=2 * seq))
    if name in ("gemma", "olmo2"):  # RMSNorms ending in a no-op cast (tempo's aliases)
        config = (tf.GemmaConfig if name == "gemma" else tf.Olmo2Config)(
            **small, num_key_value_heads=2, head_dim=hidden // 2,
            max_position_embeddings=2 * seq)
        return (tf.GemmaForCausalLM if name == "gemma" else tf.Olmo2ForCausalLM)(config)
    if name == "cohere":  # a hand-written LayerNorm (tempo's match_layer_norm_formula)
        return tf.CohereForCausalLM(tf.CohereConfig(**small, num_key_value_heads=2,
                                                    max_position_embeddings=2 * seq,
                                                    eos_token_id=96))
    if name == "t5":
        return tf.T5ForConditionalGeneration(tf.T5Config(
            vocab_size=97, d_model=hidden, d_kv=hidden // 2, d_ff=2 * hidden, num_layers=layers,
            num_heads=2, decoder_start_token_id=0, pad_token_id=0))
    if name == "resnet" and layers <= 2:
        return tf.ResNetForImageClassification(tf.ResNetConfig(
            embedding_size=16, hidden_sizes=[16, 32], depths=[1, 1], num_labels=10))
    if name == "resnet":
        return tf.ResNetForImageClassification(tf.ResNetConfig(
            embedding_size=64, hidden_sizes=[64, 128, 256, 512], depths=[2, 2, 2, 2],
            layer_type="basic", num_labels=10))
    return tf.ViTForImageClassification(tf.ViTConfig(
        **{k: v for k, v in small.items() if k != "vocab_size"}, image_size=image,
        patch_size=8, num_labels=10))


SUITE_SIZE = {"layers": 4, "hidden": 256, "seq": 128, "batch": 4}


def suite_size(name: str) -> dict:
    """``build``'s keywords at the benchmark suite's CPU size: transformers text models at 4
    layers, hidden 256, seq 128, batch 4; ViT the same with 96x96 images in 8x8 patches (145
    tokens); ResNet-18's layout at 64x64 images, batch 4; the LSTM LM hidden 256, seq 64,
    batch 8; the hand-written LSTM hidden 256 (features 128), 32 steps, batch 4."""
    if name in ("vit", "resnet"):
        return {**SUITE_SIZE, "image": 96 if name == "vit" else 64}
    if name == "lstm":
        return {**SUITE_SIZE, "seq": 64, "batch": 8}
    return SUITE_SIZE


def build(name: str, hidden: int = 64, seq: int = 32, batch: int = 4, layers: int = 2,
          image: int = 32) -> tuple[nn.Module, dict]:
    """The model (training mode) and its keyword inputs, at a tiny size by default."""
    torch.manual_seed(0)
    data = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 97, (batch, seq), generator=data)
    if name == "mlp":
        return MLP(hidden, 4 * hidden), {"x": torch.randn(8 * batch, hidden, generator=data)}
    if name == "lstm":
        return LSTMLanguageModel(97, hidden, 2).train(), {"input_ids": ids, "labels": ids}
    if name == "handlstm":
        return HandLSTM(hidden // 2, hidden).train(), {
            "x": torch.randn(seq // 4, batch, hidden // 2, generator=data)}
    model = _transformers_model(name, hidden, seq, layers, image)
    model.config._attn_implementation = "eager"
    model.config.use_cache = False  # training; a cache would grow when a block recomputes
    if name in ("resnet", "vit"):
        pixels = torch.randn(batch, 3, image, image, generator=data)
        return model.train(), {"pixel_values": pixels,
                               "labels": torch.randint(0, 10, (batch,), generator=data)}
    return model.train(), {"input_ids": ids, "labels": ids}


def loss_of(out) -> torch.Tensor:
    return out if isinstance(out, torch.Tensor) else out.loss


def step(model, kwargs, fn, autocast: torch.dtype | None = None
         ) -> tuple[torch.Tensor, list[torch.Tensor], int]:
    """Loss, gradients and saved bytes of one step of ``fn`` (seeded: same dropout masks),
    its forward under CPU autocast to ``autocast`` where given."""
    model.zero_grad(set_to_none=True)
    owned = [*model.parameters(), *model.buffers(), *kwargs.values()]
    holder = {}

    def forward():
        with (torch.autocast("cpu", dtype=autocast) if autocast is not None
              else contextlib.nullcontext()):
            holder["loss"] = loss_of(fn(**kwargs))
    torch.manual_seed(1)
    saved = measure_saved_bytes(forward, exclude=owned)
    holder["loss"].backward()
    grads = [p.grad.clone() for p in model.parameters() if p.grad is not None]
    return holder["loss"].detach(), grads, saved.bytes


def _infeasible_message(error: BaseException | None) -> str | None:
    """The ``InfeasibleBudget`` message ``error`` carries (Dynamo wraps it), or None."""
    while error is not None:
        if isinstance(error, InfeasibleBudget):
            return str(error).splitlines()[0]
        text = str(error)
        if "InfeasibleBudget" in text:
            lines = [line for line in text.splitlines() if "swap_recompute cannot" in line]
            return (lines or text.splitlines())[0]
        error = error.__cause__
    return None


@dataclass
class Row:
    """One model at one budget: measured fraction kept, the reported floor (largest over the
    model's graphs), whether loss and gradients equal the reference's bitwise and the
    largest relative difference. Below the floor, ``strict`` raised: ``infeasible`` is
    ``InfeasibleBudget``'s message and the figures are the run without ``strict``, which
    applies the floor's plan with the ``warnings`` it gave."""

    kept: float
    floor: float | None
    bitwise: bool
    max_rel_diff: float
    infeasible: str | None = None
    warnings: tuple[str, ...] = ()


def options_for(name: str, tempo: bool = False, fuse_rnn: bool = False) -> dict:
    """The passes besides the budget: tempo anywhere, fuse_rnn on the LSTM models."""
    return {**({"tempo": True} if tempo else {}),
            **({"fuse_rnn": True} if fuse_rnn and name in RNN_MODELS else {})}


def reference_step(model, kwargs, options: dict):
    """Loss, gradients and saved bytes of eager (plain autograd) and of the reference the
    budgeted runs must equal: eager, or fxopt with the same passes and ``memory_budget=1.0``
    where a pass (tempo, fuse_rnn) or Inductor's code changes the numerics (any option
    but ``codegen="fx"``): a budget that keeps everything, so that the budget's own rewrite
    before autograd (noop_dropout, which decides whether tempo sees an attention dropout) is
    the same as in the budgeted runs."""
    eager_loss, eager_grads, plain = step(model, kwargs, model)
    if all((key, value) == ("codegen", "fx") for key, value in options.items()):
        return eager_loss, eager_grads, plain
    torch._dynamo.reset()
    compiled = torch.compile(model, backend=fxopt.backend(**options, memory_budget=1.0))
    step(model, kwargs, compiled)
    loss, grads, _ = step(model, kwargs, compiled)
    return loss, grads, plain


def _max_rel_diff(got: list[torch.Tensor], want: list[torch.Tensor]) -> float:
    return max(float((a - b).abs().max() / b.abs().max().clamp_min(1e-30))
               for a, b in zip(got, want))


def _run(model, kwargs, backend, reference) -> Row:
    """Two steps under ``backend`` (the first compiles); the second against ``reference``
    = (loss, grads, plain)."""
    ref_loss, ref_grads, plain = reference
    torch._dynamo.reset()
    compiled = torch.compile(model, backend=backend)
    step(model, kwargs, compiled)
    loss, grads, saved = step(model, kwargs, compiled)
    if len(grads) != len(ref_grads):
        raise AssertionError(f"{len(grads)} gradients, the reference has {len(ref_grads)}")
    bitwise = bool(torch.equal(loss, ref_loss)
                   and all(torch.equal(a, b) for a, b in zip(grads, ref_grads)))
    floors = [r.stats.get("floor_fraction") for g in backend.graphs
              for r in g.pass_records("swap_recompute")]
    floor = max((f for f in floors if f is not None), default=None)
    return Row(saved / plain, floor, bitwise, _max_rel_diff([loss, *grads], [ref_loss, *ref_grads]))


def measure(model, kwargs, budget: float, options: dict, reference) -> Row:
    """Compile with ``memory_budget=budget, strict=True`` (and ``options``) and measure; where
    that raises ``InfeasibleBudget`` (below the floor), measure again without ``strict``,
    recording the warnings: the floor's plan, warned once."""
    try:
        return _run(model, kwargs, fxopt.backend(memory_budget=budget, strict=True, **options),
                    reference)
    except Exception as error:  # a report: anything not infeasible re-raises
        message = _infeasible_message(error)
        if message is None:
            raise
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        row = _run(model, kwargs, fxopt.backend(memory_budget=budget, **options), reference)
    row.infeasible = message
    row.warnings = tuple(str(w.message) for w in caught
                         if "swap_recompute cannot" in str(w.message))
    return row


def _notes(row: Row, budget: float, kept_before: float | None) -> str:
    """What a row breaks: kept above f x 1.05 (above the floor's x 1.05 where f is below
    it), kept rising as f falls; below the floor what strict and the warning said."""
    limit = max(budget, row.floor or 0.0) if row.infeasible is not None else budget
    notes = "" if row.kept <= limit * 1.05 else "  OVER f x 1.05"
    if kept_before is not None and row.kept > kept_before:
        notes += "  RISES as f falls"
    if row.infeasible is not None:
        floor_said = [w[w.index("the floor"):] for w in row.warnings if "the floor" in w]
        notes += (f"  below the floor: strict raised InfeasibleBudget; without strict "
                  f"{len(row.warnings)} warning ({'; '.join(floor_said) or '-'})")
    return notes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budgets", type=float, nargs="+", default=[0.9, 0.7, 0.5, 0.3])
    parser.add_argument("--models", nargs="+", choices=MODELS, default=list(MODELS))
    parser.add_argument("--tempo", action="store_true", help="tempo on as well")
    parser.add_argument("--fuse-rnn", action="store_true",
                        help="fuse_rnn on as well (on the LSTM models)")
    parser.add_argument("--codegen", choices=("fx", "inductor"), default="fx")
    parser.add_argument("--suite-size", action="store_true",
                        help="the benchmark suite's CPU size (see suite_size)")
    args = parser.parse_args()
    if args.codegen == "inductor":
        torch._inductor.config.fallback_random = True  # eager's masks, so grads compare
    print(f"torch {torch.__version__}; codegen={args.codegen!r} (pinned); kept = measured "
          f"saved bytes / eager's; grads = loss and every gradient vs eager's, or vs fxopt "
          f"with the same passes and no budget where tempo, fuse_rnn or Inductor is on (they "
          f"change the numerics); rel = largest relative difference")
    print(f"{'model':<9}{'passes':<16}{'budget':>7}{'kept':>8}{'floor':>8}  grads   "
          f"{'rel':>8}  note")
    for name in args.models:
        model, kwargs = build(name, **(suite_size(name) if args.suite_size else {}))
        options = options_for(name, args.tempo, args.fuse_rnn)
        passes = "+".join(options) or "-"
        options["codegen"] = args.codegen  # pinned: "auto" may pick either under a budget
        with _compat.dynamo_allow_rnn():
            reference = reference_step(model, kwargs, options)
            kept_before = None  # the row of the next larger budget
            for budget in sorted(args.budgets, reverse=True):
                row = measure(model, kwargs, budget, options, reference)
                floor = f"{row.floor:.3f}" if row.floor is not None else "-"
                print(f"{name:<9}{passes:<16}{budget:>7}{row.kept:>8.3f}{floor:>8}  "
                      f"{'equal ' if row.bitwise else 'differ'}  {row.max_rel_diff:>8.1e}  "
                      f"plain {reference[2]:,} B{_notes(row, budget, kept_before)}")
                kept_before = row.kept


if __name__ == "__main__":
    main()
