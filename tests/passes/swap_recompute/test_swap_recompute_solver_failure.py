"""A planner solver that raises (scipy's milp) does not skip swap_recompute: the greedy
solver answers with one warning; under strict the failure is raised. The MILP decides byte
budgets (a fraction has its own search, which needs no scipy): deep_mlp's step at batch 64
peaks at about 165 KB with everything kept, so 150 KB needs recomputation."""

import pytest
import scipy.optimize
import torch

import fxopt
from fxopt.pipeline import PassFailure
from fxopt.testing import assert_same_as_eager
from tests.models import deep_mlp


@pytest.fixture
def milp_raises(monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("HiGHS crashed")

    monkeypatch.setattr(scipy.optimize, "milp", broken)


def test_a_raising_solver_falls_back_to_the_greedy_with_a_warning(milp_raises):
    with pytest.warns(UserWarning, match="solver failed on .*RuntimeError: HiGHS crashed.*"
                                         "greedy solver") as caught:
        comparison = assert_same_as_eager(deep_mlp(), (torch.randn(64, 48),),
                                          {"memory_budget": 150_000})
    assert len([w for w in caught if "solver failed" in str(w.message)]) == 1
    (record,) = [r for r in comparison.passes if r.name == "swap_recompute"]
    assert comparison.fired("swap_recompute") and record.stats["solver"] == "greedy"
    assert record.verdicts.matched["recompute"].count > 0 and record.stats["feasible"]


def test_a_raising_solver_raises_under_strict(milp_raises):
    compiled = torch.compile(deep_mlp(), backend=fxopt.backend(memory_budget=150_000,
                                                                   strict=True))
    try:
        compiled(torch.randn(64, 48)).sum().backward()
    except Exception as error:  # noqa: BLE001 - Dynamo wraps the backend's error; see below
        chain = []
        while error is not None:
            chain.append(error)
            error = error.__cause__ or error.__context__
    else:
        pytest.fail("strict did not raise")
    assert any(isinstance(e, PassFailure) and "swap_recompute" in str(e) for e in chain)
    assert any(isinstance(e, RuntimeError) and "HiGHS crashed" in str(e) for e in chain)
