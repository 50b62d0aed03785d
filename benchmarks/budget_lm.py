"""``memory_budget`` on causal LMs as users run them: transformers GPT-2 and Llama with their
real vocabularies, SDPA attention, their own loss (``labels=input_ids``), transformers'
logging graph breaks left in (GPT-2's ``loss_function`` logs once, so its loss compiles
into a second graph whose input is the logits), fp32 and CPU bf16 autocast.

    PYTHONPATH=. python benchmarks/budget_lm.py [--models gpt2 llama] [--budgets 0.5 0.3] \
        [--dtypes fp32 bf16] [--codegen fx auto] [--layers 2 --hidden 128 --seq 128 --batch 4] \
        [--no-logging-breaks]

``--no-logging-breaks``: Dynamo traces through transformers' logger wrappers
(``torch._dynamo.config.ignore_logging_functions``, what ``fxopt.ignore_transformers_logging``
sets), so GPT-2 compiles into one graph and its logits can be recomputed from the LM head's
input instead of crossing a graph break.

For each row it compiles with ``memory_budget=f, strict=True``, runs two steps (the first
compiles, and a graph given a smaller share by a later one is planned again at its next
call: :mod:`fxopt.planner.ledger`) and measures the second step's bytes kept for backward
with saved-tensor hooks (:func:`fxopt.analysis.measure_saved_bytes`; parameters and the
model's inputs excluded, a graph's input that another graph made counted), against eager's
measured the same way. ``kept`` must be <= f x 1.05. Where ``strict`` raises
``InfeasibleBudget`` the row says so, with the floor it names, and gives the run without
``strict`` (the floors' plans). ``loss rel`` / ``grad rel``: the largest relative
difference of the loss and of the gradients from eager's (Inductor and bf16 round
differently; fx code generation in fp32 is exact to fp32 rounding).
Measured bytes, not timings: the figures are the same on any CPU.
"""

from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path

import torch

import fxopt

sys.path.insert(0, str(Path(__file__).parent))
from budget_reach import step as reach_step  # noqa: E402


def build(name: str, layers: int, hidden: int, seq: int, batch: int):
    """A randomly initialised model (training mode, SDPA, no cache) and its input ids."""
    import transformers as tf

    torch.manual_seed(0)
    if name == "gpt2":
        model = tf.GPT2LMHeadModel(tf.GPT2Config(n_embd=hidden, n_layer=layers, n_head=2,
                                                 n_positions=2 * seq))  # vocab 50257
    else:
        model = tf.LlamaForCausalLM(tf.LlamaConfig(
            vocab_size=32000, hidden_size=hidden, intermediate_size=2 * hidden,
            num_hidden_layers=layers, num_attention_heads=2, num_key_value_heads=2,
            max_position_embeddings=2 * seq))
    model.config._attn_implementation = "sdpa"
    model.config.use_cache = False
    ids = torch.randint(0, model.config.vocab_size, (batch, seq),
                        generator=torch.Generator().manual_seed(0))
    return model.train(), ids


def step(model, fn, ids, bf16: bool):
    """(loss, gradients, saved bytes) of one step of ``fn`` on the model's own loss (seeded:
    the same dropout)."""
    return reach_step(model, {"input_ids": ids, "labels": ids}, fn,
                      autocast=torch.bfloat16 if bf16 else None)


def _rel(got, want) -> float:
    return max(float((a.float() - b.float()).abs().max() / b.float().abs().max().clamp_min(1e-30))
               for a, b in zip(got, want, strict=True))


def _infeasible(error: BaseException) -> str | None:
    text = str(error)
    if "InfeasibleBudget" not in text:
        return None
    line = next((x for x in text.splitlines() if "the floor" in x or "cannot keep" in x), text)
    return line[line.index("the floor"):].rstrip(")") if "the floor" in line else line


def run(model, ids, budget: float, codegen: str, bf16: bool, strict: bool):
    torch._dynamo.reset()
    backend = fxopt.backend(memory_budget=budget, strict=strict,
                            **({} if codegen == "auto" else {"codegen": codegen}))
    compiled = torch.compile(model, backend=backend)
    step(model, compiled, ids, bf16)
    return backend, step(model, compiled, ids, bf16)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["gpt2", "llama"])
    parser.add_argument("--budgets", type=float, nargs="+", default=[0.5, 0.3])
    parser.add_argument("--dtypes", nargs="+", default=["fp32", "bf16"])
    parser.add_argument("--codegen", nargs="+", default=["fx", "auto"])
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--no-logging-breaks", action="store_true")
    parser.add_argument("--no-rerun", action="store_true",
                        help="where strict raises, report it without the run without strict")
    args = parser.parse_args()
    if args.no_logging_breaks:
        import logging

        import transformers  # noqa: F401  (patches its wrappers onto logging.Logger)
        torch._dynamo.config.ignore_logging_functions |= {
            getattr(logging.Logger, name) for name in ("warning_once", "warning_advice",
                                                       "info_once")
            if hasattr(logging.Logger, name)}
    torch._inductor.config.fallback_random = True  # eager's dropout masks: grads compare
    print(f"torch {torch.__version__}; {args.layers} layers x {args.hidden}, seq {args.seq}, "
          f"batch {args.batch}; kept = measured saved bytes / eager's (second step); "
          f"logging graph breaks {'removed' if args.no_logging_breaks else 'left in'}")
    print(f"{'model':<7}{'dtype':<6}{'codegen':<15}{'f':>5}{'graphs':>7}{'kept':>8}  "
          f"{'loss rel':>9}{'grad rel':>9}  note")
    for name in args.models:
        model, ids = build(name, args.layers, args.hidden, args.seq, args.batch)
        for dtype in args.dtypes:
            bf16 = dtype == "bf16"
            eager_loss, eager_grads, eager = step(model, model, ids, bf16)
            for codegen in args.codegen:
                for budget in args.budgets:
                    note = ""
                    try:
                        backend, (loss, grads, saved) = run(model, ids, budget, codegen,
                                                            bf16, strict=True)
                    except Exception as error:  # a report: anything not infeasible re-raises
                        said = _infeasible(error)
                        if said is None:
                            raise
                        if args.no_rerun:
                            print(f"{name:<7}{dtype:<6}{codegen:<15}{budget:>5}{'':>7}{'-':>8}"
                                  f"  {'':>9}{'':>9}  eager {eager:,} B strict raised "
                                  f"InfeasibleBudget ({said})", flush=True)
                            continue
                        with warnings.catch_warnings():
                            warnings.simplefilter("ignore")
                            backend, (loss, grads, saved) = run(model, ids, budget, codegen,
                                                                bf16, strict=False)
                        note = f"strict raised InfeasibleBudget ({said}); without strict:"
                    kept = saved / eager
                    if kept > budget * 1.05:
                        note += " OVER f x 1.05"
                    used = sorted({str(g.codegen) for g in backend.graphs})  # resolved
                    print(f"{name:<7}{dtype:<6}{codegen + ':' + '+'.join(used):<15}"
                          f"{budget:>5}{len(backend.graphs):>7}{kept:>8.3f}  "
                          f"{_rel([loss], [eager_loss]):>9.1e}{_rel(grads, eager_grads):>9.1e}"
                          f"  eager {eager:,} B {note}", flush=True)


if __name__ == "__main__":
    main()
