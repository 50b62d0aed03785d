"""How far ``memory_budget`` gets: bytes kept for backward, measured, as a fraction of plain
autograd's, on GPT-2 and BERT (transformers, 2 layers, 64 wide, dropout 0.1, training
mode) and a 3-block MLP (Linear-GELU-Linear-LayerNorm, batch 32).

    PYTHONPATH=. python benchmarks/budget_reach.py [--budgets 0.9 0.7 0.5 0.3] \
        [--models gpt2 bert mlp] [--tempo]

For each model and fraction ``f`` it compiles with ``memory_budget=f, strict=True``, runs
one forward under saved-tensor hooks (:func:`fxopt.analysis.measure_saved_bytes`;
parameters, buffers and inputs excluded) and prints the bytes kept against eager autograd's
(measured the same way), or the ``InfeasibleBudget`` message. It also checks that the loss
and every gradient equal eager's bitwise (dropout included: the same seed in both runs).
Measured bytes, not timings: the figures are the same on any CPU.
"""

from __future__ import annotations

import argparse

import torch
from torch import nn

import fxopt
from fxopt.analysis import measure_saved_bytes
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


def build(name: str, hidden: int = 64, seq: int = 32, batch: int = 4
          ) -> tuple[nn.Module, dict]:
    """The model (training mode) and its keyword inputs; transformers' at 2 layers."""
    import transformers

    torch.manual_seed(0)
    if name == "mlp":
        return MLP(hidden, 4 * hidden), {"x": torch.randn(8 * batch, hidden)}
    if name == "gpt2":
        config = transformers.GPT2Config(vocab_size=97, n_positions=2 * seq, n_embd=hidden,
                                         n_layer=2, n_head=2, bos_token_id=96, eos_token_id=96)
        model = transformers.GPT2LMHeadModel(config)
    else:
        config = transformers.BertConfig(vocab_size=97, hidden_size=hidden, num_hidden_layers=2,
                                         num_attention_heads=2, intermediate_size=4 * hidden,
                                         max_position_embeddings=2 * seq)
        model = transformers.BertForMaskedLM(config)
    model.config._attn_implementation = "eager"
    model.config.use_cache = False  # training; a cache would grow when a block recomputes
    ids = torch.randint(0, 97, (batch, seq), generator=torch.Generator().manual_seed(0))
    return model.train(), {"input_ids": ids, "labels": ids}


def loss_of(out) -> torch.Tensor:
    return out if isinstance(out, torch.Tensor) else out.loss


def step(model, kwargs, fn) -> tuple[torch.Tensor, list[torch.Tensor], int]:
    """Loss, gradients and saved bytes of one step of ``fn`` (seeded: same dropout masks)."""
    model.zero_grad(set_to_none=True)
    owned = [*model.parameters(), *model.buffers(), *kwargs.values()]
    holder = {}

    def forward():
        holder["loss"] = loss_of(fn(**kwargs))
    torch.manual_seed(1)
    saved = measure_saved_bytes(forward, exclude=owned)
    holder["loss"].backward()
    grads = [p.grad.clone() for p in model.parameters() if p.grad is not None]
    return holder["loss"].detach(), grads, saved.bytes


def _caused_by_infeasible(error: BaseException | None) -> bool:
    while error is not None:
        if isinstance(error, InfeasibleBudget) or "InfeasibleBudget" in str(error):
            return True
        error = error.__cause__
    return False


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budgets", type=float, nargs="+", default=[0.9, 0.7, 0.5, 0.3])
    parser.add_argument("--models", nargs="+", default=["gpt2", "bert", "mlp"])
    parser.add_argument("--tempo", action="store_true", help="tempo on as well")
    args = parser.parse_args()
    reference = "fxopt with tempo and no budget" if args.tempo else "eager"
    print(f"torch {torch.__version__}{', tempo on' if args.tempo else ''}; fraction = measured "
          f"saved bytes / eager's; grads = loss and every gradient bitwise equal to "
          f"{reference}'s")
    print(f"{'model':<6}{'budget':>7}{'kept':>8}{'floor':>8}  grads  note")
    for name in args.models:
        model, kwargs = build(name)
        eager_loss, eager_grads, plain = step(model, kwargs, model)
        if args.tempo:  # tempo changes the numerics: the reference is tempo without a budget
            torch._dynamo.reset()
            reference = torch.compile(model, backend=fxopt.backend(tempo=True))
            step(model, kwargs, reference)
            eager_loss, eager_grads, _ = step(model, kwargs, reference)
        for budget in args.budgets:
            torch._dynamo.reset()
            backend = fxopt.backend(memory_budget=budget, strict=True,
                                    **({"tempo": True} if args.tempo else {}))
            compiled = torch.compile(model, backend=backend)
            try:
                step(model, kwargs, compiled)  # compiles forward and backward
                loss, grads, saved = step(model, kwargs, compiled)
            except Exception as error:  # a report: anything not infeasible re-raises
                if not _caused_by_infeasible(error):
                    raise
                print(f"{name:<6}{budget:>7}{'-':>8}{'':>8}  -      InfeasibleBudget: "
                      f"{str(error).splitlines()[0][:90]}")
                continue
            same = bool(torch.equal(loss, eager_loss) and len(grads) == len(eager_grads)
                        and all(torch.equal(a, b) for a, b in zip(grads, eager_grads)))
            floors = [r.stats.get("floor_fraction") for g in backend.graphs
                      for r in g.pass_records("swap_recompute")]
            floor = max((f for f in floors if f is not None), default=None)
            floor_text = f"{floor:.3f}" if floor is not None else "-"
            print(f"{name:<6}{budget:>7}{saved / plain:>8.3f}{floor_text:>8}  "
                  f"{'equal' if same else 'DIFFER'}  plain {plain:,} B")


if __name__ == "__main__":
    main()
