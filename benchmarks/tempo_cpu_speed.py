"""CPU step time of tempo against fxopt's defaults and plain ``torch.compile`` (issue 17).

GPT-2 and BERT from transformers (4 layers, 256 wide, 4 heads, dropout 0.1, eager
attention, batch 4 x 64), trained on one thread. The configurations (fxopt's defaults,
fxopt with ``tempo=True``, both ``strict=True``, and Inductor) run one step each in turn,
round after round, so that a load shared with other processes falls on all of them alike;
each one's median step time over the timed rounds is printed with its spread (min-max)
and the ratios to fxopt's defaults and to Inductor, with the bytes autograd saves for
backward in one forward (``fxopt.analysis.measure_saved_bytes``, parameters and inputs
excluded) and the first step's time (compile included).

    python benchmarks/tempo_cpu_speed.py               # 2 warm-up and 9 timed rounds
    python benchmarks/tempo_cpu_speed.py --rounds 15 --models gpt2
"""

from __future__ import annotations

import argparse
import platform
import statistics
from collections.abc import Callable

import torch

import fxopt
from fxopt.analysis import measure_saved_bytes
from fxopt.bench import timing

CONFIGS: dict[str, Callable[[torch.nn.Module], Callable]] = {
    "fxopt": lambda model: torch.compile(model, backend=fxopt.backend(strict=True)),
    "fxopt+tempo": lambda model: torch.compile(
        model, backend=fxopt.backend(strict=True, tempo=True)),
    "inductor": lambda model: torch.compile(model),
}
LAYERS, HIDDEN, HEADS, BATCH, SEQ, VOCAB = 4, 256, 4, 4, 64, 1000


def build(name: str) -> torch.nn.Module:
    import transformers

    if name == "gpt2":
        return transformers.GPT2LMHeadModel(transformers.GPT2Config(
            n_layer=LAYERS, n_embd=HIDDEN, n_head=HEADS, n_positions=SEQ, vocab_size=VOCAB,
            resid_pdrop=0.1, embd_pdrop=0.1, attn_pdrop=0.1, use_cache=False,
            attn_implementation="eager"))
    return transformers.BertForMaskedLM(transformers.BertConfig(
        num_hidden_layers=LAYERS, hidden_size=HIDDEN, num_attention_heads=HEADS,
        intermediate_size=4 * HIDDEN, max_position_embeddings=SEQ, vocab_size=VOCAB,
        hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1,
        attn_implementation="eager"))


class Runner:
    """One configuration's model, compiled function and timings."""

    def __init__(self, model_name: str, config: str):
        torch.manual_seed(0)
        self.model = build(model_name).train()
        self.fn = CONFIGS[config](self.model)
        ids = torch.randint(0, VOCAB, (BATCH, SEQ), generator=torch.Generator().manual_seed(1))
        self.kwargs = {"input_ids": ids, "labels": ids}
        self.times: list[float] = []

    def step(self) -> None:
        self.fn(**self.kwargs).loss.backward()
        self.model.zero_grad(set_to_none=True)

    def saved_bytes(self) -> int:
        exclude = [*self.model.parameters(), *self.model.buffers(), self.kwargs["input_ids"]]
        return measure_saved_bytes(lambda: self.fn(**self.kwargs), exclude=exclude).bytes


def run(model_name: str, configs: list[str], warmup: int, rounds: int) -> None:
    runners = {config: Runner(model_name, config) for config in configs}
    taken = timing.interleaved({config: runner.step for config, runner in runners.items()},
                               "cpu", warmup=warmup - 1, rounds=rounds)
    first = {config: t.first_s for config, t in taken.items()}
    for config, runner in runners.items():
        runner.times = taken[config].times_s
    medians = {config: statistics.median(r.times) for config, r in runners.items()}
    print(f"\n## {model_name}: {LAYERS} layers, {HIDDEN} wide, {HEADS} heads, dropout 0.1, "
          f"batch {BATCH} x {SEQ}, eager attention")
    print(f"{'config':<12} {'median ms':>9} {'min-max ms':>15} {'x fxopt':>8} "
          f"{'x inductor':>10} {'saved KiB':>10} {'first step s':>12}")
    for config, runner in runners.items():
        median = medians[config]
        ratio = {base: (f"{median / medians[base]:.3f}" if base in medians else "-")
                 for base in ("fxopt", "inductor")}
        print(f"{config:<12} {median * 1e3:>9.1f} "
              f"{min(runner.times) * 1e3:>7.1f}-{max(runner.times) * 1e3:<7.1f} "
              f"{ratio['fxopt']:>8} {ratio['inductor']:>10} "
              f"{runner.saved_bytes() / 1024:>10.1f} {first[config]:>12.1f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="gpt2,bert")
    parser.add_argument("--configs", default=",".join(CONFIGS))
    parser.add_argument("--warmup", type=int, default=2, help="untimed rounds (>= 1)")
    parser.add_argument("--rounds", type=int, default=9, help="timed rounds (>= 7)")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"# tempo CPU step time, {platform.machine()}, torch {torch.__version__}, "
          f"{args.threads} thread(s), {args.warmup} warm-up and {args.rounds} timed rounds, "
          f"configurations interleaved")
    for model_name in args.models.split(","):
        run(model_name, args.configs.split(","), max(1, args.warmup), args.rounds)
        torch._dynamo.reset()


if __name__ == "__main__":
    main()
