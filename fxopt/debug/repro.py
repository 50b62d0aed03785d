"""A runnable repro of a captured graph: its code and random inputs of the recorded shapes.

``write_repro`` writes ``repro_<kind>.py`` beside the dumps: the graph's readable Python
(with plain calling conventions: AOTAutograd's pytree signature and fxopt's boxed one are
replaced by plain positional arguments), a table of its inputs (shape, stride, dtype,
device, or the int a symbolic size had) and a ``main`` that builds random inputs, runs the
graph and prints what it returned. Tensor attributes the graph reads (``get_attr``) go to
``repro_<kind>.pt``. So a failing or surprising graph can be rerun, bisected and shared
without the model or its data. Integer inputs are drawn from {0, 1}: they are often
indices, and 0/1 is in range of any index they could be.
"""

from __future__ import annotations

import functools
import textwrap
from pathlib import Path
from typing import Any

import torch
import torch.fx as fx

from fxopt import _compat
from fxopt.analysis.shapes import size_hint

__all__ = ["write_repro", "input_specs"]

_HEADER = '''"""Repro of fxopt graph {graph} ({kind}), as the {stage} stage received it.

Written by fxopt's debug dump. Run:  python {script} [--device cuda] [--seed 0]
Inputs are random with the recorded shapes, strides and dtypes (integers in {{0, 1}}).
"""

import argparse
import math
import operator  # noqa: F401  (the graph code may call it)
from pathlib import Path

import torch
from torch import device  # noqa: F401  (the graph code may name devices)

inf, nan = math.inf, math.nan

'''

_MAIN = '''

INPUTS = {inputs!r}


def make_inputs(device_name=None):
    """Random inputs with the recorded shapes, strides and dtypes."""
    values = []
    for spec in INPUTS:
        if spec[0] != "tensor":
            values.append(spec[1])
            continue
        _, shape, stride, dtype, where = spec
        dtype = getattr(torch, dtype)
        tensor = torch.empty_strided(shape, stride, dtype=dtype, device=device_name or where)
        if dtype.is_floating_point or dtype.is_complex:
            tensor.normal_()
        else:
            tensor.random_(0, 2)
        values.append(tensor)
    return values


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", help="run on this device instead of the recorded one")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.manual_seed(args.seed)
    module = GraphModule()
    attributes = Path(__file__).with_suffix(".pt")
    if attributes.exists():
        for name, value in torch.load(attributes).items():
            owner, *path = [module] + name.split(".")
            for part in path[:-1]:
                if not hasattr(owner, part):
                    owner.add_module(part, torch.nn.Module())
                owner = getattr(owner, part)
            setattr(owner, path[-1], value)
    module.to(args.device or "cpu")
    with torch.no_grad():
        outputs = module(*make_inputs(args.device))
    flat = outputs if isinstance(outputs, (tuple, list)) else [outputs]
    for i, value in enumerate(flat):
        if isinstance(value, torch.Tensor):
            print(f"output {{i}}: {{str(value.dtype).removeprefix('torch.')}}"
                  f"{{list(value.shape)}}")
        else:
            print(f"output {{i}}: {{value!r}}")


if __name__ == "__main__":
    main()
'''


def _example_value(node: fx.Node) -> Any:
    return node.meta.get("val", node.meta.get("example_value"))


def input_specs(gm: fx.GraphModule) -> list[tuple[Any, ...]]:
    """Per placeholder: ("tensor", shape, stride, dtype, device) with symbolic sizes
    resolved by their hints, ("value", v) for an int/float/bool/None input."""
    specs: list[tuple[Any, ...]] = []
    for node in gm.graph.find_nodes(op="placeholder"):
        value = _example_value(node)
        if isinstance(value, torch.Tensor):
            specs.append(("tensor", [size_hint(s) for s in value.shape],
                          [size_hint(s) for s in value.stride()],
                          str(value.dtype).removeprefix("torch."), str(value.device)))
        elif _compat.is_symbolic(value) or isinstance(value, (int, float, bool)):
            specs.append(("value", size_hint(value) if _compat.is_symbolic(value) else value))
        elif value is None:
            specs.append(("value", None))
        else:
            raise ValueError(f"input {node.name} has no recorded tensor or value "
                             f"({type(value).__name__}); no repro for this graph")
    return specs


def _plain_code(gm: fx.GraphModule) -> str:
    """The graph's code as a ``GraphModule`` class with a plain positional signature
    (shape/dtype/stride comments as fx's readable print has them)."""
    graph = _compat.copy_graph(gm.graph)
    graph.set_codegen(fx.graph.CodeGen())
    code = graph.python_code("self", verbose=True, include_stride=True,
                             include_device=True).src.strip("\n")
    return "class GraphModule(torch.nn.Module):\n" + textwrap.indent(code, "    ") + "\n"


def _tensor_attributes(gm: fx.GraphModule) -> dict[str, torch.Tensor]:
    """The graph's tensor attributes, detached and on the CPU. The dump writes while the
    compilation's FakeTensorMode is active, and the attributes (a lifted constant such as
    transformers' ``tensor(0.)``) are real tensors, which that mode refuses to run ops on;
    so the copies are made with no mode active."""
    attributes: dict[str, torch.Tensor] = {}
    for node in gm.graph.find_nodes(op="get_attr"):
        value = functools.reduce(getattr, node.target.split("."), gm)
        if not isinstance(value, torch.Tensor):
            raise ValueError(f"the graph reads attribute {node.target!r}, a "
                             f"{type(value).__name__}; only tensor attributes can be saved")
        with _compat.modes_suspended():
            attributes[node.target] = value.detach().cpu()
    return attributes


def write_repro(gm: fx.GraphModule, folder: Path, *, graph: str, kind: str,
                stage: str) -> Path:
    """Write ``folder/repro_<kind>.py`` (and its ``.pt`` of attributes when the graph reads
    any); returns the script's path. Raises ValueError for a graph it cannot reproduce."""
    script = folder / f"repro_{kind}.py"
    specs = input_specs(gm)
    attributes = _tensor_attributes(gm)
    text = (_HEADER.format(graph=graph, kind=kind, stage=stage, script=script.name)
            + _plain_code(gm) + _MAIN.format(inputs=specs))
    script.write_text(text)
    if attributes:
        torch.save(attributes, script.with_suffix(".pt"))
    return script
