"""The step's memory and time as functions of the graph's symbolic sizes (Mist's idea).

A graph compiled with ``dynamic=True`` carries SymInts in ``node.meta["val"]`` shapes, whose
``node.expr`` are sympy expressions of the size symbols (``s0``, ``s1``: batch, sequence
length). :func:`symbolic_step` builds, once per joint graph:

- **memory**: the memory simulation of :mod:`fxopt.analysis.memory` (the same liveness,
  run by a subclass that also records each storage's size as an expression), so the live
  bytes at every step are ``baseline + sum of the sizes of the storages alive then``;
- **time**: per node, the roofline ``max(flops / rate(dtype), bytes / bandwidth)`` of
  :mod:`fxopt.analysis.cost`'s notions, with FLOPs and bytes as expressions (matmuls
  exactly, ``2*M*N*K``; other FLOP-registry ops, such as convolutions, scaled from their
  hinted count by their output's size).

Every expression is expanded into terms ``coefficient x basis`` (a monomial of the symbols,
or whatever non-polynomial factor a size has), and the model is stored as integer matrices
over the basis: evaluating many candidate sizes is one lambdified basis evaluation and a
matrix product (numpy), never a rebuild or a substitution into thousands of expressions.

:meth:`SymbolicStep.largest_fitting` answers "the largest batch that fits in B bytes, and
its predicted throughput". Not modelled: what the memory simulation does not model
(workspaces, allocator caching), and sizes of zero (a size-0 dimension makes a storage
empty, which an expression of the symbols does not see).

It subclasses the private ``_Simulation`` of :mod:`fxopt.analysis.memory` (same package) so
that the liveness rules exist once; a change there must keep ``_fresh`` and the fields
``live_exprs`` reads.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import sympy
import torch
from torch import fx

from fxopt.analysis import memory as _memory
from fxopt.analysis.cost import is_view_op, node_cost
from fxopt.analysis.shapes import size_hint, tensor_values
from fxopt.planner.hardware import HardwareProfile

__all__ = ["SymbolicStep", "storage_bytes", "symbolic_step", "sym"]

log = logging.getLogger(__name__)

# Matmuls whose FLOPs are written exactly: (op, index of the [.., M, K] operand).
_MATMULS = {
    torch.ops.aten.mm.default: 0, torch.ops.aten.addmm.default: 1,
    torch.ops.aten.bmm.default: 0, torch.ops.aten.baddbmm.default: 1,
}


def sym(value: int | torch.SymInt) -> sympy.Expr:
    """A size as a sympy expression (an int as an Integer)."""
    if isinstance(value, torch.SymInt):
        return sympy.sympify(value.node.expr)
    return sympy.Integer(int(value))


def _numel(t: torch.Tensor) -> sympy.Expr:
    return sympy.Mul(*[sym(s) for s in t.shape])


def storage_bytes(t: torch.Tensor) -> sympy.Expr:
    """The span a tensor's strides reach, in bytes (as ``shapes.storage_nbytes``)."""
    if any(size_hint(s) == 0 for s in t.shape):
        return sympy.Integer(0)
    span = 1 + sum((sym(size) - 1) * sym(stride) for size, stride in zip(t.shape, t.stride()))
    return sympy.expand((sym(t.storage_offset()) + span) * t.element_size())


class _Basis:
    """Expressions as integer rows over a shared basis of terms."""

    def __init__(self) -> None:
        self.terms: dict[sympy.Expr, int] = {sympy.Integer(1): 0}

    def row(self, expr: sympy.Expr) -> dict[int, float]:
        out: dict[int, float] = {}
        for term in sympy.Add.make_args(sympy.expand(expr)):
            coeff, rest = term.as_coeff_Mul()
            index = self.terms.setdefault(rest, len(self.terms))
            out[index] = out.get(index, 0.0) + float(coeff)
        return out

    def matrix(self, rows: list[dict[int, float]]) -> np.ndarray:
        m = np.zeros((len(rows), len(self.terms)))
        for i, row in enumerate(rows):
            for j, v in row.items():
                m[i, j] = v
        return m


class _SymbolicSimulation(_memory._Simulation):
    """The memory simulation, also recording each storage's size as an expression."""

    def __init__(self) -> None:
        super().__init__()
        self.exprs: list[sympy.Expr] = []

    def _fresh(self, val: Any, *, step: int, caller_owned: bool = False) -> Any:
        sid = super()._fresh(val, step=step, caller_owned=caller_owned)
        if isinstance(val, torch.Tensor):
            self.exprs.append(storage_bytes(val))
        return sid

    def live_exprs(self) -> tuple[list[str], list[list[int]], list[list[int]], sympy.Expr]:
        """Step labels, the storages born and dying at each step, and the baseline bytes
        (with the deaths ``_Simulation.result`` computes)."""
        end = len(self.steps)
        death = list(self.birth)
        for node, tree in self.trees.items():
            last = max([self.step_of.get(node, -1), self.extra_death.get(node, -1)]
                       + [self.step_of[u] for u in node.users if u in self.step_of])
            for sid in _memory._leaves(tree):
                death[sid] = max(death[sid], last)
        for node in self.held:
            for sid in _memory._leaves(self.trees[node]):
                death[sid] = end
        born: list[list[int]] = [[] for _ in range(end + 2)]
        dead: list[list[int]] = [[] for _ in range(end + 2)]
        for sid in range(len(self.sizes)):
            if sid not in self.caller_owned:
                born[self.birth[sid]].append(sid)
                dead[death[sid] + 1].append(sid)
        baseline = sympy.Add(*[self.exprs[s] for s in self.caller_owned])
        return [label for label, _ in self.steps], born, dead, baseline


@dataclass(frozen=True)
class SymbolicStep:
    """One training step's memory and time over a basis of size terms (see the module doc).

    ``symbols`` maps each size symbol's name to its hint (the size it was captured at);
    ``origins`` names where each appears among the graph's inputs (``primals_3[0]``: dim 0
    of that input), which is how a user finds the batch symbol.
    """

    symbols: Mapping[str, int]
    labels: tuple[str, ...]
    live: np.ndarray          # steps x basis: live bytes per step
    flops: np.ndarray         # nodes x basis
    bytes_moved: np.ndarray   # nodes x basis
    flop_rates: np.ndarray    # per node
    bandwidth: float
    basis: tuple[sympy.Expr, ...]
    symbol_objects: tuple[sympy.Symbol, ...] = ()
    origins: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    # the profile's per-node overhead times the executed nodes, and per node the seconds
    # of its special functions and random draws (HardwareProfile.node_seconds)
    overhead_seconds: float = 0.0
    special: np.ndarray | None = None   # nodes x basis

    def _basis_values(self, values: Mapping[str, Any]) -> np.ndarray:
        unknown = set(values) - set(self.symbols)
        if unknown:
            raise ValueError(f"fxopt: unknown size symbols {sorted(unknown)}; this graph has "
                             f"{dict(self.symbols)}")
        full = {**self.symbols, **values}
        n = max((np.size(v) for v in full.values()), default=1)
        fn = self._lambdified()
        args = [np.broadcast_to(np.asarray(full[str(s)], dtype=np.float64), (n,))
                for s in self.symbol_objects]
        return np.stack([np.broadcast_to(np.asarray(v, dtype=np.float64), (n,))
                         for v in fn(*args)])  # basis x candidates

    def _lambdified(self) -> Any:
        cached = self.__dict__.get("_fn")
        if cached is None:  # built once per model (a frozen dataclass: set directly)
            cached = sympy.lambdify(list(self.symbol_objects), list(self.basis), "numpy")
            object.__setattr__(self, "_fn", cached)
        return cached

    def peak_bytes(self, **values: Any) -> np.ndarray:
        """Predicted peak bytes for sizes (scalars or arrays of candidates)."""
        live = self.live @ self._basis_values(values)
        return live.max(axis=0) if live.size else np.zeros(1)

    def step_seconds(self, **values: Any) -> np.ndarray:
        """Predicted roofline step time for sizes (scalars or arrays of candidates)."""
        basis = self._basis_values(values)
        compute = (self.flops @ basis) / self.flop_rates[:, None]
        memory = (self.bytes_moved @ basis) / self.bandwidth
        slowest = np.maximum(compute, memory)
        if self.special is not None:
            slowest = np.maximum(slowest, self.special @ basis)
        return self.overhead_seconds + slowest.sum(axis=0)

    def live_expr(self, step: int) -> sympy.Expr:
        """The live bytes at one step as an expression."""
        return sympy.Add(*[int(c) * b for c, b in zip(self.live[step], self.basis) if c])

    def largest_fitting(self, symbol: str, budget_bytes: int, *, upper: int = 1 << 16,
                        **fixed: Any) -> tuple[int, float, float] | None:
        """The largest value of ``symbol`` in ``1..upper`` whose predicted peak fits in
        ``budget_bytes`` (other symbols at ``fixed`` or their hints), with its predicted
        peak and throughput (``symbol`` units per second, e.g. samples/s); None if even 1
        does not fit."""
        if symbol not in self.symbols:
            raise ValueError(f"fxopt: no size symbol {symbol!r}; this graph has "
                             f"{dict(self.symbols)}")
        candidates = np.arange(1, upper + 1)
        peaks = self.peak_bytes(**fixed, **{symbol: candidates})
        fits = np.nonzero(peaks <= budget_bytes)[0]
        if fits.size == 0:
            return None
        best = int(candidates[fits[-1]])
        seconds = float(self.step_seconds(**fixed, **{symbol: best})[0])
        return best, float(peaks[fits[-1]]), best / seconds if seconds else math.inf


def symbolic_step(joint_gm: fx.GraphModule, num_fwd_outputs: int,
                  hardware: HardwareProfile) -> SymbolicStep:
    """Build the symbolic model of a joint graph (static sizes give constant expressions)."""
    sim = _SymbolicSimulation()
    labels, born, dead, baseline = _simulate(sim, joint_gm, num_fwd_outputs)
    basis = _Basis()
    rows, running = [], {}
    base_row = basis.row(baseline)
    size_rows = [basis.row(e) for e in sim.exprs]
    for t in range(len(labels)):
        for sid in born[t]:
            for j, v in size_rows[sid].items():
                running[j] = running.get(j, 0.0) + v
        for sid in dead[t]:
            for j, v in size_rows[sid].items():
                running[j] = running.get(j, 0.0) - v
        row = dict(base_row)
        for j, v in running.items():
            row[j] = row.get(j, 0.0) + v
        rows.append(row)

    flop_rows, byte_rows, special_rows, rates, executed = [], [], [], [], 0
    for node in joint_gm.graph.nodes:
        if node.op != "call_function" or not tensor_values(node):  # not SymInt arithmetic
            continue
        executed += 1
        if is_view_op(node.target):
            continue
        flop_rows.append(basis.row(_flops(node)))
        byte_rows.append(basis.row(_bytes(node)))
        special_rows.append(basis.row(_special(node, hardware)))
        outs = tensor_values(node)
        rates.append(hardware.flop_rate(outs[0].dtype if outs else torch.float32))

    hints, origins = _hints(joint_gm)
    used = sorted({s for b in basis.terms for s in b.free_symbols}, key=str)
    missing = [str(s) for s in used if s not in hints]
    if missing:
        raise ValueError(f"fxopt: sizes use symbols {missing} with no hint")
    step = SymbolicStep(
        symbols={str(s): hints[s] for s in used}, labels=tuple(labels),
        live=basis.matrix(rows), flops=basis.matrix(flop_rows),
        bytes_moved=basis.matrix(byte_rows), flop_rates=np.asarray(rates, dtype=np.float64),
        bandwidth=hardware.memory_bandwidth,
        basis=tuple(sorted(basis.terms, key=basis.terms.get)), symbol_objects=tuple(used),
        origins={str(s): tuple(origins[s]) for s in used},
        overhead_seconds=executed * hardware.node_overhead_seconds,
        special=basis.matrix(special_rows))
    log.debug("symbolic step: %d steps, %d basis terms, symbols %s", len(labels),
              len(step.basis), dict(step.symbols))
    return step


def _simulate(sim: _SymbolicSimulation, gm: fx.GraphModule, num_fwd_outputs: int):
    """Drive ``sim`` over the joint graph as ``estimate_joint_memory`` does: the forward
    region, then the backward region (nodes tagged ``is_backward`` by AOTAutograd, or
    depending on a tangent), so the timeline is the planner's, step for step."""
    phs = _memory._placeholders(gm)
    tangents = [p for p in phs if _memory._is_tangent(p)]
    backward: set[fx.Node] = set(tangents)
    for node in gm.graph.nodes:  # the regions estimate_joint_memory uses (its doc)
        if node.op != "output" and (node.meta.get("partitioner_tag") == "is_backward" or any(
                i in backward for i in node.all_input_nodes)):
            backward.add(node)
    compute = _memory._compute_nodes(gm)
    outputs = _memory._output_nodes(gm)
    if len(outputs) < num_fwd_outputs:
        raise ValueError(f"joint graph does not return num_fwd_outputs={num_fwd_outputs} "
                         "forward outputs before its gradients")
    sim.add_placeholders([p for p in phs if not _memory._is_tangent(p)], caller_owned=True)
    sim.add_steps("fw", [n for n in compute if n not in backward])
    sim.add_steps("bw", tangents + [n for n in compute if n in backward])
    sim.hold_to_end(outputs)
    return sim.live_exprs()


def _flops(node: fx.Node) -> sympy.Expr:
    cost = node_cost(node)
    outs = tensor_values(node)
    if node.target in _MATMULS and outs:
        operand = node.args[_MATMULS[node.target]].meta["val"]
        return 2 * _numel(outs[0]) * sym(operand.shape[-1])
    if cost.kind in ("matmul", "conv", "attention") and outs:
        # Scaled from the hinted count by the output's size: exact in the batch dimension.
        hinted = max(1, math.prod(size_hint(s) for s in outs[0].shape))
        return sympy.Rational(cost.flops, hinted) * _numel(outs[0])
    if cost.kind == "pointwise":
        return sympy.Add(*[_numel(t) for t in outs])
    if cost.kind == "reduction":
        inputs = [t for n in node.all_input_nodes for t in tensor_values(n)]
        if inputs:
            return _numel(max(inputs, key=lambda t: math.prod(size_hint(s) for s in t.shape)))
    return sympy.Integer(0)


def _special(node: fx.Node, hardware: HardwareProfile) -> sympy.Expr:
    """Seconds of the node's special functions and random draws (``NodeCost``'s
    ``transcendental`` and ``random``), scaled from the hinted counts by its largest
    tensor's size."""
    cost = node_cost(node)
    seconds = ((cost.transcendental / hardware.transcendental_per_second
                if hardware.transcendental_per_second else 0.0)
               + (cost.random / hardware.random_per_second
                  if hardware.random_per_second else 0.0))
    values = [t for n in node.all_input_nodes for t in tensor_values(n)] + tensor_values(node)
    if not seconds or not values:
        return sympy.Integer(0)
    largest = max(values, key=lambda t: math.prod(size_hint(s) for s in t.shape))
    hinted = max(1, math.prod(size_hint(s) for s in largest.shape))
    return sympy.Rational(seconds).limit_denominator(10**15) / hinted * _numel(largest)


def _bytes(node: fx.Node) -> sympy.Expr:
    values = [t for n in node.all_input_nodes for t in tensor_values(n)] + tensor_values(node)
    return sympy.Add(*[_numel(t) * t.element_size() for t in values])


def _hints(gm: fx.GraphModule) -> tuple[dict[sympy.Symbol, int], dict[sympy.Symbol, list[str]]]:
    """Each size symbol of the inputs -> the size it was captured at, and where it is."""
    hints: dict[sympy.Symbol, int] = {}
    origins: dict[sympy.Symbol, list[str]] = {}
    for node in gm.graph.nodes:
        if node.op != "placeholder":
            continue
        val = node.meta.get("val")
        sizes = ([(f"{node.name}[{d}]", s) for d, s in enumerate(val.shape)]
                 if isinstance(val, torch.Tensor) else [(node.name, val)])
        for where, size in sizes:
            if isinstance(size, torch.SymInt):
                expr = sympy.sympify(size.node.expr)
                if isinstance(expr, sympy.Symbol):
                    hints[expr] = size_hint(size)
                    origins.setdefault(expr, []).append(where)
    return hints, origins
