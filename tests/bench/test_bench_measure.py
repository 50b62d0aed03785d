"""fxopt.bench: the largest-batch search, workloads, configurations, a failing pair."""

import copy

import pytest
import torch

from fxopt.analysis.measure import measure_saved_bytes
from fxopt.bench import (
    WORKLOADS,
    Config,
    Settings,
    get_configs,
    get_workloads,
    largest_batch,
    measure,
)
from fxopt.passes import PIPELINE


@pytest.mark.parametrize("fits_up_to", [0, 1, 2, 3, 7, 8, 13, 100, 5000])
@pytest.mark.parametrize("start", [1, 4, 16])
def test_largest_batch_finds_the_boundary_in_few_probes(fits_up_to, start):
    probes = []

    def fits(batch):
        probes.append(batch)
        return batch <= fits_up_to

    assert largest_batch(fits, start, limit=1024) == min(fits_up_to, 1024)
    assert len(probes) <= 2 * 11 and all(1 <= b <= 1024 for b in probes)


def test_configurations_cover_baselines_and_each_pass():
    names = [c.name for c in get_configs(None)]
    assert names[:4] == ["eager", "inductor", "inductor-budget-0.5", "checkpoint"]
    for spec in PIPELINE:  # swap_recompute acts under a budget: the budget configurations;
        alone = spec.flag not in (None, "swap_recompute")  # an internal pass has no flag
        assert (f"fxopt+{spec.name}" in names) == alone
    assert {"fxopt", "fxopt-budget-0.5"} <= set(names)


def test_unknown_names_raise_listing_the_valid_ones():
    with pytest.raises(ValueError, match="gpt2-small"):
        get_workloads(["gpt5"])
    with pytest.raises(ValueError, match="checkpoint"):
        get_configs(["fastest"])


@pytest.mark.parametrize("name", sorted(WORKLOADS))
def test_every_workload_trains_at_its_smoke_size(name):
    pytest.importorskip("transformers")
    workload = WORKLOADS[name]
    result = measure(workload, get_configs(["checkpoint"])[0],
                     Settings(smoke=True, device=torch.device("cpu"), warmup=1, steps=1))
    assert result.status == "ok", result.error
    assert result.step_ms > 0 and result.throughput > 0 and result.peak_bytes > 0


def test_a_failing_configuration_is_reported_not_raised():
    def broken(model, workload):
        raise RuntimeError("no kernel for this\nsecond line")

    result = measure(WORKLOADS["lstm-lm"], Config("broken", "fxopt", broken),
                     Settings(smoke=True, device=torch.device("cpu")))
    assert result.status == "failed" and result.error == "RuntimeError: no kernel for this"
    assert result.step_ms is None


def test_largest_batch_under_a_cpu_cap_grows_with_the_cap():
    settings = dict(smoke=True, device=torch.device("cpu"), warmup=1, steps=1, max_batch=16)
    eager = get_configs(["eager"])[0]
    small, large = (measure(WORKLOADS["lstm-lm"], eager, Settings(memory_cap=cap, **settings))
                    for cap in (2**19, 2**21))
    assert 1 <= small.max_batch < large.max_batch <= 16


def test_smoke_default_skips_workloads_whose_tiny_model_is_another():
    names = [w.name for w in get_workloads(None, smoke=True)]
    assert "gpt2-medium" not in names and "bert-large" not in names and "lstm-lm" in names
    assert len(get_workloads(None)) == len(WORKLOADS)
    assert [w.name for w in get_workloads(["bert-large"], smoke=True)] == ["bert-large"]


@pytest.mark.gpu
def test_cuda_measurement_under_a_memory_fraction():
    settings = Settings(smoke=True, device=torch.device("cuda"), warmup=1, steps=3,
                        memory_cap=2**28, max_batch=4096)
    for config in get_configs(["eager", "fxopt"]):
        result = measure(WORKLOADS["lstm-lm"], config, settings)
        assert result.status == "ok", result.error
        assert 0 < result.peak_bytes <= 2**28 and result.max_batch >= result.batch


def _saved_bytes_and_grads(model, inputs):
    """What one forward saves for backward (parameters left out), its output, and the
    gradients of its backward."""
    outputs = []
    torch.manual_seed(0)
    saved = measure_saved_bytes(lambda: outputs.append(model(**inputs)),
                                exclude=list(model.parameters()))
    (out,) = outputs
    out.loss.backward()
    return saved.bytes, out, {n: p.grad for n, p in model.named_parameters()}


@pytest.mark.parametrize("name", ["gpt2-small", "bert-base", "llama-style"])
def test_the_checkpoint_peer_checkpoints_transformers_blocks_as_users_turn_it_on(name):
    """The peer is transformers' own switch: it saves fewer bytes than the plain model, fills
    no key-value cache (which would keep every block's keys and values alive), and leaves
    the gradients as they were (non-reentrant checkpointing replays dropout's RNG)."""
    pytest.importorskip("transformers")
    workload = WORKLOADS[name]
    torch.manual_seed(0)
    plain = workload.build(True).train()
    checkpointed = get_configs(["checkpoint"])[0].prepare(
        copy.deepcopy(plain), workload)
    on = ("is_activation_checkpointing" if hasattr(type(plain), "is_activation_checkpointing")
          else "is_gradient_checkpointing")  # the name before transformers 5.24 (deprecated)
    assert getattr(checkpointed, on)
    inputs = workload.inputs(plain, 2, True, torch.device("cpu"))
    plain_bytes, plain_out, plain_grads = _saved_bytes_and_grads(plain, inputs)
    bytes_, out, grads = _saved_bytes_and_grads(checkpointed, inputs)
    assert bytes_ < 0.8 * plain_bytes
    assert not getattr(out, "past_key_values", None)
    torch.testing.assert_close(out.loss, plain_out.loss)
    for n, grad in plain_grads.items():
        torch.testing.assert_close(grads[n], grad, msg=lambda m, n=n: f"{n}: {m}")
