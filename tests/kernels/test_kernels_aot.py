"""The AOT compile check (fxopt.kernels.aot) in the normal suite: a representative set of
fxopt's Triton kernels compiled for sm_80 and sm_90 with no GPU (the LSTM/GRU backward
also as fuse_rnn's sequence ops call it); fails on a compile error, any spill or more than
255 registers, a layout conversion left in a generated kernel, and on generated pointwise
kernels that do not use 128-bit accesses or move more than the region's minimum. The
kernels of GPT-2's tanh GELU come from its CUDA graph under bf16 autocast, traced on fake
CUDA tensors (fake_cuda_regions.py). The full matrix (every kernel, dtype and arch, and a
corpus of generated kernels) is benchmarks/aot_kernels.py."""

import pytest
import torch

from fxopt.kernels import triton_installed, triton_runs_on
from fxopt.kernels.fuse_elementwise.triton_source import Instr, Layout, Program, vector_elements

pytestmark = pytest.mark.skipif(not triton_installed(), reason="needs Triton")

bf16, fp32 = torch.bfloat16, torch.float32


def _gelu_mul(dtype):
    """x * gelu(y) + z: three inputs, one output, the compute in fp32."""
    return Program(inputs=(dtype, dtype, dtype),
                   instrs=(Instr("gelu", (("in", 1),), ("none",), fp32, dtype),
                           Instr("mul", (("in", 0), ("v", 0)), (), fp32, dtype),
                           Instr("add", (("v", 1), ("in", 2)), (1,), fp32, dtype)),
                   outputs=(2,))


def test_representative_kernels_compile_without_spills_and_vectorize():
    from fxopt.kernels import aot

    handwritten = {s.label: s for s in aot.handwritten_specs(("bf16", "fp32"))}
    jobs = [(handwritten["tempo_gelu_forward[tanh] bf16"], 90),
            (handwritten["tempo_gelu_backward[none] bf16"], 90),
            (handwritten["lstm_forward H=1024 fp32"], 80),
            (handwritten["gru_backward H=1024 bf16"], 90),
            # the sequence ops call the backward kernels with other pointer types (bf16
            # gate gradients, the LSTM's fp32 cell-state carry): their own specializations
            (handwritten["lstm_backward[sequence] H=1024 bf16"], 90),
            (handwritten["gru_backward[sequence] H=1024 bf16"], 90)]
    contiguous = Layout(ndim=1, strided_inputs=(False,) * 3, strided_outputs=(False,),
                        wide=False)
    broadcast = Layout(ndim=2, strided_inputs=(False, True, False), strided_outputs=(False,),
                       wide=False)
    wide = Layout(ndim=2, strided_inputs=(False, True, False), strided_outputs=(False,),
                  wide=True)  # more than 2**31 elements: int64 offsets
    generated = [(aot.pointwise_spec(_gelu_mul(bf16), contiguous, "x*gelu(y)+z bf16"), 90),
                 (aot.pointwise_spec(_gelu_mul(fp32), contiguous, "x*gelu(y)+z fp32"), 80),
                 (aot.pointwise_spec(_gelu_mul(bf16), wide, "x*gelu(y[b])+z bf16 int64"), 80),
                 (aot.pointwise_spec(_gelu_mul(fp32), broadcast, "x*gelu(y[b])+z fp32"), 90)]
    reports = aot.compile_jobs(jobs + generated)
    print("\n" + aot.format_table(reports))
    assert [p for r in reports for p in aot.problems(r)] == []
    assert [r.arch for r in reports] == [arch for _, arch in jobs + generated]
    # GELU backward: the polynomial's coefficients come in 128-bit rows, not one scalar
    # gather per coefficient (97 scalar loads before, 33 now: 18 uniform interval starts,
    # start and scale of 8 elements' intervals, and the mask byte)
    assert sum(n for width, n in reports[1].loads.items() if width <= 32) <= 40
    for report in reports[len(jobs):len(jobs) + 2]:  # contiguous: 128-bit, minimal bytes
        assert report.operand_widths == [128], report
        assert report.bytes_per_element <= 1.05 * report.min_bytes_per_element, report
    # the broadcast operand is read by index arithmetic (scalar gathers), the others stay
    # linear and vectorized
    assert 128 in reports[-1].loads and set(reports[-1].stores) == {128}


def test_global_access_widths_are_read_from_ptx():
    from fxopt.kernels.aot import _global_accesses

    ptx = """
    @%p1 ld.global.v4.b32 { %r1, %r2, %r3, %r4 }, [ %rd1 + 0 ];
    @%p2 ld.global.L1::evict_last.b32 { %r5 }, [ %rd2 + 0 ];
    @%p1 st.global.v2.b16 [ %rd3 + 0 ], { %rs1, %rs2 };
    ld.global.nc.u8 %rs3, [%rd4];
    """
    loads, stores = _global_accesses(ptx)
    assert loads == {128: 1, 32: 1, 8: 1} and stores == {32: 1}
    loads, stores = _global_accesses(ptx, masked_only=True)
    assert loads == {128: 1, 32: 1} and stores == {32: 1}


def test_a_spill_too_many_registers_or_a_compile_error_fail_the_check():
    from fxopt.kernels.aot import KernelReport, problems

    assert problems(KernelReport("k", 90, registers=40)) == []
    assert problems(KernelReport("k", 90, registers=40, spill_bytes=8)) == [
        "k sm_90: spills 8 bytes"]
    assert problems(KernelReport("k", 80, registers=256)) == ["k sm_80: 256 registers"]
    assert problems(KernelReport("k", 80, error="CompilationError: at 3:4")) == [
        "k sm_80: does not compile: CompilationError: at 3:4"]


def _linear(program):
    return Layout(ndim=1, strided_inputs=(False,) * len(program.inputs),
                  strided_outputs=(False,) * len(program.outputs), wide=False)


def test_a_bf16_load_beside_fp32_stores_compiles_to_one_layout():
    """The smallest kernel Triton 3.6 failed to compile before the generator gave every
    access one layout (TritonGPURemoveLayoutConversions: "operand #1 does not dominate this
    use"): bf16 in, exp, +1, a product, three fp32 outputs. Triton 3.9 compiles it either
    way, but with two layouts and 4 conversions between them, which this check fails."""
    from fxopt.kernels import aot

    program = Program(inputs=(bf16,),
                      instrs=(Instr("exp", (("in", 0),), (), fp32, fp32),
                              Instr("add", (("v", 0), ("c", 1.0)), (1,), fp32, fp32),
                              Instr("mul", (("in", 0), ("v", 1)), (), fp32, fp32)),
                      outputs=(0, 1, 2))
    layout = _linear(program)
    assert vector_elements(program, layout) == 4  # 16 bytes of fp32, the widest dtype
    assert vector_elements(_gelu_mul(bf16), _linear(_gelu_mul(bf16))) == 8
    reports = aot.compile_jobs([(aot.pointwise_spec(program, layout, "exp chain", c), arch)
                                for c in ((1024, 4), (4096, 8)) for arch in aot.ARCHS])
    assert [p for r in reports for p in aot.problems(r)] == []
    for report in reports:
        assert report.layout_conversions == 0 and report.one_layout
        # one layout of 4 elements per thread: 64-bit bf16 loads, 128-bit fp32 stores
        assert set(report.loads) == {64} and set(report.stores) == {128}, report


@pytest.mark.skipif(not triton_runs_on("cpu"),
                    reason="fuse_elementwise needs Triton's interpreter (TRITON_INTERPRET=1)")
def test_gpt2_tanh_gelu_kernels_of_the_cuda_bf16_graph_compile_for_sm80_and_sm90():
    """GPT-2's tanh GELU, forward and backward, as fuse_elementwise generates it for the
    CUDA graph under bf16 autocast (CUDA autocast runs ``pow`` in fp32, so the region
    loads bf16 and computes and stores fp32: the kernel that failed on the H100), compiled
    at the autotuner's widest choice for both archs with no problem and one layout."""
    import transformers
    from fake_cuda_regions import cuda_regions

    from fxopt.kernels import aot

    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=1, n_embd=64, n_head=4, n_positions=32,
                                     vocab_size=64)
    model = transformers.GPT2LMHeadModel(config).train()
    ids = torch.randint(0, 64, (2, 32))

    def run(backend):
        with torch.autocast("cpu", torch.bfloat16):
            torch.compile(model, backend=backend)(input_ids=ids)

    programs, skipped = cuda_regions(run, torch.bfloat16)
    assert skipped == []
    gelu = [(p, layout) for p, layout in programs
            if {"tanh", "tanh_backward"} & {i.name for i in p.instrs}]
    names = [{i.name for i in p.instrs} for p, _ in gelu]
    assert len(gelu) == 2 and "tanh" in names[0] and "tanh_backward" in names[1], names
    forward = gelu[0][0]
    assert forward.inputs == (bf16,) and fp32 in forward.output_dtypes  # CUDA autocast's pow
    reports = aot.compile_jobs([(aot.pointwise_spec(p, layout, f"gpt2 gelu {k}"), arch)
                                for k, (p, layout) in enumerate(gelu) for arch in aot.ARCHS])
    print("\n" + aot.format_table(reports))
    assert [p for r in reports for p in aot.problems(r)] == []
