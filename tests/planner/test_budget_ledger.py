"""A fraction budget is the model's: with a graph break, the graphs share it through the
backend's ledger, and the saved bytes measured over all graphs stay within ``f`` x plain
autograd's over all graphs."""

import pytest
import torch
from torch import nn

import fxopt
from fxopt.analysis import measure_saved_bytes
from fxopt.config import MemoryBudget
from fxopt.planner.ledger import BudgetLedger, split_by_frontiers
from fxopt.planner.solvers.fraction import RecomputeOption, SavedBytesProblem, solve_fraction
from fxopt.testing import assert_same_as_eager

HALF = MemoryBudget(fraction=0.5)


class BrokenMLP(nn.Module):
    """Two MLPs with a data-dependent branch between them: Dynamo compiles two graphs."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.first = nn.Sequential(nn.Linear(48, 192), nn.GELU(), nn.Linear(192, 192),
                                   nn.Tanh(), nn.Linear(192, 48))
        self.second = nn.Sequential(nn.Linear(48, 96), nn.Sigmoid(), nn.Linear(96, 96),
                                    nn.GELU(), nn.Linear(96, 8))

    def forward(self, x):
        h = self.first(x)
        if h.abs().sum() >= 0:  # always true; a tensor's truth value breaks the graph
            h = h * 2
        return self.second(h)


def _saved_bytes(model, x, fn):
    return measure_saved_bytes(fn, exclude=[*model.parameters(), x]).bytes


@pytest.mark.parametrize("fraction", [0.5, 0.3])
def test_graphs_share_one_budget_and_the_model_keeps_within_it(fraction):
    x = torch.randn(64, 48)
    plain_model = BrokenMLP()
    plain = _saved_bytes(plain_model, x, lambda: plain_model(x))
    comparison = assert_same_as_eager(BrokenMLP(), (x,),
                                     {"codegen": "fx", "memory_budget": fraction})
    stats = [r.stats for r in comparison.passes if r.name == "swap_recompute"]
    assert len(stats) == 2 and comparison.fired("swap_recompute")
    first, second = stats
    assert (first["model_graphs"], second["model_graphs"]) == (1, 2)
    # the second graph's share is what the budget leaves after the first graph
    assert second["share_bytes"] == int(fraction * second["model_plain_saved_bytes"]) \
        - first["saved_bytes_after"]
    assert second["model_saved_bytes_after"] <= fraction * second["model_plain_saved_bytes"]

    model = BrokenMLP()
    compiled = torch.compile(model, backend=fxopt.backend(codegen="fx", memory_budget=fraction))
    compiled(x)  # compiles both graphs
    measured = _saved_bytes(model, x, lambda: compiled(x))
    assert measured <= fraction * plain, (measured, plain)


class ConfiguredOnFirstCall(nn.Module):
    """As transformers' classification losses do (``config.problem_type`` set at the first
    call): an attribute the forward reads changes after the first step, so Dynamo compiles
    the same frame again at the second."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.mlp = BrokenMLP().first
        self.problem_type = None

    def forward(self, x):
        if self.problem_type is None:
            self.problem_type = "regression"
        return self.mlp(x)


def _compiled_at_three_tenths(module_class, x):
    """Eager's saved bytes for ``x``, then a fresh ``module_class`` compiled under
    ``memory_budget=0.3`` (fx) after one training step: (plain, model, backend,
    compiled)."""
    eager = module_class()
    plain = _saved_bytes(eager, x, lambda: eager(x))
    model = module_class()
    backend = fxopt.backend(codegen="fx", memory_budget=0.3)
    compiled = torch.compile(model, backend=backend)
    compiled(x).sum().backward()
    return plain, model, backend, compiled


def _shares(backend):
    """The swap_recompute stats of each graph planned within a share of the budget."""
    return [r.stats for g in backend.graphs for r in g.pass_records("swap_recompute")
            if "share_bytes" in r.stats]


def test_a_recompiled_graph_takes_its_earlier_compiles_share_not_a_second_one():
    x = torch.randn(64, 48)
    plain, model, backend, compiled = _compiled_at_three_tenths(ConfiguredOnFirstCall, x)
    measured = _saved_bytes(model, x, lambda: compiled(x))  # the second compiles it again
    first, second = _shares(backend)
    assert second["share_bytes"] == first["share_bytes"]
    assert second["model_plain_saved_bytes"] == first["plain_saved_bytes"]
    assert measured <= 0.3 * plain


def test_what_an_earlier_graph_leaves_unused_is_the_next_graphs():
    ledger = BudgetLedger()
    assert ledger.share_for(HALF, 1000) == 500
    ledger.record("g0", 1000, 500, 300)        # kept 200 bytes less than its share
    assert ledger.share_for(HALF, 1000) == 700  # 0.5 x 2000 - 300
    ledger.record("g1", 1000, 700, 900)        # above its share (its floor)
    assert ledger.share_for(HALF, 400) == 0     # 0.5 x 2400 - 1200: nothing left
    assert (ledger.plain_bytes, ledger.kept_bytes) == (2000, 1200)


def test_explain_shows_each_graphs_share_of_the_models_budget():
    report = fxopt.explain(BrokenMLP(), torch.randn(64, 48), options={"codegen": "fx",
                                                                      "memory_budget": 0.5})
    text = str(report)
    assert text.count("of the model's budget, graph") == 2, text
    assert "graph 1: the model keeps" in text and "graph 2: the model keeps" in text


def _one_tensor_graph(name, seconds):
    """A graph with one 100-byte saved tensor whose recompute costs ``seconds``."""
    return SavedBytesProblem({name: 100}, (), (RecomputeOption(name, (name,), (f"n{name}",)),),
                             {f"n{name}": seconds})


def test_split_by_frontiers_gives_the_bytes_where_they_save_the_most_time():
    costly, cheap = _one_tensor_graph("a", 10.0), _one_tensor_graph("b", 1.0)
    # compiled one at a time, the first graph gets half of its own and must recompute
    ledger = BudgetLedger()
    first = solve_fraction(costly, ledger.share_for(HALF, costly.plain_bytes))
    assert first.recompute == ("a",) and first.added_seconds == 10.0
    # known together, the budget's 100 bytes go to the costly graph: 1 s instead of 10 s
    assert split_by_frontiers([costly, cheap], HALF) == [100, 0]
    assert split_by_frontiers([cheap, costly], HALF) == [0, 100]
    assert split_by_frontiers([costly, cheap], MemoryBudget(fraction=0.0)) == [0, 0]  # the floors
    assert split_by_frontiers([costly, cheap], MemoryBudget(fraction=1.0)) == [100, 100]


def test_a_graph_whose_floor_misses_its_share_gets_room_from_earlier_graphs():
    """Where the floors of all graphs fit the budget, the earlier graphs are given smaller
    shares (planned again at their next call) and the late graph gets its floor."""
    ledger = BudgetLedger(replans=True)
    ledger.record("g0", 1000, 500, 500, floor_bytes=100)
    ledger.record("g1", 1000, 500, 400, floor_bytes=300)
    # g2: plain 1000, floor 800; 0.5 x 3000 - 900 = 600 left: 200 short
    assert ledger.share_for(HALF, 1000) == 600
    assert ledger.rebalance(HALF, 1000, 800) == 800
    assert ledger.replan_shares == {0: 300}  # the first graph gives the 200 bytes back
    ledger.record("g2", 1000, 800, 800, floor_bytes=800)
    ledger.replanning = 0  # what Replannable does at g0's next call
    assert ledger.share_for(HALF, 1000) == 300
    assert ledger.record("g0", 1000, 300, 250, floor_bytes=100) == 0
    ledger.replanning = None
    assert ledger.replan_shares == {} and ledger.kept_bytes == 250 + 400 + 800 <= 1500
    # floors above the budget: no share (strict raises, as for one graph); the earlier
    # graphs go to their floors, the model's floor's plan
    assert ledger.rebalance(HALF, 1000, 1900) is None
    assert ledger.replan_shares == {0: 100, 1: 300}
    assert BudgetLedger().rebalance(HALF, 1000, 800) is None  # fxopt plan's: cannot replan


class ConfiguredAfterABreak(nn.Module):
    """:class:`BrokenMLP` whose second graph reads an attribute its first call sets (a
    classification loss after a graph break): Dynamo compiles the second frame again at
    the second training step, and not the first."""

    def __init__(self):
        super().__init__()
        self.mlp = BrokenMLP()
        self.problem_type = None

    def forward(self, x):
        h = self.mlp.first(x)
        if h.abs().sum() >= 0:  # always true; a tensor's truth value breaks the graph
            h = h * 2
        if self.problem_type is None:
            self.problem_type = "regression"
        return self.mlp.second(h)


def test_an_evaluation_without_gradients_leaves_the_training_graphs_shares():
    """A validation pass under ``torch.no_grad`` compiles every frame again for inference;
    those graphs keep nothing for a backward and never run in a training step, so the
    training graphs' entries stay, and a training recompile after it is held to the
    same share as before (an eval's compile used to clear them: the recompile's share
    left out the first graph)."""
    x = torch.randn(64, 48)  # the first step compiles both frames for training
    plain, model, backend, compiled = _compiled_at_three_tenths(ConfiguredAfterABreak, x)
    trained = [(s.plain_bytes, s.kept_bytes) for s in backend.budget_ledger.shares]
    with torch.no_grad():
        compiled(x)  # compiles both frames again, for inference
    assert [(s.plain_bytes, s.kept_bytes) for s in backend.budget_ledger.shares] == trained
    measured = _saved_bytes(model, x, lambda: compiled(x))  # the second frame recompiles
    _, before, after = _shares(backend)
    assert after["share_bytes"] == before["share_bytes"] and after["model_graphs"] == 2
    assert measured <= 0.3 * plain, (measured, plain)
