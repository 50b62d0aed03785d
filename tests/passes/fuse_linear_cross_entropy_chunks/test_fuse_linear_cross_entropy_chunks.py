"""fuse_linear_cross_entropy_chunks: each fused loss op gets the fewest pieces whose step
stays within the bound (the default's peak, or a byte budget), the step's measured peak
agrees, and the loss and gradients stay eager's.

Small LM heads (fp32, fx code generation, one under Inductor): a wide MLP before the head
whose backward sets the step's peak (room for fewer pieces), or a bare head whose loss sets
it (none). The pass sizes pieces only where larger ones pay (CUDA's Triton path); the
decision and its bytes are the same on any device, so these tests take it on the CPU
(``larger_pieces_pay`` patched), but the one that checks the CPU's own refusal and the
``gpu`` one, which checks CUDA's measured peak.
"""

import importlib

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import fxopt
from fxopt.analysis.workspace import workspace_bytes
from fxopt.testing import assert_same_as_eager

# the module (the package's attribute of that name is the pass function)
chunks_pass = importlib.import_module("fxopt.passes.fuse_linear_cross_entropy_chunks")

PASS = "fuse_linear_cross_entropy_chunks"
FUSED = {"fuse_linear_cross_entropy": True, "codegen": "fx"}
DEFAULT_PIECES = {PASS: 0}  # rewrite_limit: the ops keep their default pieces


@pytest.fixture(autouse=True)
def larger_pieces_pay_here(request, monkeypatch):
    if "cpus_own" not in request.node.name and "gpu" not in request.node.keywords:
        monkeypatch.setattr(chunks_pass, "larger_pieces_pay", lambda device: True)


class Head(nn.Module):
    """An embedding, an optional wide MLP (its backward's temporaries above the loss's
    pieces) and an LM head whose loss is cross-entropy."""

    def __init__(self, vocab, hidden, wide=0):
        super().__init__()
        self.vocab = vocab
        self.embed = nn.Embedding(vocab, hidden)
        self.up = nn.Linear(hidden, wide) if wide else None
        self.down = nn.Linear(wide, hidden) if wide else None
        self.head = nn.Linear(hidden, vocab, bias=False)

    def forward(self, tokens, labels):
        h = self.embed(tokens)
        if self.up is not None:
            h = h + self.down(F.gelu(self.up(h)))
        return F.cross_entropy(self.head(h).view(-1, self.vocab), labels.view(-1))


def _inputs(vocab, tokens):
    g = torch.Generator().manual_seed(0)
    return (torch.randint(0, vocab, (1, tokens), generator=g),
            torch.randint(0, vocab, (1, tokens), generator=g))


def _sizes(comparison, stage):
    records = [r for r in comparison.passes if r.name == PASS and r.stage == stage]
    assert len(records) == 1, records
    return records[0]


def _measured_peak(model, inputs, options):
    torch.manual_seed(0)
    compiled = torch.compile(model, backend="fxopt", options=options)
    return fxopt.profile_memory(compiled, inputs, steps=1).peak_bytes


def test_without_a_budget_the_fewest_pieces_that_keep_the_steps_peak():
    torch.manual_seed(0)
    model = Head(vocab=2048, hidden=16, wide=4096)
    inputs = _inputs(2048, 512)
    comparison = assert_same_as_eager(model, inputs, FUSED)
    record = _sizes(comparison, "forward")
    (row,) = record.stats["sizes"]
    assert record.status == "changed" and record.verdicts.counts() == {"with-grads chunks": 1}
    # 512 tokens x 2048 fp32 logits: the default cuts 4 chunks of 128 rows; one chunk's
    # 4 MiB of temporaries fit under the MLP's backward
    assert (row["default_pieces"], row["pieces"]) == (4, 1)
    assert row["peak_bytes"] == row["peak_bytes_default"] == row["bound_bytes"]
    assert row["predicted_ms"] < row["predicted_ms_default"]
    # the measured step: the same peak as with the default pieces, to the byte
    chosen = _measured_peak(Head(2048, 16, 4096), inputs, FUSED)
    default = _measured_peak(Head(2048, 16, 4096), inputs,
                             {**FUSED, "rewrite_limit": DEFAULT_PIECES})
    assert chosen == default


def test_where_the_loss_sets_the_peak_its_default_pieces_stay(monkeypatch):
    """...and no candidate is run: each one's pieces alone (its block_bytes, a lower bound
    of its workspace) already pass the bound."""
    measured = []

    def spy(node, args=None):
        measured.append(args is not None)
        return workspace_bytes(node, args)

    monkeypatch.setattr(chunks_pass, "workspace_bytes", spy)
    torch.manual_seed(0)
    comparison = assert_same_as_eager(Head(vocab=2048, hidden=16), _inputs(2048, 512), FUSED)
    record = _sizes(comparison, "forward")
    assert record.status == "unchanged"
    (decline,) = record.verdicts.declined
    assert "fewer pieces would raise the step's predicted peak" in decline.reason
    assert record.stats["sizes"][0]["pieces"] == 4
    assert measured and measured.count(True) == 1  # the default's own, for its peak


def test_an_op_whose_workspace_cannot_be_measured_keeps_its_default(monkeypatch):
    """The memory model's measurement warns and counts 0 where the op cannot run; every
    candidate would then look free, so the pass keeps the default."""
    monkeypatch.setattr(chunks_pass, "workspace_bytes", lambda node, args=None: 0)
    torch.manual_seed(0)
    comparison = assert_same_as_eager(Head(2048, 16, 4096), _inputs(2048, 512), FUSED)
    record = _sizes(comparison, "forward")
    assert record.status == "unchanged"
    assert [d.reason for d in record.verdicts.declined] == [
        "its workspace could not be measured: the default pieces kept"]


def test_a_byte_budget_buys_fewer_pieces_within_it():
    torch.manual_seed(0)
    inputs = _inputs(2048, 512)
    plain = _sizes(assert_same_as_eager(Head(2048, 16), inputs, FUSED), "forward")
    default_peak = plain.stats["sizes"][0]["peak_bytes_default"]
    budget = default_peak + 3 * 2**20  # room for 2 chunks' 2 MiB more, not 1's 3 MiB more
    options = {**FUSED, "memory_budget": budget}
    record = _sizes(assert_same_as_eager(Head(2048, 16), inputs, options), "forward")
    (row,) = record.stats["sizes"]
    assert record.status == "changed"
    assert (row["default_pieces"], row["pieces"]) == (4, 2)
    assert row["peak_bytes_default"] < row["peak_bytes"] <= row["bound_bytes"] == budget
    assert _measured_peak(Head(2048, 16), inputs, options) <= budget


def test_the_recompute_forms_forward_and_backward_ops_are_sized_apart():
    """Few tokens against the hidden size: the recompute form, whose forward and backward
    ops walk their own vocabulary blocks; each is sized in its own graph, the other graph
    of the step as compiled."""
    torch.manual_seed(0)
    model = Head(vocab=4096, hidden=64, wide=8192)
    comparison = assert_same_as_eager(model, _inputs(4096, 96), FUSED)
    forward, backward = _sizes(comparison, "forward"), _sizes(comparison, "backward")
    assert forward.verdicts.counts() == {"recompute blocks, forward": 1}
    assert backward.verdicts.counts() == {"recompute blocks, backward": 1}
    for record in (forward, backward):
        (row,) = record.stats["sizes"]
        assert row["pieces"] < row["default_pieces"]
        assert row["peak_bytes"] <= row["bound_bytes"] == row["peak_bytes_default"]


def test_a_head_of_one_piece_is_left_alone():
    comparison = assert_same_as_eager(Head(vocab=97, hidden=8), _inputs(97, 33), FUSED)
    record = _sizes(comparison, "forward")
    assert record.status == "unchanged"
    assert [d.reason for d in record.verdicts.declined] == [
        "one piece already: nothing to choose"]


@pytest.mark.slow
def test_under_inductor_the_pieces_are_sized_on_inductors_step():
    torch.manual_seed(0)
    options = {**FUSED, "codegen": "inductor"}
    comparison = assert_same_as_eager(Head(2048, 16, 4096), _inputs(2048, 512), options)
    record = _sizes(comparison, "forward")
    (row,) = record.stats["sizes"]
    assert record.status == "changed" and row["pieces"] < row["default_pieces"]
    assert row["peak_bytes"] <= row["bound_bytes"] == row["peak_bytes_default"]


def test_on_the_cpus_own_torch_path_the_default_pieces_stay():
    torch.manual_seed(0)
    comparison = assert_same_as_eager(Head(2048, 16, 4096), _inputs(2048, 512), FUSED)
    record = _sizes(comparison, "forward")
    assert record.status == "unchanged" and "sizes" not in record.stats
    assert [d.reason for d in record.verdicts.declined] == [
        "on cpu the ops' torch path runs larger pieces slower (its passes over a piece run "
        "from cache): the default pieces kept"]


@pytest.mark.parametrize("tokens, vocab", [(8192, 50257), (8192, 128256), (1000, 32000)])
def test_the_pieces_a_bound_buys_on_cuda_are_the_pieces_the_ops_walk(tokens, vocab):
    """The pass's candidates as CUDA's ops cut them (bf16, Triton: 2 bytes a logit, rows
    aligned to 8 columns), no GPU needed: ``block_bytes`` for at most p pieces gives the
    ops at most p pieces, exactly p where p divides evenly; the defaults are the GPU table's
    8 chunks and the recompute form's 32 blocks (module docs)."""
    from fxopt.kernels import fuse_linear_cross_entropy as ops
    from fxopt.kernels import fuse_linear_cross_entropy_with_grads as with_grads

    cuda, bf16 = torch.device("cuda"), torch.bfloat16
    if tokens == 8192:
        assert with_grads.chunk_count(tokens, vocab, 0, bf16, cuda) == 8
        assert ops.block_count(tokens, vocab, 0, bf16, cuda) == 32
    for p in (1, 2, 4, 8, 16):
        chunks = with_grads.chunk_count(
            tokens, vocab, with_grads.chunk_bytes_for(p, tokens, vocab, bf16, cuda), bf16, cuda)
        blocks = ops.block_count(
            tokens, vocab, ops.block_bytes_for(p, tokens, vocab, bf16, cuda), bf16, cuda)
        assert chunks <= p and blocks <= p
        assert chunks == p or tokens % p
        assert blocks >= p - 1  # the last block takes what the alignment leaves


@pytest.mark.gpu
def test_on_cuda_the_chosen_pieces_keep_the_measured_peak():
    """On CUDA, where the pass runs by default with its flag: GPT-2's vocabulary at 2048
    tokens in fp32 (16 chunks of 128 rows by default), a wide MLP's backward above them:
    fewer chunks, the loss and gradients eager's, and the step's measured peak
    (``torch.cuda.max_memory_allocated``) no higher than with the default chunks but for
    the allocator's rounding."""
    vocab, tokens = 50257, 2048
    inputs = tuple(t.cuda() for t in _inputs(vocab, tokens))

    def model():
        torch.manual_seed(0)
        return Head(vocab, 128, wide=32768).cuda()

    comparison = assert_same_as_eager(model(), inputs, FUSED)
    (row,) = _sizes(comparison, "forward").stats["sizes"]
    assert row["pieces"] < row["default_pieces"] == 16
    chosen = fxopt.profile_memory(torch.compile(model(), backend="fxopt", options=FUSED),
                                  inputs, steps=1).measured_peak_bytes
    default = fxopt.profile_memory(torch.compile(model(), backend="fxopt", options={
        **FUSED, "rewrite_limit": DEFAULT_PIECES}), inputs, steps=1).measured_peak_bytes
    assert chosen <= default + 2 * 2**20


@pytest.mark.parametrize("pays", [True, False], ids=["sized", "declined"])
def test_a_token_count_that_varies_compiles_once(pays, monkeypatch):
    """Under ``dynamic=True`` (or once Dynamo marks a changed batch size dynamic) the ops'
    token count is symbolic: the pass sizes them at its hint, and reading it as an int
    guarded on it, one compile per batch shape until Dynamo's recompile limit ran the
    model eagerly (a Llama's loss under memory_budget recompiled at each new length)."""
    monkeypatch.setattr(chunks_pass, "larger_pieces_pay", lambda device: pays)
    torch.manual_seed(0)
    model, eager = Head(256, 16, wide=64), Head(256, 16, wide=64)
    eager.load_state_dict(model.state_dict())
    backend = fxopt.backend(**FUSED)
    compiled = torch.compile(model, backend=backend, dynamic=True)
    for tokens in (40, 23, 57):
        inputs = _inputs(256, tokens)
        for m, run in ((model, compiled), (eager, eager)):
            m.zero_grad()
            run(*inputs).backward()
        for p, q in zip(model.parameters(), eager.parameters(), strict=True):
            torch.testing.assert_close(p.grad, q.grad)
    assert len(backend.graphs) == 1
    records = [r for r in backend.graphs[0].passes if r.name == PASS]
    assert records and all(r.status == ("changed" if pays else "unchanged")
                           or r.verdicts.declined for r in records)
    assert any(r.name == "fuse_linear_cross_entropy" and r.fired
               for r in backend.graphs[0].passes)
