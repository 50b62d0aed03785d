"""fxopt.explain: the report object and its table."""

import json

import torch
from models import MLP, ConvNet
from test_compiler import WithGraphBreak

import fxopt


def test_report_lists_graphs_passes_and_memory():
    model = MLP()
    name = "fuse_rnn"  # asked for, but an MLP has no recurrent cell: runs, changes nothing
    report = fxopt.explain(model, torch.randn(4, 13), options={name: True})
    assert report.ran_backward and len(report.graphs) == 1
    names = [r.name for r in report.passes]
    assert names == ["noop_dropout", "tempo", "fuse_rnn", "recompute_rnn", "library_rnn",
                     "reshape_lstm_states", "fuse_linear_cross_entropy", "swap_recompute",
                     "fuse_linear_cross_entropy_chunks", "fuse_elementwise",
                     "swap_prefetch", "fuse_linear_cross_entropy_chunks", "fuse_elementwise",
                     "offload_optimizer"]
    record = next(r for r in report.passes if r.name == name)
    assert record.status == "unchanged" and record.reason == "on (option)"
    assert not report.fired(name)
    graph = report.graphs[0]
    assert graph.memory["autograd"].peak_bytes > 0 and graph.memory["fxopt"].peak_bytes > 0
    # two Linear layers, batch 4: 2*4*13*37 + 2*4*37*5 matmul FLOPs, plus pointwise work
    assert graph.cost["forward"].by_kind()["matmul"].flops == 2 * 4 * 13 * 37 + 2 * 4 * 37 * 5
    assert graph.cost["backward"].flops > graph.cost["forward"].flops
    text = str(report)
    for words in ("fxopt explain: 1 graph(s), 0 graph break(s), forward+backward",
                  f"options: {{'{name}': True}}", "predicted memory, plain autograd: peak",
                  "activations kept for backward", "pre_autograd", "unchanged",
                  "cost: forward", "MFLOP"):
        assert words in text, words
    # every pass's name stands apart from its status, the longest one's too
    assert all(f" {r.name}  " in text for r in report.passes)
    json.dumps(report.to_dict())  # plain data


def test_report_shows_graph_breaks_with_reasons():
    report = fxopt.explain(WithGraphBreak(), torch.randn(2, 11))
    assert len(report.graphs) == 2
    assert sum(b.count for b in report.graph_breaks) >= 1
    assert any("graph_break" in b.reason.lower() or "graph break" in b.reason.lower()
               for b in report.graph_breaks)
    assert "graph break" in str(report)


def test_explain_leaves_grads_and_buffers_as_they_were():
    model = ConvNet().train()
    before = {n: b.clone() for n, b in model.named_buffers()}
    fxopt.explain(model, torch.randn(2, 3, 8, 8))
    assert all(p.grad is None for p in model.parameters())
    for name, buffer in model.named_buffers():
        torch.testing.assert_close(buffer, before[name], rtol=0, atol=0)


def test_inference_only_output():
    report = fxopt.explain(MLP().eval(), torch.randn(2, 13).requires_grad_(False))
    # parameters require grad, so the step still has a backward
    assert report.ran_backward
    with torch.no_grad():
        report = fxopt.explain(MLP(), torch.randn(2, 13))
    assert not report.ran_backward and "forward only" in str(report)
    assert "inference" in report.graphs[0].graphs


def test_plain_autograd_baseline_is_the_graph_without_pre_autograd_passes():
    from models import Block

    torch.manual_seed(0)
    model, x = Block(), torch.randn(2, 8, 32)
    with_tempo = fxopt.explain(model, x, options={"tempo": True})
    without = fxopt.explain(model, x, options={"tempo": False})
    assert with_tempo.fired("tempo") and not without.fired("tempo")
    plain, tempo = with_tempo.graphs[0].memory["autograd"], with_tempo.graphs[0].memory["fxopt"]
    # the baseline is what the run without tempo predicts, not tempo's own result
    assert plain == without.graphs[0].memory["autograd"]
    assert not any("tempo" in node for node, _ in plain.timeline)
    assert any("tempo" in node for node, _ in tempo.timeline)


def test_no_graph_because_of_an_lstm_says_why_and_what_to_set():
    from fxopt import _compat

    assert not _compat.dynamo_traces_rnn()  # the default this test is about
    report = fxopt.explain(torch.nn.LSTM(5, 7), torch.randn(3, 2, 5),
                           options={"fuse_rnn": True})
    assert report.graphs == []
    text = str(report)
    assert "Dynamo captured no graph, so fxopt compiled nothing" in text
    assert "torch._dynamo.config.allow_rnn = True" in text
    assert "fuse_rnn=True has no effect" in text
    assert report.to_dict()["notes"] == report.notes


def test_an_untraced_lstm_under_a_budget_says_the_budget_misses_it():
    from fxopt import _compat

    assert not _compat.dynamo_traces_rnn()  # the default this test is about
    report = fxopt.explain(torch.nn.LSTM(5, 7), torch.randn(3, 2, 5),
                           options={"memory_budget": 0.5})
    assert any("memory_budget does not bound what it saves" in note for note in report.notes)
    assert "fuse_rnn=True" not in str(report)


def test_no_graph_without_tensor_work_says_so():
    report = fxopt.explain(lambda x: x, torch.randn(3))
    assert report.graphs == [] and len(report.notes) == 1
    assert "ran no tensor operation Dynamo could capture" in str(report)
