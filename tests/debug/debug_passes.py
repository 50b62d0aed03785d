"""Test-only passes that change graphs the way real passes do, with provenance (passes
README rule 5), so the dump and the diff tool are tested before real passes exist; and an
instrument that records each pass's true input and output graphs, the diff's ground
truth."""

import torch
import torch.fx as fx

from fxopt.passes import PassResult, PassSpec, Stage
from fxopt.passes.base import Verdicts

aten = torch.ops.aten


def split_addmm(gm: fx.GraphModule, ctx) -> PassResult:
    """Each addmm(bias, x, w) becomes add(mm(x, w), bias): two new nodes replace one.
    Its plan (in the stats) lists the nodes it split."""
    split = []
    for node in list(gm.graph.find_nodes(op="call_function", target=aten.addmm.default)):
        if node.kwargs or not ctx.rewrites.allow():
            continue
        bias, x, weight = node.args
        with gm.graph.inserting_before(node):
            product = gm.graph.call_function(aten.mm.default, (x, weight))
            total = gm.graph.call_function(aten.add.Tensor, (product, bias))
        for new in (product, total):
            new.meta["fxopt"] = {"pass": "split_addmm", "replaces": [node.name]}
        node.replace_all_uses_with(total)
        gm.graph.erase_node(node)
        split.append(node.name)
    verdicts = Verdicts()
    if split:
        verdicts.match("addmm", count=len(split))
    return PassResult(gm, bool(split), verdicts, stats={"plan": {"split": split}})


def plans_only(gm: fx.GraphModule, ctx) -> PassResult:
    """Changes nothing, but reports a plan, as a planner-driven pass would."""
    sizes = {n.name: list(n.meta["val"].shape) for n in gm.graph.find_nodes(op="placeholder")}
    return PassResult(gm, False, stats={"plan": {"keep": sorted(sizes), "sizes": sizes}})


def spec(fn, stage):
    return PassSpec(name=fn.__name__, stages=(stage,), description="test pass", run=fn,
                    default=lambda ctx: True, default_text="on")


SPLIT_ADDMM = spec(split_addmm, Stage.FORWARD)
PLANS_ONLY = spec(plans_only, Stage.JOINT)


class GraphRecorder:
    """An instrument keeping, per pass that changed a graph, its input and output
    graph modules and its record."""

    def __init__(self):
        self.changes = []

    def stage_started(self, ctx, gm):
        pass

    def pass_finished(self, record, before, after):
        if record.status == "changed":
            self.changes.append((record, before, after))


def node_signature(node: fx.Node):
    inputs = fx.node.map_arg((node.args, node.kwargs), lambda n: f"node:{n.name}")
    return node.op, str(node.target), repr(inputs)


def true_diff(before: fx.GraphModule, after: fx.GraphModule):
    """Names added, removed and changed, straight from the graph modules."""
    old = {n.name: n for n in before.graph.nodes}
    new = {n.name: n for n in after.graph.nodes}
    changed = {name for name in old.keys() & new.keys()
               if node_signature(old[name]) != node_signature(new[name])}
    return set(new) - set(old), set(old) - set(new), changed
