"""Budgets under dynamic shapes: one graph for every sequence length, as users train.

A transformers Llama (2 layers x 128, vocabulary 32000, batch 4, fp32, its own loss),
compiled with ``dynamic=True`` at its first length and then run at longer ones (a
fine-tuning run with dynamic padding), measured with ``fxopt.profile_memory`` (one step's
peak above the resident parameters) and ``fxopt.analysis.measure_saved_bytes``:

1. at 128, 256 and 512 tokens, the model wrapped in ``fxopt.drop_logits`` (a step that
   reads only the loss: the returned logits would otherwise be most of the peak, bytes no
   plan can save), each configuration compiled afresh:
   - plain Inductor, and fxopt under a budget that keeps every activation (1 GiB: the
     fused loss alone);
   - a byte ``memory_budget`` (``--budget-mib``, 95 MiB: between fxopt's
     everything-kept and lowest peaks at 512 tokens), compiled at 128: the plan is made
     there, and made again at each longer call whose predicted peak passes the budget
     (fxopt/planner/size_watch.py, logged);
   - the same budget with the longest batch first: one plan, made at 512;
2. at 32, 64 and 128 tokens, logits returned: ``memory_budget=0.5``, the saved bytes at
   each length over eager's (a fraction is a share of each step's own);
3. compiles under Dynamo's automatic dynamic (no ``dynamic=``) over five lengths, with the
   fused loss on: plain Inductor compiles twice (static, then dynamic).

    PYTHONPATH=. python benchmarks/dynamic_shapes.py \
        [--out benchmarks/results/dynamic_shapes_cpu.md]
"""

from __future__ import annotations

import argparse
import logging
import warnings

import torch

import fxopt
from fxopt.analysis import measure_saved_bytes

MiB = 2**20
LENGTHS = (32, 64, 128)  # the fraction's
BUDGET_LENGTHS = (128, 256, 512)  # the byte budget's


def llama() -> torch.nn.Module:
    import transformers as tf

    torch.manual_seed(0)
    return tf.LlamaForCausalLM(tf.LlamaConfig(
        vocab_size=32000, hidden_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, intermediate_size=512, max_position_embeddings=512))


def _ids(tokens: int) -> torch.Tensor:
    return torch.randint(0, 32000, (4, tokens), generator=torch.Generator().manual_seed(tokens))


def peak_mib(model: torch.nn.Module, tokens: int) -> float:
    ids = _ids(tokens)
    return fxopt.profile_memory(model, {"input_ids": ids, "labels": ids}, steps=1,
                                loss_fn=lambda out: out.loss).peak_bytes / MiB


def peaks(model: torch.nn.Module, lengths: tuple[int, ...]
          ) -> tuple[dict[int, float], list[str], list[str]]:
    """Each length's peak, the fxopt warnings the steps raised and the graphs planned again
    at larger sizes (compiled afresh: Dynamo's cache would give a new model of the same class
    the last configuration's graph)."""
    fxopt._compat.dynamo_reset()
    replans, logger = _Replans(), logging.getLogger("fxopt.planner.size_watch")
    level = logger.level
    logger.addHandler(replans)
    logger.setLevel(logging.INFO)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            measured = {tokens: peak_mib(model, tokens) for tokens in lengths}
    finally:
        logger.removeHandler(replans)
        logger.setLevel(level)
    said = [str(w.message) for w in caught if str(w.message).startswith("fxopt")]
    return measured, said, replans.messages


class _Replans(logging.Handler):
    """SizeWatch's log lines: one per graph planned again at a larger call."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def saved_fraction(eager: torch.nn.Module, compiled: torch.nn.Module, model: torch.nn.Module,
                   tokens: int) -> float:
    ids = _ids(tokens)
    plain = measure_saved_bytes(lambda: eager(input_ids=ids, labels=ids).loss,
                                exclude=list(eager.parameters())).bytes
    kept = measure_saved_bytes(lambda: compiled(input_ids=ids, labels=ids).loss,
                               exclude=list(model.parameters())).bytes
    return kept / plain


def compiles(backend: object, lengths: tuple[int, ...]) -> int:
    """Frames Dynamo compiled over one training step at each length."""
    from torch._dynamo.utils import counters

    fxopt._compat.dynamo_reset()
    counters.clear()
    model = llama()
    compiled = torch.compile(model, backend=backend)
    for tokens in lengths:
        ids = _ids(tokens)
        compiled(input_ids=ids, labels=ids).loss.backward()
    return counters["stats"]["unique_graphs"]


def row(name: str, values: dict[int, float], lengths: tuple[int, ...], note: str = ""
        ) -> str:
    cells = " | ".join(f"{values[t]:.1f}" if t in values else "-" for t in lengths)
    return f"| {name} | {cells} | {note} |"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="also write the table here")
    parser.add_argument("--budget-mib", type=float, default=95.0,
                        help="the byte budget, in MiB")
    args = parser.parse_args()
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore", module="transformers")
    lines = [f"torch {torch.__version__}, one thread, peaks in MiB (fxopt.profile_memory)", "",
             "The model wrapped in fxopt.drop_logits:", "",
             "| configuration | 128 tokens | 256 | 512 | note |",
             "| --- | --- | --- | --- | --- |"]

    def dropping() -> torch.nn.Module:
        return fxopt.drop_logits(llama())

    plain, _, _ = peaks(torch.compile(dropping(), backend="inductor", dynamic=True),
                        BUDGET_LENGTHS)
    lines.append(row("plain Inductor, dynamic=True", plain, BUDGET_LENGTHS))
    kept_all, _, _ = peaks(torch.compile(dropping(), backend="fxopt",
                                         options={"memory_budget": "1GiB"}, dynamic=True),
                           BUDGET_LENGTHS)
    lines.append(row("fxopt memory_budget 1 GiB (the fused loss, every activation kept)",
                     kept_all, BUDGET_LENGTHS))
    budget = int(args.budget_mib * MiB)
    options = {"memory_budget": budget}
    first_short, said, replans = peaks(torch.compile(dropping(), backend="fxopt",
                                                     options=options, dynamic=True),
                                       BUDGET_LENGTHS)
    lines.append(row(f"fxopt memory_budget {args.budget_mib:g} MiB, compiled at 128",
                     first_short, BUDGET_LENGTHS,
                     f"{len(said)} warning(s), {len(replans)} re-plan(s)"))
    longest_first, said_longest, replans_longest = peaks(
        torch.compile(dropping(), backend="fxopt", options=options, dynamic=True),
        tuple(reversed(BUDGET_LENGTHS)))
    lines.append(row("the same, compiled at 512 (longest first)", longest_first,
                     BUDGET_LENGTHS,
                     f"{len(said_longest)} warning(s), {len(replans_longest)} re-plan(s)"))

    eager, model = llama(), llama()
    fxopt._compat.dynamo_reset()
    compiled = torch.compile(model, backend="fxopt", options={"memory_budget": 0.5},
                             dynamic=True)
    kept = {t: saved_fraction(eager, compiled, model, t) for t in LENGTHS}
    lines += ["", "| memory_budget=0.5, dynamic=True | 32 | 64 | 128 |",
              "| --- | --- | --- | --- |",
              "| saved bytes / eager's | " + " | ".join(f"{kept[t]:.3f}" for t in LENGTHS)
              + " |"]

    five = (32, 48, 17, 100, 64)
    lines += ["", f"Compiles over {len(five)} lengths {five}, automatic dynamic:", "",
              f"- plain Inductor: {compiles('inductor', five)}",
              f"- fxopt memory_budget=0.5: {compiles(fxopt.backend(memory_budget=0.5), five)}"]
    for title, messages, planned_again in (("compiled at 128", said, replans),
                                           ("compiled at 512", said_longest, replans_longest)):
        lines += ["", f"fxopt's warnings ({title}):", ""]
        lines += [f"> {message}" for message in messages] or ["none"]
        lines += ["", f"Graphs planned again at a larger call ({title}, logged):", ""]
        lines += [f"> {message}" for message in planned_again] or ["none"]
    text = "\n".join(lines)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write("# Budgets under dynamic shapes (CPU)\n\n`PYTHONPATH=. python benchmarks/"
                    "dynamic_shapes.py --out benchmarks/results/dynamic_shapes_cpu.md`\n\n"
                    + text + "\n")


if __name__ == "__main__":
    main()
