"""diff_snapshots on hand-made snapshots: matching by name, replacement by provenance
(a list, or a single name as a string), changes of inputs, target or shape, and the
corner cases (nothing changed, empty graphs)."""

import pytest

from fxopt.debug.diff import Snapshot, diff_snapshots


def node(name, target="aten.relu.default", inputs="x", shape=(3,), fxopt=None):
    return {"name": name, "op": "call_function", "target": target, "inputs": inputs,
            "uses": [inputs] if inputs else [], "shapes": [list(shape)],
            "dtypes": ["float32"], "bytes": 12, "kernel": True, "live": None, "fxopt": fxopt}


def snapshot(*nodes):
    return Snapshot({"stage": "forward", "pass_name": None}, list(nodes), None)


@pytest.mark.parametrize("replaces", [["a"], "a"])
def test_replacement_by_provenance_list_or_single_name(replaces):
    before = snapshot(node("a"), node("b", inputs="a"))
    after = snapshot(node("c", fxopt={"pass": "p", "replaces": replaces}),
                     node("d", fxopt={"pass": "p", "replaces": replaces}, inputs="c"),
                     node("b", inputs="d"))
    diff = diff_snapshots(before, after)
    assert [n["name"] for n in diff.added] == ["c", "d"]
    assert [n["name"] for n in diff.removed] == ["a"]
    assert [(o["name"], n["inputs"]) for o, n in diff.changed] == [("b", "d")]
    assert diff.replaced_by == {"a": ["c", "d"]} and diff.replaces == {"c": ["a"], "d": ["a"]}


def test_provenance_naming_a_node_still_there_is_not_a_replacement():
    before = snapshot(node("a"))
    after = snapshot(node("a"), node("e", fxopt={"pass": "p", "replaces": ["a", "zz"]}))
    diff = diff_snapshots(before, after)
    assert [n["name"] for n in diff.added] == ["e"] and diff.removed == []
    assert diff.replaced_by == {}


@pytest.mark.parametrize("changed", [{"target": "aten.gelu.default"}, {"shape": (4,)},
                                     {"inputs": "y"}])
def test_same_name_with_another_target_shape_or_inputs_is_changed(changed):
    diff = diff_snapshots(snapshot(node("a")), snapshot(node("a", **changed)))
    assert [o["name"] for o, _ in diff.changed] == ["a"] and not diff.added


@pytest.mark.parametrize("nodes", [(), (node("a"), node("b", inputs="a"))])
def test_identical_graphs_have_an_empty_diff(nodes):
    diff = diff_snapshots(snapshot(*nodes), snapshot(*nodes))
    assert (diff.added, diff.removed, diff.changed, diff.replaced_by) == ([], [], [], {})
