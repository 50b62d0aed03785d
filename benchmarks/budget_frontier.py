"""Saved bytes against CPU step time: fxopt's ``memory_budget`` (its default code generator,
and fx or Inductor forced) against Inductor's ``activation_memory_budget`` at the same
fractions and per-block ``torch.utils.checkpoint``.

    PYTHONPATH=. python benchmarks/budget_frontier.py [--models gpt2 bert llama t5 resnet
        vit mlp lstm handlstm] [--budgets 0.7 0.5 0.3] [--rounds 7] [--layers 4]
        [--hidden 256] [--seq 128] [--batch 4] [--image 64]
        [--curves "fxopt default" "fxopt fx" "fxopt inductor" inductor checkpoint]
        [--tempo] [--fuse-rnn] [--png benchmarks/results/budget_frontier_cpu.png]

Each model is at the benchmark suite's CPU size (``budget_reach.suite_size``: GPT-2 and BERT
at 4 layers, hidden 256, seq 128, batch 4, and the sizes it names for the others);
``--layers``, ``--hidden``, ``--seq``, ``--batch`` and ``--image`` override it (a smoke
run: ``--layers 2 --hidden 32 --seq 16 --image 32 --rounds 1``). The PNG needs matplotlib
(``pip install -e ".[bench]"``); without it the script says so and writes the tables only.

Curves (``--curves`` picks some; eager is always run, as the reference): ``fxopt default``
(``codegen="auto"``, what a user gets: the code generator it chose is in the table's last
column), ``fxopt fx`` and ``fxopt inductor`` (``codegen`` forced), ``inductor`` (plain
``torch.compile`` with ``activation_memory_budget``), each without a budget and at every
fraction; ``checkpoint`` (``torch.utils.checkpoint``, non-reentrant, around each block
that :data:`CHECKPOINT_POINT` names) is one point. ``--tempo`` (``--fuse-rnn``) turns tempo
(fuse_rnn) on in every fxopt configuration (the peers stay as they are).

Per model (``budget_reach.build``: transformers' GPT-2, BERT, Llama, T5, ResNet and ViT,
dropout where the config has it, eager attention; the 3-block MLP; the ``nn.LSTM`` language
model and the hand-written LSTM; the loss is ``budget_reach.loss_of``'s; Dynamo traces
``nn.LSTM`` under ``allow_rnn``, as in budget_reach) every configuration is compiled and
warmed up, its bytes kept for backward measured once (saved-tensor hooks; parameters,
buffers and inputs excluded), then timed: one thread, ``--rounds`` rounds, each round one
step (forward and backward, no optimizer) of every configuration in turn (interleaved, the
order rotated by one each round), reporting the median and the spread (min-max), the
median's ratio to eager's, and the paired ratio: the median over rounds of the step's time
over eager's step in the same round, which cancels load that drifts between rounds (the
PNG plots it).
Prints a markdown table per model (pipe it to ``benchmarks/results/``).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

# Each Inductor configuration compiles afresh: a cached graph would ignore the budget.
os.environ.setdefault("TORCHINDUCTOR_FX_GRAPH_CACHE", "0")
os.environ.setdefault("TORCHINDUCTOR_AUTOGRAD_CACHE", "0")

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
from budget_reach import MODELS, HandLSTM, LSTMLanguageModel, build, loss_of, suite_size

import fxopt
from fxopt._compat import activation_memory_budget, dynamo_allow_rnn
from fxopt.analysis import measure_saved_bytes

CHECKPOINT_POINT = {
    "gpt2": "each transformer block (transformer.h)",
    "bert": "each encoder layer (bert.encoder.layer)",
    "llama": "each decoder layer (model.layers)",
    "t5": "each encoder and decoder block (encoder.block, decoder.block), through "
          "transformers' activation_checkpointing_enable: wrapped by hand, the recompute of "
          "a block saves fewer tensors than its forward (T5 marks a zero position bias as "
          "requiring grad only when its own checkpointing is on) and checkpoint raises",
    "resnet": "each residual block of every stage (resnet.encoder.stages[i].layers); "
              "BatchNorm's running statistics are updated again by the recompute",
    "vit": "each encoder layer (vit.encoder.layer)",
    "mlp": "each of the 3 blocks",
    "lstm": "the whole 2-layer nn.LSTM as one block: its layers are one aten op, so no "
            "finer point exists without rebuilding the model",
    "handlstm": "each time step (HandLSTM.cell): the model has no blocks, only its loop",
}


def _checkpoint_targets(model: nn.Module) -> list[tuple[object, str]]:
    """(owner, attribute) of every callable that per-block checkpoint wraps."""
    if isinstance(model, HandLSTM):
        return [(model, "cell")]
    if isinstance(model, LSTMLanguageModel):
        return [(model.lstm, "forward")]
    if hasattr(model, "blocks"):
        return [(block, "forward") for block in model.blocks]
    base = getattr(model, model.base_model_prefix, model)  # T5 has no base model attribute
    if hasattr(base, "h"):
        blocks = base.h
    elif hasattr(base, "layers"):
        blocks = base.layers
    elif hasattr(base.encoder, "stages"):
        blocks = [layer for stage in base.encoder.stages for layer in stage.layers]
    else:
        blocks = base.encoder.layer
    return [(block, "forward") for block in blocks]


def _checkpointed(model: nn.Module) -> nn.Module:
    from torch.utils.checkpoint import checkpoint

    if hasattr(model, "decoder"):  # T5: see CHECKPOINT_POINT
        model.activation_checkpointing_enable({"use_reentrant": False})
        return model
    for owner, attribute in _checkpoint_targets(model):
        call = getattr(owner, attribute)
        setattr(owner, attribute,
                lambda *a, _f=call, **k: checkpoint(_f, *a, use_reentrant=False, **k))
    return model


def _inductor(model: nn.Module) -> Callable:
    """Inductor through a backend object of its own: Dynamo would otherwise reuse another
    configuration's compiled graph (parameters are graph inputs, the backend is equal) and
    its activation_memory_budget with it."""
    compile_fx = torch._dynamo.lookup_backend("inductor")
    return torch.compile(model, backend=lambda gm, example_inputs: compile_fx(gm, example_inputs))


CURVES = ("fxopt default", "fxopt fx", "fxopt inductor", "inductor")  # a line each
CODEGEN = {"fxopt default": "auto", "fxopt fx": "fx", "fxopt inductor": "inductor"}


def configurations(budgets: list[float], curves: list[str], passes: dict[str, bool]
                   ) -> dict[str, tuple[Callable, Callable]]:
    """name -> (prepare(model) -> callable, context() around every call). ``passes``: the
    pass flags every fxopt configuration turns on. An fxopt configuration's callable has
    ``backend``: which code generator compiled its graphs."""
    null = contextlib.nullcontext

    def fxopt_compiled(codegen: str, **options) -> Callable:
        def prepare(model: nn.Module) -> Callable:
            backend = fxopt.backend(codegen=codegen, strict=True, **passes, **options)
            compiled = torch.compile(model, backend=backend)
            compiled.backend = backend
            return compiled
        return prepare

    configs = {"eager": (lambda m: m, null)}
    if "checkpoint" in curves:
        configs["checkpoint"] = (_checkpointed, null)
    for f in (None, *budgets):
        for curve in (c for c in CURVES if c in curves):
            name = curve if f is None else f"{curve} {f}"
            if curve == "inductor":
                configs[name] = (_inductor, null if f is None
                                 else lambda f=f: activation_memory_budget(f))
            else:
                budget = {} if f is None else {"memory_budget": f}
                configs[name] = (fxopt_compiled(CODEGEN[curve], **budget), null)
    return configs


def _passes(args: argparse.Namespace) -> dict[str, bool]:
    """The pass flags ``--tempo`` and ``--fuse-rnn`` turn on."""
    return {flag: True for flag in ("tempo", "fuse_rnn") if getattr(args, flag)}


def run_model(name: str, args: argparse.Namespace
              ) -> tuple[list[str], dict[str, tuple[float, float]]]:
    """The model's markdown table, and per configuration (saved bytes, step time) as
    fractions of eager's."""
    size = {**suite_size(name), **{key: value for key in ("layers", "hidden", "seq", "batch",
                                                           "image")
                                   if (value := getattr(args, key)) is not None}}
    with dynamo_allow_rnn():
        return _run_model(name, size, args)


def _run_model(name: str, size: dict, args: argparse.Namespace
               ) -> tuple[list[str], dict[str, tuple[float, float]]]:
    _, kwargs = build(name, **size)
    prepared = {}
    for config, (prepare, context) in configurations(args.budgets, args.curves,
                                                      _passes(args)).items():
        began = time.perf_counter()
        model, _ = build(name, **size)
        fn = prepare(model)
        owned = [*model.parameters(), *model.buffers(), *kwargs.values()]

        def step(fn=fn, context=context):
            with context():
                loss_of(fn(**kwargs)).backward()
        for _ in range(2):
            step()
        with context():
            saved = measure_saved_bytes(lambda fn=fn: loss_of(fn(**kwargs)), exclude=owned)
        backend = getattr(fn, "backend", None)
        codegen = ("/".join(sorted({g.codegen.name for g in backend.graphs}))
                   if backend is not None else "")
        prepared[config] = (step, saved.bytes, [], codegen)
        print(f"# {name} {config}: ready in {time.perf_counter() - began:.0f} s",
              file=sys.stderr, flush=True)
    order = list(prepared.values())
    for round_ in range(args.rounds):
        for step, _, times, _ in order[round_ % len(order):] + order[:round_ % len(order)]:
            start = time.perf_counter()
            step()
            times.append(time.perf_counter() - start)
    eager_bytes, eager_times = prepared["eager"][1], prepared["eager"][2]
    eager_time = statistics.median(eager_times)
    shape = ", ".join(f"{key} {value}" for key, value in size.items())
    lines = [f"\n### {name} ({shape})\n",
             *([f"checkpoint: {CHECKPOINT_POINT[name]}\n"] if "checkpoint" in args.curves
               else []),
             ("| configuration | saved bytes | x eager | step ms (median) | spread ms | "
              "x eager time | x eager time, paired | fxopt codegen |"),
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    points = {}
    for config, (_, nbytes, times, codegen) in prepared.items():
        median = statistics.median(times)
        paired = statistics.median(t / e for t, e in zip(times, eager_times, strict=True))
        points[config] = (nbytes / eager_bytes, paired)
        lines.append(f"| {config} | {nbytes:,} | {nbytes / eager_bytes:.3f} | "
                     f"{1e3 * median:.2f} | {1e3 * min(times):.2f}-{1e3 * max(times):.2f} | "
                     f"{median / eager_time:.2f} | {paired:.2f} | {codegen} |")
    return lines, points


def plot(results: dict[str, dict[str, tuple[float, float]]], budgets: list[float],
         curves: list[str], path: str) -> None:
    """One panel per model: saved bytes (x eager) against step time (x eager), a line per
    curve (no budget, then each fraction), checkpoint and eager as points."""
    try:
        import matplotlib
    except ImportError:
        print(f"# no PNG written to {path}: matplotlib is missing; install it with "
              '`pip install -e ".[bench]"` (or `pip install matplotlib`)', file=sys.stderr)
        return
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(1, len(results), figsize=(5.5 * len(results), 4.5),
                                squeeze=False)
    for axis, (name, points) in zip(axes[0], results.items()):
        for curve, marker in zip((c for c in CURVES if c in curves), "osv^"):
            configs = [curve, *(f"{curve} {f}" for f in budgets)]
            xs, ys = zip(*(points[c] for c in configs))
            axis.plot(xs, ys, marker=marker, label=curve)
            for label, x, y in zip(["none", *map(str, budgets)], xs, ys):
                axis.annotate(label, (x, y), fontsize=7, textcoords="offset points",
                              xytext=(3, 3))
        for config, marker in (("checkpoint", "x"), ("eager", "*")):
            if config not in points:
                continue
            axis.plot(*points[config], marker=marker, linestyle="", markersize=9, label=config)
        axis.set(title=name, xlabel="saved bytes (x eager)",
                 ylabel="step time (x eager, paired by round)")
        axis.grid(alpha=0.3)
        axis.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    print(f"# PNG written to {path}", file=sys.stderr)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", choices=MODELS, default=["gpt2", "bert"])
    parser.add_argument("--budgets", type=float, nargs="+", default=[0.7, 0.5, 0.3])
    parser.add_argument("--rounds", type=int, default=7)
    for key in ("layers", "hidden", "seq", "batch", "image"):
        parser.add_argument(f"--{key}", type=int,
                            help="overrides the suite size (budget_reach.suite_size)")
    parser.add_argument("--curves", nargs="+", default=[*CURVES, "checkpoint"],
                        choices=[*CURVES, "checkpoint"])
    parser.add_argument("--tempo", action="store_true",
                        help="tempo=True in every fxopt configuration")
    parser.add_argument("--fuse-rnn", action="store_true",
                        help="fuse_rnn=True in every fxopt configuration")
    parser.add_argument("--png", help="also draw the curves to this PNG (needs matplotlib)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    # every configuration compiles the same forward code for its own model: let Dynamo
    # keep them all (a reset would drop the earlier ones, which would then recompile
    # inside the timed rounds)
    torch._dynamo.config.recompile_limit = 64
    print(f"# budget_frontier: torch {torch.__version__}, CPU, 1 thread, {args.rounds} "
          "interleaved rounds; saved bytes measured with saved-tensor hooks; fxopt strict"
          + "".join(f"; {flag}=True in every fxopt configuration" for flag in _passes(args)))
    results = {}
    for name in args.models:
        lines, results[name] = run_model(name, args)
        print("\n".join(lines), flush=True)
    if args.png:
        plot(results, args.budgets, args.curves, args.png)


if __name__ == "__main__":
    main()
