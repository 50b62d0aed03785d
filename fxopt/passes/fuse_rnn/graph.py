"""What the fuse_rnn rewrites share: recognising torch-level calls in Dynamo's graph, the
dtype rules of autocast regions, and emitting the fused cell op.

Calls are recognised in every spelling Dynamo records (``torch.sigmoid(x)``,
``x.sigmoid()``, ``F.sigmoid(x)``; ``a * b``, ``torch.mul``) through the passes' shared
vocabulary, :mod:`fxopt.passes.torch_calls`; :func:`is_op` adds fuse_rnn's own rule.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx as fx

from fxopt.kernels import fuse_rnn as _kernels
from fxopt.passes.base import PassContext, Verdicts
from fxopt.passes.torch_calls import is_call

PASS = "fuse_rnn"
# the fused step per cell kind: {fuses pointwise: target}
CELLS = {"lstm": {False: torch.ops.fxopt.lstm_cell.default,
                  True: _kernels.fusible_lstm_cell},
         "gru": {False: torch.ops.fxopt.gru_cell.default, True: _kernels.fusible_gru_cell}}


def is_op(node: Any, name: str) -> bool:
    """Whether ``node`` calls ``name`` as a function or a tensor method, with no extra
    keyword arguments such as ``alpha=``, which would change the math (``chunk``'s ``dim=``
    excepted)."""
    if not isinstance(node, fx.Node) or node.kwargs and name != "chunk":
        return False
    return is_call(node, name)


def same_shape(x: torch.Tensor, y: torch.Tensor) -> bool:
    """Whether two fake values surely have one shape, without adding a guard: equal ints,
    or the same symbolic expression (``dynamic=True``)."""
    return x.dim() == y.dim() and all(
        p == q if isinstance(p, int) and isinstance(q, int) else str(p) == str(q)
        for p, q in zip(x.shape, y.shape))


# The kernels compute in fp32: exact enough for fp32, bf16 and fp16 values, not for fp64.
_FUSABLE_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def dtype_problem(*values: Any) -> str | None:
    """Why tensors of these dtypes cannot go through the fused op (None when they can)."""
    for v in values:
        if isinstance(v, torch.Tensor) and v.dtype not in _FUSABLE_DTYPES:
            return f"{v.dtype} (the kernels compute in fp32)"
    return None


def autocast_dtypes(graph: fx.Graph) -> dict[fx.Node, dict[str, torch.dtype]]:
    """For each node, the autocast regions it is in: {device type: lower-precision dtype}.
    Dynamo records ``with torch.autocast(...)`` as ``_enter_autocast``/``_exit_autocast``
    calls; a projection emitted inside one gets its dtype."""
    active: dict[fx.Node, tuple[str, torch.dtype, bool]] = {}
    result: dict[fx.Node, dict[str, torch.dtype]] = {}
    for node in graph.nodes:
        name = getattr(node.target, "__name__", "")
        if node.op == "call_function" and name == "_enter_autocast":
            device_type, dtype, enabled = node.args[:3]
            active[node] = (device_type, dtype, bool(enabled))
        elif node.op == "call_function" and name == "_exit_autocast" and node.args:
            active.pop(node.args[0], None)
        regions: dict[str, torch.dtype] = {}
        for device_type, dtype, enabled in active.values():  # later regions override
            if enabled:
                regions[device_type] = dtype
            else:
                regions.pop(device_type, None)
        result[node] = regions
    return result


@dataclass
class Rewrite:
    """One pass run's shared state: the graph, the context, autocast regions, the verdicts
    (cells fused per kind, each cell declined and why) and the projections hoisted."""

    gm: fx.GraphModule
    ctx: PassContext
    verdicts: Verdicts = field(default_factory=Verdicts)
    hoisted_projections: int = 0
    cost_model: list[dict[str, Any]] = field(default_factory=list)  # whole calls priced

    def __post_init__(self) -> None:
        self.autocast = autocast_dtypes(self.gm.graph)

    @property
    def graph(self) -> fx.Graph:
        return self.gm.graph

    def decline(self, what: str, reason: str, site: fx.Node) -> None:
        self.verdicts.decline(site.name, f"{what}: {reason}")

    def count(self, what: str) -> None:
        self.verdicts.match(what)

    def projection_dtype(self, at: fx.Node, x: torch.Tensor, w: torch.Tensor) -> torch.dtype:
        """The dtype of ``linear(x, w)`` emitted next to ``at`` (autocast casts GEMMs)."""
        region = self.autocast.get(at, {}).get(x.device.type)
        if region is not None and x.is_floating_point():
            return region
        return torch.promote_types(x.dtype, w.dtype)

    def emit(self, target: Any, *args: Any, method: bool = False,
             replaces: list[str] | None = None, like: fx.Node | None = None) -> fx.Node:
        """A new node (inserted at the graph's current insertion point), marked as ours;
        ``like``: the node whose value it stands for, so later matches can read it."""
        op = "call_method" if method else "call_function"
        node = self.graph.create_node(op, target, args)
        node.meta["fxopt"] = {"pass": PASS, "replaces": list(replaces or [])}
        if like is not None and "example_value" in like.meta:
            node.meta["example_value"] = like.meta["example_value"]
        return node

    @staticmethod
    def state_dtype_for(state_dtype: torch.dtype, proj_dtype: torch.dtype,
                        expected: torch.dtype) -> torch.dtype | None:
        """The dtype the state must have for the fused op to return ``expected`` (eager's
        dtype): its own, or ``expected`` where autocast casts a built-in cell's state to
        the lower precision; None when no state dtype gives eager's dtype."""
        if torch.promote_types(proj_dtype, state_dtype) == expected:
            return state_dtype
        if torch.promote_types(proj_dtype, expected) == expected:
            return expected
        return None

    def cast(self, node: fx.Node, dtype: torch.dtype, to: torch.dtype,
             replaces: list[str]) -> fx.Node:
        return node if dtype == to else self.emit("to", node, to, method=True,
                                                  replaces=replaces)

    def fused_cell(self, kind: str, a: fx.Node, b: fx.Node, state: fx.Node,
                   bias_a: fx.Node | None, bias_b: fx.Node | None, order: tuple[int, ...],
                   replaces: list[str]) -> fx.Node:
        """The fused step: the custom op (its Triton kernels, or the reference, as one call),
        or where the code generator fuses pointwise ops (Inductor) its fusible form, whose
        forward and backward it generates as one kernel each, launched from compiled code
        instead of a Python op per step (:data:`CELLS`)."""
        op = CELLS[kind][self.ctx.codegen.fuses_pointwise]
        return self.emit(op, a, b, state, bias_a, bias_b, list(order), replaces=replaces)

    def stats(self) -> dict[str, Any]:
        stats: dict[str, Any] = {
            "form": "fusible" if self.ctx.codegen.fuses_pointwise else "custom_ops",
            "hoisted_input_projections": self.hoisted_projections}
        if self.cost_model:
            stats["cost_model"] = list(self.cost_model)
        return stats

