"""What tempo saves over fxopt without it, under bf16 autocast (issue 29, 2).

Models: transformers GPT-2 and BERT at the benchmark suite's CPU size
(``budget_reach.suite_size``: 4 layers, hidden 256, seq 128, batch 4; vocabulary 97),
training mode (dropout 0.1), forward and backward under ``torch.autocast("cpu",
bfloat16)``, attention SDPA (transformers' default) or eager (``--attention``). Per model:
eager's step, then fxopt with ``codegen`` (``--codegen``) without and with ``tempo=True``,
each compiled afresh, its second step measured. Bytes: what autograd keeps for backward
during the forward (saved-tensor hooks, :func:`fxopt.analysis.measure_saved_bytes`;
parameters, buffers and inputs excluded): exact on any CPU. Inductor draws eager's dropout
masks (``fallback_random``). Gradients: the largest over the parameters of
max|g - g_ref| / max|g_ref|, fxopt's against eager's and tempo's against fxopt's (same code
generator, same masks: tempo's own error; the documented bound is 2e-2,
tests/passes/tempo/test_tempo_autocast.py), over the gradients that are not zero in exact
arithmetic (``max_rel``). The loss
column: tempo's against fxopt's (GPT-2's hand-written tanh GELU becomes ``F.gelu``, rounded
once in bf16 instead of after each op). The sites column: what tempo rewrote and what it
left, with the reason.

Usage (each results file's header has its command):
    PYTHONPATH=. python benchmarks/tempo_autocast.py [--models gpt2 bert]
        [--codegen inductor|fx] [--attention sdpa|eager]
"""

from __future__ import annotations

import argparse
import shlex
import sys
from collections import Counter
from pathlib import Path

import torch

import fxopt

sys.path.insert(0, str(Path(__file__).parent))
from budget_reach import build, suite_size  # noqa: E402
from budget_reach import step as reach_step  # noqa: E402


def step(model, kwargs, fn):
    """Loss, gradients and saved bytes of one seeded step of ``fn`` under bf16 autocast."""
    return reach_step(model, kwargs, fn, autocast=torch.bfloat16)


def compiled_step(model, kwargs, options):
    torch._dynamo.reset()
    backend = fxopt.backend(**options)
    compiled = torch.compile(model, backend=backend)
    step(model, kwargs, compiled)
    return (*step(model, kwargs, compiled), backend)


def sites(backend) -> str:
    rewritten, skipped = Counter(), Counter()
    for record in (r for g in backend.graphs for r in g.passes if r.name == "tempo"):
        if record.verdicts is not None:
            rewritten.update(record.verdicts.counts())
            skipped.update(record.verdicts.reasons())
    parts = [f"{k} {v}" for k, v in sorted(rewritten.items())]
    parts += [f"left {v}: {k}" for k, v in sorted(skipped.items())]
    return "; ".join(parts)


def max_rel(got, want) -> float:
    """max over the parameters of max|g - g_ref| / max|g_ref|, leaving out gradients that
    are zero in exact arithmetic and so hold rounding noise alone (BERT's attention key
    bias: softmax is invariant to it; below 1e-4 of the largest gradient)."""
    scale = max(float(b.abs().max()) for b in want)
    return max(float((a - b).abs().max() / b.abs().max())
               for a, b in zip(got, want) if float(b.abs().max()) > 1e-4 * scale)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["gpt2", "bert"])
    parser.add_argument("--codegen", default="inductor", choices=["inductor", "fx"])
    parser.add_argument("--attention", default="sdpa", choices=["sdpa", "eager"])
    args = parser.parse_args(argv)
    torch._inductor.config.fallback_random = True
    print(f"# command: PYTHONPATH=. python benchmarks/tempo_autocast.py {shlex.join(sys.argv[1:])}")
    print(f"# torch {torch.__version__}, CPU, bf16 autocast, attention {args.attention}, "
          f"codegen={args.codegen}, suite size {suite_size('gpt2')}")
    print("| model | saved bytes, fxopt | with tempo | cut | grads, fxopt vs eager | "
          "grads, tempo vs fxopt | loss, tempo - fxopt | tempo's sites |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for name in args.models:
        model, kwargs = build(name, **suite_size(name))
        model.config._attn_implementation = args.attention
        loss, grads, _ = step(model, kwargs, model)
        options = {"codegen": args.codegen, "strict": True}
        plain_loss, plain_grads, plain, _ = compiled_step(model, kwargs, options)
        lean_loss, lean_grads, lean, backend = compiled_step(model, kwargs,
                                                             {**options, "tempo": True})
        print(f"| {name} | {plain} | {lean} | {1 - lean / plain:.1%} | "
              f"{max_rel(plain_grads, grads):.2e} | {max_rel(lean_grads, plain_grads):.2e} | "
              f"{float(lean_loss - plain_loss):.1e} | {sites(backend)} |", flush=True)


if __name__ == "__main__":
    main()
