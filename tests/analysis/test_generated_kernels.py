"""fxopt.analysis.generated_kernels: Inductor's Triton code for a step, read on the CPU.

The capture must leave the step's results as eager's (the graphs run uncompiled), read
what the code launches (kernels, GEMMs, gathers), and show that fxopt's default Inductor
path generates what plain torch.compile does (issue 29.1 on the GPU's code path)."""

import pytest
import torch
from models import load_benchmark

from fxopt import _compat
from fxopt.analysis.generated_kernels import KINDS, generated_code, read_output_code

transformers = pytest.importorskip("transformers")


def test_a_step_reads_its_kernels_gemms_and_gathers_and_computes_eagers_values():
    torch._dynamo.reset()
    torch.manual_seed(0)
    table = torch.randn(50, 24, requires_grad=True)
    weight = torch.randn(24, 40, requires_grad=True)
    ids = torch.randint(0, 50, (7, 5))

    def loss_of(ids):
        return torch.nn.functional.gelu(table[ids] @ weight).square().mean()

    compiled = torch.compile(loss_of, backend=_compat.inductor_backend)
    losses = []
    codes = generated_code(lambda: losses.append(compiled(ids)) or losses[-1].backward())
    got = (losses[0].detach(), table.grad.clone(), weight.grad.clone())
    table.grad = weight.grad = None
    loss_of(ids).backward()
    # the graphs run as Inductor's decomposed aten graphs: eager's values up to the
    # rounding of their op order (fp32's default tolerance), not bit for bit
    torch.testing.assert_close(got, (loss_of(ids).detach(), table.grad, weight.grad))

    forward, backward = codes
    assert not forward.backward and backward.backward
    assert forward.extern_calls["mm"] == 1 and backward.extern_calls["mm"] == 2
    assert forward.launches >= 1 and backward.launches >= 1
    assert all(k.kind in KINDS.values() and k.launches >= 1 and k.bytes > 0
               for code in codes for k in code.kernels)
    # the embedding's rows are read at addresses loaded from ids: a gather, in the forward
    # (its backward is a scatter of the rows' gradients: no indirect load)
    assert forward.indirect_loads >= 1
    # Inductor's estimate counts each buffer once: at least the ids read and the
    # embedded rows written (bf16 is not involved: fp32, int64)
    assert forward.bytes >= ids.numel() * 8 + ids.numel() * 24 * 4


def test_other_text_is_refused_and_a_step_that_compiles_nothing_says_so():
    with pytest.raises(ValueError, match="not Inductor output code"):
        read_output_code("import torch\n")
    with pytest.raises(RuntimeError, match="no graph was compiled"):
        generated_code(lambda: torch.ones(3).sum())


def _gpt2_code(config, layers=1):
    """benchmarks/generated_kernels.py's step (the GPU check's GPT-2, bf16 autocast, SDPA,
    the logging break left in) at a tiny size."""
    bench = load_benchmark("generated_kernels")
    return bench.step_code(bench.CONFIGS[config], layers,
                           dict(hidden=32, seq=16, batch=2, vocab=97))


@pytest.fixture(scope="module")
def gpt2_codes():
    """GPT-2's generated code: plain torch.compile at 1 and 2 layers, fxopt's defaults
    (Inductor) at 1 (compiled once for the module's tests: 10 s each here)."""
    return {"plain": _gpt2_code("torch.compile"),
            "plain, 2 layers": _gpt2_code("torch.compile", layers=2),
            "fxopt": _gpt2_code("fxopt defaults (Inductor)")}


@pytest.mark.slow
def test_fxopt_defaults_generate_the_kernels_plain_torch_compile_does(gpt2_codes):
    """GPT-2 under bf16 autocast and SDPA, its logging break left in: fxopt's Inductor
    path launches the same kernels, GEMMs and attention calls, moving the same bytes, as
    plain torch.compile, graph by graph."""
    plain, ours = gpt2_codes["plain"], gpt2_codes["fxopt"]
    assert len(plain) == len(ours) == 4  # model and loss graphs, forward and backward
    assert all(code.launches > 0 for code in plain)
    assert ([[(k.name, k.launches, k.bytes) for k in c.kernels] for c in ours]
            == [[(k.name, k.launches, k.bytes) for k in c.kernels] for c in plain])
    assert ([(c.extern_calls, c.fallback_calls) for c in ours]
            == [(c.extern_calls, c.fallback_calls) for c in plain])


def _launches(codes):
    return sum(c.launches + c.extern_calls.total() + c.fallback_calls.total() for c in codes)


@pytest.mark.slow
def test_the_cost_models_launches_per_gpt2_block_are_inductors(gpt2_codes):
    """forms.INDUCTOR_KERNELS_PER_BLOCK (the host's launches a block) against the block's
    generated kernels, GEMMs and attention calls, plain torch.compile at 2 layers less at
    1. Counted at the GPU check's size it is 44; at this size the forward generates one
    kernel less (43: the tolerance of 1)."""
    from fxopt.planner.forms import INDUCTOR_KERNELS_PER_BLOCK

    per_block = _launches(gpt2_codes["plain, 2 layers"]) - _launches(gpt2_codes["plain"])
    assert abs(per_block - INDUCTOR_KERNELS_PER_BLOCK) <= 1
