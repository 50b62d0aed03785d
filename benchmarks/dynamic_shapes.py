"""Budgets under dynamic shapes: one graph for every sequence length, as users train.

A transformers Llama (2 layers x 128, vocabulary 32000, batch 4, fp32, its own loss),
compiled with ``dynamic=True`` at 32 tokens and then run at 64 and 128 (a fine-tuning run
with dynamic padding), measured with ``fxopt.profile_memory`` (one step's peak above the
resident parameters) and ``fxopt.analysis.measure_saved_bytes``:

1. plain Inductor: the step's peak at each length;
2. a byte ``memory_budget`` of 0.45 x plain Inductor's peak at 128 tokens, compiled at 32:
   the plan is made at 32 and runs at every length; fxopt's warning at the first larger
   call whose predicted peak passes the budget (fxopt/planner/size_watch.py);
3. the same budget with the longest batch first (the fix the warning names);
4. ``memory_budget=0.5``: the saved bytes at each length over eager's (a fraction is a
   share of each step's own);
5. compiles under Dynamo's automatic dynamic (no ``dynamic=``) over five lengths, with the
   fused loss on: plain Inductor compiles twice (static, then dynamic).

    PYTHONPATH=. python benchmarks/dynamic_shapes.py \
        [--out benchmarks/results/dynamic_shapes_cpu.md]
"""

from __future__ import annotations

import argparse
import warnings

import torch

import fxopt
from fxopt.analysis import measure_saved_bytes

MiB = 2**20
LENGTHS = (32, 64, 128)


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
          ) -> tuple[dict[int, float], list[str]]:
    """Each length's peak, and the fxopt warnings the steps raised (compiled afresh:
    Dynamo's cache would give a new model of the same class the last configuration's
    graph)."""
    fxopt._compat.dynamo_reset()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        measured = {tokens: peak_mib(model, tokens) for tokens in lengths}
    return measured, [str(w.message) for w in caught if str(w.message).startswith("fxopt")]


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


def row(name: str, values: dict[int, float], note: str = "") -> str:
    cells = " | ".join(f"{values[t]:.1f}" if t in values else "-" for t in LENGTHS)
    return f"| {name} | {cells} | {note} |"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="also write the table here")
    args = parser.parse_args()
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore", module="transformers")
    lines = [f"torch {torch.__version__}, one thread, peaks in MiB (fxopt.profile_memory)", "",
             "| configuration | 32 tokens | 64 | 128 | note |", "| --- | --- | --- | --- | --- |"]

    plain, _ = peaks(torch.compile(llama(), backend="inductor", dynamic=True), LENGTHS)
    lines.append(row("plain Inductor, dynamic=True", plain))
    budget = int(plain[128] * 0.45 * MiB)
    options = {"memory_budget": budget}
    first_short, said = peaks(torch.compile(llama(), backend="fxopt", options=options,
                                            dynamic=True), LENGTHS)
    lines.append(row(f"fxopt memory_budget {budget / MiB:.1f} MiB, compiled at 32",
                     first_short, f"{len(said)} warning(s)"))
    longest_first, said_longest = peaks(torch.compile(llama(), backend="fxopt",
                                                      options=options, dynamic=True),
                                        tuple(reversed(LENGTHS)))
    lines.append(row("the same, compiled at 128 (longest first)", longest_first,
                     f"{len(said_longest)} warning(s)"))

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
    for title, messages in (("compiled at 32", said), ("compiled at 128", said_longest)):
        lines += ["", f"fxopt's warnings ({title}):", ""]
        lines += [f"> {message}" for message in messages] or ["none"]
    text = "\n".join(lines)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write("# Budgets under dynamic shapes (CPU)\n\n`PYTHONPATH=. python benchmarks/"
                    "dynamic_shapes.py --out benchmarks/results/dynamic_shapes_cpu.md`\n\n"
                    + text + "\n")


if __name__ == "__main__":
    main()
