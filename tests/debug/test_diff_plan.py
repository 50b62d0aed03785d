"""``fxopt diff`` of one dump shows what swap_recompute did: it only tags nodes for the
partitioner, so the diff reports the tagged nodes, the saved tensors recomputed and kept
(from the plan file), and the predicted saved bytes and peak before and after (the
partitioned step's prediction)."""

import json

import pytest
import torch
from models import Block

from fxopt.__main__ import main
from fxopt.compiler import Backend
from fxopt.debug.diff import Snapshot, diff_snapshots, load_dump, pass_steps


@pytest.fixture(scope="module")
def budget_dump(tmp_path_factory):
    root = tmp_path_factory.mktemp("budget")
    torch.manual_seed(0)
    backend = Backend({"debug_dir": str(root), "codegen": "fx", "memory_budget": 0.5,
                       "strict": True})
    torch.compile(Block(), backend=backend)(torch.randn(2, 7, 32)).sum().backward()
    torch._dynamo.reset()
    (record,) = [r for g in backend.graphs for r in g.pass_records("swap_recompute")]
    assert record.status == "changed"  # the pass fired
    return root, record


def test_the_plan_and_the_tagged_nodes_are_reported(budget_dump):
    root, record = budget_dump
    (step,) = pass_steps(load_dump(root), pass_name="swap_recompute")
    tagged = {new["name"] for _, new in step.diff.annotated}
    assert tagged and all(new["fxopt"]["swap_recompute"] == "recompute"
                          for _, new in step.diff.annotated)
    assert (step.diff.added, step.diff.removed, step.diff.changed) == ([], [], [])
    plan = step.plan
    rows = record.stats["plan"]["extra"]["tensors"]
    assert plan.tensors == [(r["action"], r["tensor"], r["bytes"]) for r in rows]
    assert plan.count("recompute") > 0 and plan.count("keep") > 0
    # before: keep-all (the joint graph); after: the partition the tags produce
    assert plan.saved_before == record.stats["plain_saved_bytes"]
    assert plan.saved_after == record.stats["saved_bytes_after"] < plan.saved_before
    assert plan.peak_before is not None and plan.peak_after is not None


def test_the_cli_prints_the_plan_summary_and_one_line_per_saved_tensor(budget_dump, capsys):
    root, record = budget_dump
    assert main(["diff", str(root)]) == 0
    out = capsys.readouterr().out
    rows = record.stats["plan"]["extra"]["tensors"]
    counts = {a: sum(r["action"] == a for r in rows) for a in ("recompute", "swap", "keep")}
    assert (f"plan: recompute {counts['recompute']}, swap {counts['swap']}, keep "
            f"{counts['keep']} saved tensors; predicted saved") in out
    assert "+0 -0 ~0" in out and " tagged)" in out
    for row in rows:
        assert any(line.split()[:2] == [row["action"], row["tensor"]]
                   for line in out.splitlines())
    # the plan file the summary points to is the one the pass recorded
    plan_file = next(line.rsplit("plan ", 1)[1] for line in out.splitlines()
                     if "swap_recompute:" in line)
    assert json.loads((root / plan_file).read_text())["actions"] == \
        record.stats["plan"]["actions"]


def test_an_annotation_change_alone_is_reported_as_annotated_not_changed():
    def node(fxopt):
        return {"name": "a", "op": "call_function", "target": "aten.gelu.default",
                "inputs": "x", "uses": ["x"], "shapes": [[3]], "dtypes": ["float32"],
                "fxopt": fxopt}

    def snapshot(*nodes):
        return Snapshot({"stage": "joint", "pass_name": None}, list(nodes), None)

    diff = diff_snapshots(snapshot(node(None)),
                          snapshot(node({"swap_recompute": "recompute"})))
    assert diff.changed == [] and [new["name"] for _, new in diff.annotated] == ["a"]
    assert diff_snapshots(snapshot(node(None)), snapshot(node(None))).annotated == []
