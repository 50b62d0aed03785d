"""Issue 17's done-when benchmark: fxopt against plain ``torch.compile`` on the CPU.

transformers GPT-2, BERT (masked LM) and Llama at the benchmark suite's CPU size (4 layers,
hidden 256, batch 4 x 128 tokens; dropout 0.1 in training mode, Llama's on attention),
random weights, one thread. Configurations:

- ``torch.compile``: plain Inductor, the base of every ratio;
- ``fxopt``: fxopt's defaults (``codegen="auto"``: fx on the CPU), ``strict=True``;
- ``fxopt tempo``: with ``tempo=True``;
- ``fxopt inductor`` and ``fxopt inductor tempo``: the same with ``codegen="inductor"``;
- ``torch.compile amb0.5``: Inductor with ``activation_memory_budget=0.5``, the base of
  the budget rows;
- ``fxopt mb0.5`` and ``fxopt inductor mb0.5``: fxopt with ``memory_budget=0.5``.

Step time: the configurations run one step each in turn (the order rotating each round),
median of ``--steps`` timed steps after two warm-up steps, with the min-max spread.
Compile time: the first step's time less the median step, in this process, with Inductor's
FX graph and AOTAutograd caches off and a private ``TORCHINDUCTOR_CACHE_DIR`` (set before
torch is imported), so no configuration reuses another's compiled code. Saved bytes: what
autograd keeps for backward in one forward (``fxopt.analysis.measure_saved_bytes``,
parameters and inputs excluded).

    python benchmarks/fast_path.py --models gpt2,bert,llama --steps 7
    python benchmarks/fast_path.py --models bert --configs "torch.compile,fxopt,fxopt tempo"
"""

from __future__ import annotations

import os
import tempfile

os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", tempfile.mkdtemp(prefix="fast_path_inductor_"))
os.environ["TORCHINDUCTOR_FX_GRAPH_CACHE"] = "0"
os.environ["TORCHINDUCTOR_AUTOGRAD_CACHE"] = "0"
os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")

import argparse  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
from typing import Any  # noqa: E402

import torch  # noqa: E402

# this checkout's fxopt (not an editable install's elsewhere), and codegen_auto beside us
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [_HERE, os.path.dirname(_HERE)]
from codegen_auto import build, step  # noqa: E402

import fxopt  # noqa: E402
from fxopt._compat import activation_memory_budget  # noqa: E402
from fxopt.analysis import measure_saved_bytes  # noqa: E402

FXOPT_OPTIONS = {
    "fxopt": {},
    "fxopt tempo": {"tempo": True},
    "fxopt inductor": {"codegen": "inductor"},
    "fxopt inductor tempo": {"codegen": "inductor", "tempo": True},
    "fxopt mb0.5": {"memory_budget": 0.5},
    "fxopt inductor mb0.5": {"codegen": "inductor", "memory_budget": 0.5},
}
CONFIGS = ("torch.compile", "torch.compile amb0.5", *FXOPT_OPTIONS)
# each configuration's base: plain torch.compile, or Inductor under the same budget
BASE = {c: ("torch.compile amb0.5" if "mb0.5" in c else "torch.compile") for c in CONFIGS}


def inductor_at_half_budget(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
    """Inductor with ``activation_memory_budget=0.5`` while it partitions. A backend of its
    own: plain ``torch.compile`` of a second model instance would reuse the first one's
    compiled graph (parameters are graph inputs), budget or not."""
    from torch._inductor.compile_fx import compile_fx

    with activation_memory_budget(0.5):
        return compile_fx(gm, example_inputs)


class Run:
    """One configuration: its model, compiled function, timings and compile time."""

    def __init__(self, kind: str, config: str):
        self.config = config
        self.model, self.kwargs = build(kind, "suite")
        if config == "torch.compile":
            self.fn = torch.compile(self.model)
        elif config == "torch.compile amb0.5":
            self.fn = torch.compile(self.model, backend=inductor_at_half_budget)
        else:
            self.fn = torch.compile(self.model, backend=fxopt.backend(
                strict=True, **FXOPT_OPTIONS[config]))
        self.times: list[float] = []
        self.first = 0.0

    def step(self) -> float:
        return step(self.fn, self.model, self.kwargs)

    def saved_bytes(self) -> int:
        exclude = [*self.model.parameters(), *self.model.buffers(), *self.kwargs.values()]
        return measure_saved_bytes(lambda: self.fn(**self.kwargs), exclude=exclude).bytes


def measure(kind: str, configs: list[str], steps: int) -> list[dict[str, Any]]:
    runs = []
    for config in configs:
        run = Run(kind, config)
        run.first = run.step()
        run.step()
        runs.append(run)
        print(f"# {kind} {config}: first step {run.first:.1f} s", file=sys.stderr, flush=True)
    for i in range(steps):
        for run in runs[i % len(runs):] + runs[:i % len(runs)]:
            run.times.append(run.step())
    results = []
    for run in runs:
        median = statistics.median(run.times)
        results.append({"model": kind, "config": run.config, "step_s": run.times,
                        "median_s": median, "compile_s": run.first - median,
                        "saved_bytes": run.saved_bytes()})
    return results


def print_table(results: list[dict[str, Any]]) -> None:
    by_config = {(r["model"], r["config"]): r for r in results}
    print("| model | config | step ms (median) | spread (min-max) | step / base | compile s "
          "| compile / base | saved MiB | saved / base | saved / fxopt | base |")
    print("| --- | --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |")
    for r in results:
        base = by_config.get((r["model"], BASE[r["config"]]))
        defaults = by_config.get((r["model"], "fxopt"))
        cut = f"{r['saved_bytes'] / defaults['saved_bytes']:.2f}" if defaults else ""

        def ratio(key: str, r: dict[str, Any] = r, base: dict[str, Any] | None = base) -> str:
            return f"{r[key] / base[key]:.2f}" if base else ""

        print(f"| {r['model']} | {r['config']} | {r['median_s'] * 1e3:.1f} | "
              f"{min(r['step_s']) * 1e3:.1f}-{max(r['step_s']) * 1e3:.1f} | "
              f"{ratio('median_s')} | {r['compile_s']:.1f} | {ratio('compile_s')} | "
              f"{r['saved_bytes'] / 2**20:.2f} | {ratio('saved_bytes')} | {cut} | "
              f"{BASE[r['config']]} |", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="gpt2,bert,llama")
    parser.add_argument("--configs", default=",".join(CONFIGS))
    parser.add_argument("--steps", type=int, default=7)
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(f"# fast_path: CPU ({platform.machine()}), torch {torch.__version__}, 1 thread, "
          f"{args.steps} interleaved steps, dropout 0.1 in training mode")
    print(f"# command: python benchmarks/fast_path.py {' '.join(sys.argv[1:])}", flush=True)
    results = []
    for kind in args.models.split(","):
        model_results = measure(kind, args.configs.split(","), args.steps)
        print_table(model_results)
        results += model_results
        torch._dynamo.reset()
    print("\n<!-- raw: " + json.dumps(results) + " -->")


if __name__ == "__main__":
    main()
