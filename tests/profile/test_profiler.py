"""fxopt.profile_memory on eager, Inductor- and fxopt-compiled training steps."""

import sys

import pytest
import torch
from models import Block, LSTMModel
from torch import nn

import fxopt
from fxopt.analysis import measure_peak_memory, measure_saved_bytes
from fxopt.profile import CATEGORIES, profile_memory


def blocks(dim=32, n=2):
    torch.manual_seed(0)
    return nn.Sequential(*[Block(dim, 4) for _ in range(n)])


def nbytes(tensors):
    return sum(t.untyped_storage().nbytes() for t in tensors)


def optimizer_tensors(opt):
    return [t for s in opt.state.values() for t in s.values() if isinstance(t, torch.Tensor)]


def test_eager_step_by_category_matches_an_independent_measurement():
    model, x = blocks(), torch.randn(4, 64, 32)
    opt = torch.optim.Adam(model.parameters())
    profile = profile_memory(model, x, opt, steps=2)
    assert sum(profile.peak_categories.values()) == pytest.approx(profile.peak_bytes, rel=0.05)
    assert profile.peak_categories["parameters"] == nbytes(model.parameters())
    assert profile.peak_categories["optimizer_state"] == nbytes(optimizer_tensors(opt))
    assert profile.peak_categories["inputs"] == nbytes([x])
    # The peak of a transformer step is mostly what the forward saved for backward.
    assert profile.peak_categories["activations"] > 0.5 * profile.peak_bytes
    assert profile.peak_phase.endswith(("forward", "backward"))

    def step():
        model(x).sum().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    measured = measure_peak_memory(step, baseline_tensors=[
        *model.parameters(), x, *optimizer_tensors(opt)])
    assert profile.peak_bytes == pytest.approx(measured.peak_bytes, rel=0.05)


@pytest.mark.parametrize("backend", ["inductor", "fxopt"])
def test_compiled_forward_activations_are_attributed(backend):
    # The forward is one compiled graph: its saved tensors are still activations. (A small
    # model: Inductor's C++ compilation of two transformer blocks takes ~30 s on one core.)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 128), nn.GELU(), nn.Linear(128, 128), nn.Tanh(),
                          nn.Linear(128, 8))
    x = torch.randn(64, 32)
    compiled = torch.compile(model, backend=fxopt.backend() if backend == "fxopt" else backend)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    profile = profile_memory(compiled, x, opt, steps=1)
    saved = measure_saved_bytes(lambda: compiled(x).sum(), exclude=[*model.parameters(), x])
    timeline = profile.timeline
    end_of_forward = max(i for i, p in enumerate(timeline.phases) if p.endswith("forward"))
    assert timeline.bytes["activations"][end_of_forward] == pytest.approx(saved.bytes, rel=0.05)
    assert saved.bytes >= 64 * 128 * 4  # at least one hidden activation was saved
    assert profile.peak_categories["optimizer_state"] == 0  # SGD without momentum keeps none
    assert sum(profile.peak_categories.values()) == profile.peak_bytes


def test_without_optimizer_gradients_are_counted_and_dropped_each_step():
    torch.manual_seed(0)
    model, tokens = LSTMModel(vocab=23, hidden=32), torch.randint(0, 23, (4, 16))
    profile = profile_memory(model, tokens, steps=2, warmup=0)
    gradients = profile.timeline.bytes["gradients"]
    assert max(gradients) == nbytes(model.parameters())
    assert gradients[-1] == 0 and all(p.grad is None for p in model.parameters())
    assert profile.peak_categories["optimizer_state"] == 0


def test_hugging_face_model_with_labels_uses_its_loss():
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=1, n_embd=32, n_head=2, n_positions=32,
                                     vocab_size=50)
    model = transformers.GPT2LMHeadModel(config)
    ids = torch.randint(0, 50, (2, 16))
    profile = profile_memory(model, {"input_ids": ids, "labels": ids}, steps=1)
    assert profile.peak_categories["activations"] > 0
    assert profile.peak_categories["inputs"] == nbytes([ids])  # one storage, passed twice


def test_outputs_table_json_and_chart(tmp_path):
    pytest.importorskip("matplotlib")
    model, x = blocks(n=1), torch.randn(2, 16, 32)
    profile = profile_memory(model, x, torch.optim.Adam(model.parameters()), steps=1)
    table = profile.table()
    for category in CATEGORIES:  # a row per category that can be non-zero here
        assert (category in table) == (category not in ("optimizer_state_host", "other"))
    data = __import__("json").loads(profile.save_json(tmp_path / "p.json").read_text())
    totals = [sum(col) for col in zip(*data["timeline"]["bytes"].values())]
    assert max(totals) == data["peak_bytes"] == profile.peak_bytes
    assert {"forward", "backward", "optimizer"} <= {
        p.split(":")[-1] for p in data["timeline"]["phase"] if p}
    png = profile.plot(tmp_path / "p.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_json_timeline_is_downsampled_keeping_the_peak():
    model, x = blocks(n=1), torch.randn(2, 16, 32)
    profile = profile_memory(model, x, steps=2)
    data = profile.to_dict(max_points=10)
    totals = [sum(col) for col in zip(*data["timeline"]["bytes"].values())]
    assert len(totals) <= 12 and max(totals) == profile.peak_bytes


def test_missing_matplotlib_is_a_clear_error(tmp_path, monkeypatch):
    model, x = blocks(n=1), torch.randn(2, 8, 32)
    profile = profile_memory(model, x, steps=1)
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(RuntimeError, match=r"pip install 'fxopt\[plot\]'"):
        profile.plot(tmp_path / "p.png")


def test_bad_arguments_raise_clear_errors():
    model = nn.Linear(3, 2)
    with pytest.raises(TypeError, match="nn.Module"):
        profile_memory(lambda x: x, torch.randn(2, 3))
    with pytest.raises(ValueError, match="steps must be an int >= 1"):
        profile_memory(model, torch.randn(2, 3), steps=0)
    with pytest.raises(ValueError, match="warmup"):
        profile_memory(model, torch.randn(2, 3), warmup=-1)
    with pytest.raises(TypeError, match="loss_fn="):  # nothing in the output needs grad
        profile_memory(nn.ReLU(), torch.randn(2, 3))


@pytest.mark.gpu
def test_cuda_total_matches_max_memory_allocated():
    model, x = blocks(dim=256, n=4).cuda(), torch.randn(8, 256, 256, device="cuda")
    opt = torch.optim.Adam(model.parameters())
    for compiled in (model, torch.compile(model, backend="inductor")):
        profile = profile_memory(compiled, x, opt, steps=2)
        assert profile.measured_peak_bytes is not None
        assert profile.peak_bytes == pytest.approx(profile.measured_peak_bytes, rel=0.05)
        assert profile.peak_categories["activations"] > 0.3 * profile.peak_bytes
