"""What fx code generation pays in Python per op on the CPU (issue 17, item 3 of the brief).

fx's generated code calls each op as ``torch.ops.aten.<op>.<overload>(...)``: an attribute
chain, then ``OpOverload.__call__``, then the C++ dispatcher. This times, on one thread and
in CPU time (immune to other processes' load), one small ``add`` called through each layer:
the generated spelling, the ``OpOverload``, its raw C++ callable, and ``torch.add``; and
counts the ops the fx path runs per training step of the benchmark suite's tiny GPT-2
(forward + backward graphs), so the share a thinner call would save can be read off.

    python benchmarks/fx_op_overhead.py
"""

from __future__ import annotations

import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from codegen_auto import build, step  # noqa: E402

import fxopt  # noqa: E402


def per_call_us(fn, a, b, calls: int = 200_000) -> float:
    start = time.process_time()
    for _ in range(calls):
        fn(a, b)
    return (time.process_time() - start) / calls * 1e6


def main() -> None:
    torch.set_num_threads(1)
    a, b = torch.randn(2, 32, 32), torch.randn(2, 32, 32)
    overload = torch.ops.aten.add.Tensor
    ways = {"generated spelling torch.ops.aten.add.Tensor(a, b)":
            lambda x, y: torch.ops.aten.add.Tensor(x, y),
            "OpOverload object": overload, "its raw C++ callable (_op)": overload._op,
            "torch.add": torch.add}
    print("# fx_op_overhead: CPU time per call of a (2, 32, 32) add, 1 thread, 200k calls")
    for name, fn in ways.items():
        print(f"{name:<55} {per_call_us(fn, a, b):6.2f} us")
    model, kwargs = build("gpt2", "smoke")
    backend = fxopt.backend(codegen="fx", strict=True)
    fn = torch.compile(model, backend=backend)
    step(fn, model, kwargs)
    ops = sum(1 for g in backend.graphs for kind in ("forward", "backward")
              for n in g.graphs[kind].graph.nodes if n.op == "call_function")
    times = sorted(step(fn, model, kwargs) for _ in range(9))
    print(f"GPT-2 smoke (codegen_auto.py's size): {ops} fx calls per step, step "
          f"{times[4] * 1e3:.2f} ms median wall time")


if __name__ == "__main__":
    main()
