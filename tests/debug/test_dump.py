"""The debug_dir dump: per-stage and per-pass graph dumps with their plain-data twins,
plans, runnable repros and index.json; a failure to dump never reaches training."""

import json
import logging
import runpy
import sys

import torch
from debug_passes import SPLIT_ADDMM, spec
from models import MLP

from fxopt.analysis.shapes import nbytes
from fxopt.debug.snapshot import target_name
from fxopt.passes import PassResult, Stage
from fxopt.testing import assert_same_as_eager, extra_passes


def entries(root):
    return json.loads((root / "index.json").read_text())["files"]


def test_test_pass_keeps_results_and_its_dump_records_provenance(tmp_path):
    with extra_passes(SPLIT_ADDMM):
        comparison = assert_same_as_eager(MLP(), (torch.randn(3, 13),),
                                          {"debug_dir": str(tmp_path)})
    assert comparison.fired("split_addmm")
    (entry,) = [e for e in entries(tmp_path) if e["pass_name"] == "split_addmm"]
    snapshot = json.loads((tmp_path / entry["data"]).read_text())
    forward = comparison.graphs[0].graphs["forward"]
    assert [n["name"] for n in snapshot["nodes"]] == [n.name for n in forward.graph.nodes]
    by_name = {n["name"]: n for n in snapshot["nodes"]}
    for node in forward.graph.nodes:
        data = by_name[node.name]
        assert data["target"] == target_name(node) and data["op"] == node.op
        assert data["fxopt"] == node.meta.get("fxopt")
        if node.op == "call_function":
            value = node.meta["val"]
            assert data["shapes"] == [list(value.shape)]
            assert data["dtypes"] == [str(value.dtype).removeprefix("torch.")]
            assert data["bytes"] == (0 if node.target == torch.ops.aten.t.default
                                     else nbytes(value))
    new = [n for n in snapshot["nodes"] if n["fxopt"]]
    assert {n["target"] for n in new} == {"aten.mm.default", "aten.add.Tensor"}
    record = next(r for r in comparison.passes if r.name == "split_addmm")
    memory = snapshot["memory"]
    assert memory["peak_bytes"] == record.memory_after.peak_bytes == entry["memory"][
        "peak_bytes"]
    assert memory["timeline"] == [list(t) for t in record.memory_after.timeline]
    live = dict(record.memory_after.timeline)
    assert all(n["live"] == live[f"fw:{n['name']}"] for n in new)


def test_index_lists_every_file_in_pipeline_order_with_plan_and_repros(mlp_dump):
    files = entries(mlp_dump.root)
    stems = [e["stem"].split("/", 1)[1] for e in files]
    assert stems == ["00_pre_autograd_dynamo_input", "01_joint_joint_input",
                     "02_joint_joint_plans_only", "03_forward_forward_input",
                     "04_forward_forward_split_addmm", "05_backward_backward_input"]
    plan_entry = files[2]
    assert plan_entry["file"] is None and plan_entry["status"] == "unchanged"
    plan = json.loads((mlp_dump.root / plan_entry["plan"]).read_text())
    assert plan_entry["plan"].endswith("02_joint_joint_plans_only.plan.json")
    assert plan["keep"][0] == "primals_1" and plan["sizes"]["primals_3"] == [3, 13]
    changed = files[4]
    assert changed["status"] == "changed" and changed["plan"] == changed["stem"] + ".plan.json"
    assert json.loads((mlp_dump.root / changed["plan"]).read_text()) == {
        "split": ["addmm", "addmm_1"]}
    for entry in files:
        for key in ("file", "data", "repro"):
            if entry.get(key):
                assert (mlp_dump.root / entry[key]).is_file()
    graph = files[0]["graph"]
    assert [e.get("repro") for e in files if e["status"] == "input"] == [
        f"{graph}/repro_{kind}.py" for kind in ("dynamo", "joint", "forward", "backward")]


def test_repro_runs_the_captured_graph_with_random_inputs(mlp_dump, capsys, monkeypatch):
    graph = entries(mlp_dump.root)[0]["graph"]
    backward = mlp_dump.backend.graphs[0].graphs["backward"]
    script = mlp_dump.root / graph / "repro_backward.py"
    monkeypatch.setattr(sys, "argv", [str(script)])
    runpy.run_path(str(script), run_name="__main__")
    lines = capsys.readouterr().out.splitlines()
    outputs = next(iter(backward.graph.find_nodes(op="output"))).args[0]
    assert len(lines) == len(outputs)
    assert lines[0] == "output 0: float32[37, 13]"


def test_unserialisable_plan_is_logged_and_the_graphs_still_dumped(tmp_path, caplog):
    def bad_plan(gm, ctx):
        return PassResult(gm, False, stats={"plan": {"solver": object()}})

    with extra_passes(spec(bad_plan, Stage.JOINT), SPLIT_ADDMM), caplog.at_level(
            logging.WARNING):
        comparison = assert_same_as_eager(MLP(), (torch.randn(2, 13),),
                                          {"debug_dir": str(tmp_path)})
    assert comparison.fired("split_addmm")
    assert "the plan of pass bad_plan on g" in caplog.text and "not JSON-serialisable" in (
        caplog.text)
    assert [(e["kind"], e["pass_name"]) for e in entries(tmp_path)] == [
        ("dynamo", None), ("joint", None), ("forward", None), ("forward", "split_addmm"),
        ("backward", None)]


def test_unwritable_dir_is_logged_and_training_goes_on(tmp_path, caplog):
    blocked = tmp_path / "a_file"
    blocked.write_text("a file where the dump wants a folder")
    with extra_passes(SPLIT_ADDMM), caplog.at_level(logging.WARNING):
        comparison = assert_same_as_eager(MLP(), (torch.randn(2, 13),),
                                          {"debug_dir": str(blocked)})
    assert comparison.fired("split_addmm")
    warned = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warned) == 1, [r.getMessage() for r in warned]  # one per compile, not per file
    assert f"cannot write the debug dump to {blocked}" in warned[0].getMessage()
    assert warned[0].exc_info is None  # no traceback


def test_an_earlier_runs_index_is_replaced(tmp_path):
    stale = [{"file": "g0/00_pre_autograd_dynamo_input.py"},  # the foundation's format
             {"stem": "g7/03_forward_forward_gone", "graph": "g7", "data": "g7/gone.json"}]
    (tmp_path / "index.json").write_text(json.dumps({"files": stale}))
    torch.compile(MLP(), backend="fxopt", options={"debug_dir": str(tmp_path)})(
        torch.randn(2, 13)).sum().backward()
    assert [e["kind"] for e in entries(tmp_path)] == ["dynamo", "joint", "forward",
                                                     "backward"]


def test_environment_variable_sets_the_debug_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("FXOPT_DEBUG_DIR", str(tmp_path / "from_env"))
    compiled = torch.compile(MLP(), backend="fxopt")
    compiled(torch.randn(2, 13)).sum().backward()
    assert len(entries(tmp_path / "from_env")) == 4


def test_pre_autograd_nodes_have_shapes_and_bytes(mlp_dump):
    (entry,) = [e for e in entries(mlp_dump.root) if e["kind"] == "dynamo"]
    nodes = json.loads((mlp_dump.root / entry["data"]).read_text())["nodes"]
    dynamo = mlp_dump.backend.graphs[0].graphs["dynamo"]
    for node, data in zip(dynamo.graph.nodes, nodes):
        if node.op in ("placeholder", "call_function", "call_module", "call_method"):
            value = node.meta["example_value"]
            assert data["shapes"] == [list(value.shape)], data
            assert data["dtypes"] == ["float32"] and data["bytes"] == nbytes(value) > 0


def test_graph_numbers_restart_in_each_dump(tmp_path):
    for name in ("first", "second"):
        torch.compile(MLP(), backend="fxopt", options={"debug_dir": str(tmp_path / name)})(
            torch.randn(2, 13)).sum().backward()
    second = entries(tmp_path / "second")
    assert {e["graph"] for e in second} == {"g0"}
    assert all(e["stem"].startswith("g0/") for e in second)
    assert (tmp_path / "second" / "g0").is_dir()
    # the compiler's own (process-wide) name stays findable, as explain shows it
    assert {e["compiled_as"] for e in second} != {e["compiled_as"] for e in
                                                   entries(tmp_path / "first")}
