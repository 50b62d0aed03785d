"""tempo="auto": the planner takes tempo's site kinds only where they pay under the budget
(fxopt.planner.search.choose_tempo, fxopt.passes.tempo.auto)."""

import pytest
import torch
from models import MLP, Block

import fxopt
from fxopt.analysis import measure_saved_bytes
from fxopt.config import MemoryBudget
from fxopt.passes.tempo.auto import tempo_variants
from fxopt.planner import Plan, profile_for
from fxopt.planner.search import TEMPO_TIE, choose_tempo, quiet_plan
from fxopt.testing import assert_same_as_eager

HARDWARE = profile_for("cpu")


def _variants(model, x):
    found = {}

    def backend(gm, example_inputs):
        found.update(tempo_variants(gm, example_inputs, HARDWARE))
        return gm.forward

    torch._dynamo.reset()
    torch.compile(model, backend=backend)(x).sum().backward()
    torch._dynamo.reset()
    return found


@pytest.fixture(scope="module")
def block_variants():
    torch.manual_seed(0)
    return _variants(Block(dim=32, dropout=0.1), torch.randn(4, 16, 32))


def test_option_values_are_validated():
    with pytest.raises(TypeError, match="'auto'"):
        fxopt.backend(tempo="sometimes", memory_budget=0.5)
    with pytest.raises(ValueError, match="set memory_budget too"):
        fxopt.backend(tempo="auto")
    assert fxopt.config.resolve({"tempo": "AUTO", "memory_budget": 0.5}).tempo == "auto"


def test_every_subset_of_the_site_kinds_is_a_variant(block_variants):
    assert set(block_variants) == {(), ("attention",), ("layer_norm",),
                                   ("attention", "layer_norm")}
    plain = block_variants[()].activation_bytes
    assert all(p.activation_bytes < plain for k, p in block_variants.items() if k)


def test_the_decision_changes_with_the_budget(block_variants):
    # each variant's lowest peak, as plan_step predicts it (the partitioned step simulated)
    floors = {k: int(quiet_plan(p, MemoryBudget(bytes=1), HARDWARE).predictions["peak_bytes"])
              for k, p in block_variants.items()}
    loose = choose_tempo(block_variants, MemoryBudget(bytes=block_variants[()]
                                                      .keep_all_peak_bytes), HARDWARE)
    tight_bytes = min(floors.values())
    tight = choose_tempo(block_variants, MemoryBudget(bytes=tight_bytes), HARDWARE)
    assert floors[()] > tight_bytes  # without tempo the tight budget is out of reach
    assert loose.chosen.feasible and tight.chosen.feasible
    # the choice changes: other kinds, or (where the loose choice also reaches the tight
    # budget, as ('attention',) does here) the same kinds with recomputes
    assert (tight.chosen.tempo, tight.chosen.plan.actions) != (loose.chosen.tempo,
                                                                loose.chosen.plan.actions)
    assert tight.chosen.tempo  # the budget is below the floor without tempo
    assert floors[tight.chosen.tempo] <= tight_bytes
    # the rule: the fastest feasible candidate, up to the tie margin
    for choice in (loose, tight):
        fastest = min(c.seconds for c in choice.candidates if c.feasible)
        assert choice.chosen.seconds <= fastest * (1 + TEMPO_TIE)
        assert len(choice.candidates) == len(block_variants)


def _plan(feasible, added, reached):
    return Plan(hardware={}, budget_bytes=100, actions={}, solver="test", status="",
                planning_seconds=0.0, feasible=feasible,
                predictions={"peak_bytes": reached, "added_seconds": added})


def test_ties_go_to_fewer_kinds_and_an_unreachable_budget_to_the_closest(block_variants):
    def plans(table):
        return lambda problem: table[next(k for k, p in block_variants.items()
                                          if p is problem)]

    base = block_variants[()].step_seconds
    # every variant predicted as fast as none (up to rounding): a tie
    nearly = {k: _plan(True, base * (1 - (TEMPO_TIE / 4 if k else 0)) - p.step_seconds, 90)
              for k, p in block_variants.items()}
    assert choose_tempo(block_variants, None, HARDWARE, plan=plans(nearly)).chosen.tempo == ()
    faster = {k: _plan(True, base * (1 - (1e-3 if k == ("attention",) else 0))
                       - p.step_seconds, 90) for k, p in block_variants.items()}
    chosen = choose_tempo(block_variants, None, HARDWARE, plan=plans(faster)).chosen
    assert chosen.tempo == ("attention",)
    none_fit = {k: _plan(False, 0.0, 200 - 10 * len(k)) for k in block_variants}
    chosen = choose_tempo(block_variants, None, HARDWARE, plan=plans(none_fit)).chosen
    assert chosen.tempo == ("attention", "layer_norm")


def test_auto_under_a_fraction_meets_it_as_measured_and_says_what_it_took():
    torch.manual_seed(0)
    model, x = Block(dim=32, dropout=0.1), torch.randn(4, 16, 32)
    eager = measure_saved_bytes(lambda: model(x), exclude=[*model.parameters(), x]).bytes
    backend = fxopt.backend(tempo="auto", memory_budget=0.4, strict=True)
    compiled = torch.compile(model, backend=backend)
    compiled(x).sum().backward()
    saved = measure_saved_bytes(lambda: compiled(x), exclude=[*model.parameters(), x]).bytes
    assert saved <= 0.4 * eager * 1.05
    (record,) = backend.graphs[0].pass_records("tempo")
    auto = record.stats["auto"]
    assert sorted(record.verdicts.matched) == sorted(auto["taken"])
    assert auto["taken"] and record.fired
    assert len(auto["candidates"]) == 4 and auto["reason"].startswith("meets the budget")


def test_auto_leaves_tempo_off_where_it_does_not_pay_and_grads_equal_eager():
    torch.manual_seed(0)
    comparison = assert_same_as_eager(MLP(32, 128, 32), (torch.randn(64, 32),),
                                      {"tempo": "auto", "memory_budget": 0.9, "strict": True},
                                      tolerances={torch.float32: (0.0, 0.0)})
    (record,) = [r for r in comparison.passes if r.name == "tempo"]
    assert record.stats["auto"]["taken"] == [] and not record.fired
    assert record.verdicts.reasons() == {"gelu: not taken (tempo='auto')": 1}


def test_explain_shows_the_kinds_taken_and_every_candidate():
    torch.manual_seed(0)
    report = str(fxopt.explain(MLP(32, 128, 32), torch.randn(64, 32),
                               options={"tempo": "auto", "memory_budget": 0.9}))
    assert "tempo='auto' took no site kind: meets the budget" in report
    rows = report[report.index("site kinds"):].splitlines()[1:3]
    assert [r.split()[0] for r in rows] == ["(none)", "gelu"]
    assert all(r.split()[1] == "yes" for r in rows)


def test_a_graph_without_tempo_sites_is_not_searched():
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    comparison = assert_same_as_eager(model, (torch.randn(4, 8),),
                                      {"tempo": "auto", "memory_budget": 0.5},
                                      tolerances={torch.float32: (0.0, 0.0)})
    (record,) = [r for r in comparison.passes if r.name == "tempo"]
    assert record.stats["auto"]["reason"] == "no tempo site in this graph"
    assert record.stats["auto"]["candidates"] == [] and not record.fired
