"""`fxopt diff`: the nodes it reports added, removed, replaced and changed are the true
diff of each pass's input and output graphs; summaries, filters, exit codes, colours,
unified diffs and the comparison of two dumps."""

import json
import subprocess
import sys

import torch
from debug_passes import true_diff

from fxopt.__main__ import main
from fxopt.units import format_bytes


def run(capsys, *argv):
    status = main(["diff", *map(str, argv)])
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def marked(out, mark):
    """Node names on the lines that start with ``mark`` (+, -, ~)."""
    return {line.split()[1] for line in out.splitlines()
            if line.lstrip().startswith(mark + " ")}


def test_reports_exactly_the_nodes_each_pass_added_removed_and_changed(mlp_dump, capsys):
    ((record, before, after),) = mlp_dump.recorder.changes
    added, removed, changed = true_diff(before, after)
    status, out, err = run(capsys, mlp_dump.root)
    assert status == 0 and err == ""
    assert (marked(out, "+"), marked(out, "-"), marked(out, "~")) == (added, removed, changed)
    assert removed == {"addmm", "addmm_1"}
    for old in removed:
        line = next(line for line in out.splitlines() if line.split()[:2] == ["-", old])
        replacing = {n.name for n in after.graph.nodes
                     if old in (n.meta.get("fxopt") or {}).get("replaces", ())}
        assert line.endswith("replaced by " + ", ".join(
            n.name for n in after.graph.nodes if n.name in replacing))
    for new in added:
        line = next(line for line in out.splitlines() if line.split()[:2] == ["+", new])
        assert "by split_addmm, replaces addmm" in line
        assert "float32[3, " in line
    assert f"{mlp_dump.dumped(record.graph)} (stage forward)" in out
    # the graph's outputs now name each addmm's replacement, the add at the end of it
    output_line = next(line for line in out.splitlines() if line.split()[:2] == ["~", "output"])
    swaps = {f"{node.meta['fxopt']['replaces'][0]} -> {node.name}" for node in after.graph.nodes
             if node.target is torch.ops.aten.add.Tensor and "fxopt" in node.meta}
    assert set(output_line.split("inputs ", 1)[1].split(", ")) == swaps


def test_stat_prints_one_summary_per_pass_with_nodes_kernels_and_memory(mlp_dump, capsys):
    ((record, before, after),) = mlp_dump.recorder.changes
    added, removed, changed = true_diff(before, after)
    status, out, _ = run(capsys, mlp_dump.root, "--stat")
    assert status == 0
    lines = out.splitlines()
    assert lines[0] == f"{mlp_dump.dumped(record.graph)} (stage forward)"
    assert lines[1] == (
        f"  split_addmm: nodes {record.nodes_before} -> {record.nodes_after} "
        f"(+{len(added)} -{len(removed)} ~{len(changed)}), kernels 3 -> 5, activations "
        f"{format_bytes(record.memory_before.activation_bytes)} -> "
        f"{format_bytes(record.memory_after.activation_bytes)}, peak "
        f"{format_bytes(record.memory_before.peak_bytes)} -> "
        f"{format_bytes(record.memory_after.peak_bytes)}, plan "
        f"{mlp_dump.dumped(record.graph).split('/')[0]}"
        "/04_forward_forward_split_addmm.plan.json")
    assert lines[2] == "  matched addmm=2"  # the pass's verdicts, from the dump's index
    assert len(lines) == 3


def test_graph_and_pass_filters(mlp_dump, capsys):
    graph = mlp_dump.dumped(mlp_dump.recorder.changes[0][0].graph)  # g0/forward
    assert run(capsys, mlp_dump.root, "--graph", graph, "--pass", "split_addmm")[1] == run(
        capsys, mlp_dump.root)[1]
    status, out, _ = run(capsys, mlp_dump.root, "--graph", graph.replace("forward", "backward"))
    assert status == 0 and out == ""
    status, _, err = run(capsys, mlp_dump.root, "--pass", "tempo")
    assert status == 2 and "pass 'tempo' changed no graph" in err and "split_addmm" in err
    status, _, err = run(capsys, mlp_dump.root, "--graph", "g999")
    assert status == 2 and "no graph 'g999'" in err


def test_a_dump_no_pass_changed_says_so(plain_dump, capsys):
    status, out, _ = run(capsys, plain_dump.root)
    assert status == 0
    assert out.strip().endswith("no pass changed its graphs (dynamo 9 nodes, joint 27 nodes, "
                                "forward 11 nodes, backward 21 nodes)")


def test_missing_or_malformed_dump_exits_2_with_a_message(tmp_path, capsys):
    status, out, err = run(capsys, tmp_path / "nowhere")
    assert (status, out) == (2, "") and "no such directory" in err
    status, _, err = run(capsys, tmp_path)
    assert status == 2 and "no index.json; not an fxopt debug dump" in err
    (tmp_path / "index.json").write_text("{not json")
    status, _, err = run(capsys, tmp_path)
    assert status == 2 and "malformed index" in err
    (tmp_path / "index.json").write_text(json.dumps({"files": [{"data": "g0/x.json"}]}))
    status, _, err = run(capsys, tmp_path)
    assert status == 2 and "malformed index (entries without ['file', 'graph', 'kind'" in err


def test_unwritable_html_exits_2(mlp_dump, tmp_path, capsys):
    status, _, err = run(capsys, mlp_dump.root, "--html", tmp_path / "no" / "such" / "x.html")
    assert status == 2 and err.startswith("fxopt diff: ") and "No such file" in err


def test_missing_snapshot_exits_2(mlp_dump, tmp_path, capsys):
    index = json.loads((mlp_dump.root / "index.json").read_text())
    (tmp_path / "index.json").write_text(json.dumps(index))
    status, _, err = run(capsys, tmp_path)
    assert status == 2 and "not a readable graph snapshot" in err


def test_colours_only_when_asked_or_on_a_terminal(mlp_dump, capsys):
    _, plain, _ = run(capsys, mlp_dump.root)
    _, coloured, _ = run(capsys, mlp_dump.root, "--color", "always")
    assert "\033[" not in plain
    assert "\033[31m    - addmm " in coloured and "\033[32m    + " in coloured


def test_unified_diff_of_the_readable_dumps(mlp_dump, capsys):
    status, out, _ = run(capsys, mlp_dump.root, "--unified")
    assert status == 0
    lines = out.splitlines()
    assert lines[0].startswith("--- ") and lines[0].endswith("_forward_forward_input.py")
    assert lines[1].endswith("_forward_forward_split_addmm.py")
    assert any(line.startswith("-") and "torch.ops.aten.addmm.default" in line
               for line in lines)
    assert any(line.startswith("+") and "torch.ops.aten.mm.default" in line for line in lines)


def test_two_dumps_compare_final_graphs_graph_by_graph(mlp_dump, plain_dump, capsys):
    ((_, before, after),) = mlp_dump.recorder.changes
    added, removed, _ = true_diff(before, after)
    status, out, _ = run(capsys, plain_dump.root, mlp_dump.root)
    assert status == 0
    assert (marked(out, "+"), marked(out, "-")) == (added, removed)
    lines = out.splitlines()
    assert lines[:2] == [f"A: {plain_dump.root}", f"B: {mlp_dump.root}"]
    headings = [line.split()[0].split("/")[1] for line in lines[2:] if line[0] != " "]
    assert headings == ["dynamo", "joint", "forward", "backward"]
    summaries = [line for line in lines if line.startswith("  ") and " vs " in line]
    unchanged = [s for s in summaries if "(+0 -0 ~0)" in s]
    assert len(summaries) == 4 and len(unchanged) == 3
    status, _, err = run(capsys, plain_dump.root, mlp_dump.root, "--pass", "split_addmm")
    assert status == 2 and "--pass applies to one dump" in err


def test_two_dumps_with_different_graph_counts_say_which_were_compared(
        mlp_dump, plain_dump, tmp_path, capsys):
    index = json.loads((plain_dump.root / "index.json").read_text())
    extra = [{**e, "graph": "g99"} for e in index["files"]]
    (tmp_path / "index.json").write_text(json.dumps({"files": index["files"] + extra}))
    for entry in index["files"]:
        for key in ("file", "data"):
            target = tmp_path / entry[key]
            target.parent.mkdir(exist_ok=True)
            target.write_bytes((plain_dump.root / entry[key]).read_bytes())
    status, out, _ = run(capsys, tmp_path, mlp_dump.root, "--stat")
    assert status == 0
    assert out.splitlines()[-1] == ("A has 2 graphs, B has 1: compared the first 1 in "
                                    "capture order (a graph break differs?)")


def test_python_dash_m_fxopt_diff(mlp_dump):
    result = subprocess.run([sys.executable, "-m", "fxopt", "diff", str(mlp_dump.root),
                             "--stat"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and "split_addmm: nodes" in result.stdout


def test_a_graph_that_is_not_there_exits_2_listing_the_graphs(mlp_dump, plain_dump, capsys):
    for dirs in ([mlp_dump.root], [plain_dump.root, mlp_dump.root]):
        status, out, err = run(capsys, *dirs, "--graph", "g7")
        assert (status, out) == (2, "")
        assert "no graph 'g7'" in err and "graphs: g0, g0/backward, g0/dynamo" in err


def test_a_folder_holding_dumps_lists_them(mlp_dump, plain_dump, tmp_path, capsys):
    for name, dumped in (("run1", mlp_dump), ("nested/run2", plain_dump)):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).symlink_to(dumped.root, target_is_directory=True)
    status, _, err = run(capsys, tmp_path)
    assert status == 2
    assert "not a debug dump itself, but it holds 2: nested/run2, run1" in err


def test_a_reader_that_stops_early_gets_no_traceback(mlp_dump):
    process = subprocess.Popen([sys.executable, "-m", "fxopt", "diff", str(mlp_dump.root)],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    process.stdout.close()  # as `| head` does once it has its lines
    _, err = process.communicate(timeout=120)
    assert process.returncode == 0 and err.decode() == ""
