"""``fxopt doctor``'s memory check on the CPU: its model (six Linear-GELU layers and a head,
scaled down in width and batch by the same factor, so every tensor keeps its share), one
training step at the check's budgets, the measured peak against the planner's prediction.

    PYTHONPATH=. python benchmarks/doctor_memory.py [--width 512] [--batch 2048] \
        [--codegen auto fx]

Per code generator and budget: the peak above the parameters and the input, measured
(`fxopt.profile_memory`'s allocation records) and predicted (``memory["fxopt"]``'s peak less
its baseline: the same parameters and input), what the activations and the temporaries
held at the measured peak, the bytes kept for backward as a fraction of eager's (saved-tensor
hooks: the fraction's promise), and what swap_recompute decided. Measured bytes, not timings:
the figures are the same on any CPU. At width 2048 and batch 8192 (the doctor's size) every
tensor is 16x the default's.
"""

from __future__ import annotations

import argparse
import logging

import torch

from fxopt.analysis import measure_saved_bytes
from fxopt.compiler import Backend
from fxopt.doctor.memory import deep_mlp
from fxopt.profile import profile_memory

log = logging.getLogger("benchmarks.doctor_memory")
MIB = 2**20


def row(width: int, batch: int, codegen: str, fraction: float) -> str:
    torch.compiler.reset()
    torch.manual_seed(0)
    model, x = deep_mlp(width), torch.randn(batch, width)
    backend = Backend({"memory_budget": fraction, "codegen": codegen})
    compiled = torch.compile(model, backend=backend)
    profile = profile_memory(compiled, (x,), steps=1, warmup=1)
    at_peak = profile.peak_categories
    measured = profile.peak_bytes - at_peak["parameters"] - at_peak["inputs"]
    estimates = [g.memory["fxopt"] for g in backend.graphs if g.memory.get("fxopt")]
    predicted = sum(e.peak_bytes - e.baseline_bytes for e in estimates)
    stats = [r.stats for g in backend.graphs for r in g.pass_records("swap_recompute")]
    plan = "; ".join(_plan(s) for s in stats)
    kept = _saved(model, compiled, x) / _saved(model, model, x)
    return (f"| {codegen} | {fraction} | {measured / MIB:.2f} | {predicted / MIB:.2f} | "
            f"{predicted / measured - 1:+.1%} | {at_peak['activations'] / MIB:.2f} | "
            f"{at_peak['temporaries'] / MIB:.2f} | {kept:.3f} | "
            f"{', '.join(e.peak_node for e in estimates)} | {plan} |")


def _saved(model: torch.nn.Module, step, x: torch.Tensor) -> int:
    return measure_saved_bytes(lambda: step(x).sum(), exclude=[*model.parameters(), x]).bytes


def _plan(stats: dict) -> str:
    if "budget" not in stats:
        return "no budget"
    text = f"fxopt plan: recompute {stats.get('recompute_nodes')} nodes"
    if "inductor" in stats:
        text += (f"; chosen: {stats['inductor']['partition']} (activation_memory_budget "
                 f"{stats['inductor']['activation_memory_budget']})")
    return text


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--width", type=int, default=512)
    parser.add_argument("--batch", type=int, default=2048)
    parser.add_argument("--codegen", nargs="+", default=["auto", "fx"])
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    torch.set_num_threads(1)
    log.info("| codegen | budget | measured MiB | predicted MiB | predicted/measured | "
             "activations at peak | temporaries at peak | saved / eager's | predicted peak at "
             "| plan |")
    log.info("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for codegen in args.codegen:
        for fraction in (1.0, 0.6, 0.35):
            log.info(row(args.width, args.batch, codegen, fraction))


if __name__ == "__main__":
    main()
