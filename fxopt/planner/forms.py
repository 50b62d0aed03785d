"""Step-time predictions of whole training-step forms from counted work (issue 30.5): what
lets fuse_rnn, the planner and ``codegen="auto"`` choose on a GPU nobody here measured.

A form's :class:`Work` counts what one step does: GEMM FLOPs per precision, bytes through
device memory outside GEMMs, the kernels of a dependent chain (a recurrence: each waits for
the previous one), and the host's launches by kind. :func:`predict` prices it with a
:class:`~fxopt.planner.HardwareProfile`: the device time is the GEMMs at the profile's rate
(those counted by shape over their tiles' quantized waves; a skinny per-step GEMM at its
weight bytes where that is slower), the other bytes at
the memory bandwidth, and every chained kernel at least ``kernel_latency_seconds``; the
host time is the launches at ``kernel_launch_seconds`` (compiled code: Inductor's wrapper,
cuDNN's own loop), ``eager_op_seconds`` (an eager op: dispatch and autograd's recording,
or an autograd node in the backward) and ``python_op_seconds`` (a Python custom op that
launches a Triton kernel, fuse_rnn's cells). The GPU queue runs ahead of the host, so the
step takes the longer of the two.

Forms counted here, each with its count written next to it:

- :func:`rnn_call_work`: one ``nn.LSTM``/``nn.GRU`` call, cuDNN's ("cudnn": the input
  projections and weight gradients as whole-sequence GEMMs, per step a recurrent GEMM and a
  cell kernel, both ways, launched by cuDNN's C++ loop) or fuse_rnn's unrolled form
  ("fused": the same GEMMs, per step the recurrent GEMM, the Python cell op and, in the
  backward, the cell's backward op, the two GEMMs of the step's gradients and the
  accumulation of the shared weights' gradient);
- :func:`lstm_lm_work` and :func:`cell_loop_work`: the GPU table's nn.LSTM LM and LSTMCell
  loop (the RNN part, an embedding, a head GEMM in fp32 and the cross-entropy's passes);
- :func:`gpt2_work` (:func:`gpt2_parts` by part): transformers' GPT-2 under bf16
  autocast, eager or Inductor, from its GEMMs by shape, flash attention at its documented
  rate, the block's and the loss's ops listed with their bytes, and the parameters' casts;
- :func:`offload_step_seconds`: a step with the optimizer offloaded, from the plain step
  and :func:`fxopt.optim.model.simulate`;
- :func:`linear_cross_entropy_work`: fuse_linear_cross_entropy's two forms of one LM
  head and loss (the pass picks the one predicted faster).

The H100 table these are checked against is ``benchmarks/results/gpu_h100_2026-11-26.md``
(tests/planner/test_gpu_forms.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from fxopt.planner.hardware import HardwareProfile

__all__ = ["Prediction", "Work", "cell_loop_work", "gpt2_parts", "gpt2_work",
           "head_gemm_kind", "linear_cross_entropy_work", "lstm_lm_work",
           "offload_step_seconds", "predict", "quantization", "rate", "rnn_call_work"]

GATES = {"lstm": 4, "gru": 3}


@dataclass
class Work:
    """One training step's counted work. ``gemm_flops`` maps a rate kind (a precision:
    "float32", "tf32", "bfloat16"; or a kernel family a profile may rate, see
    :class:`~fxopt.planner.HardwareProfile`) to FLOPs; ``gemms`` lists GEMMs by shape,
    (rate kind, M, N, K, count), priced with their tiles' wave quantization; ``chain``
    lists the dependent kernels of a recurrence as (count, seconds of one at its roofline);
    ``launches`` maps a host cost kind ("compiled", "eager", "python") to launches."""

    gemm_flops: dict[str, float] = field(default_factory=dict)
    bytes: float = 0.0
    chain: list[tuple[int, float]] = field(default_factory=list)
    launches: dict[str, float] = field(default_factory=dict)
    gemms: list[tuple[str, int, int, int, int]] = field(default_factory=list)

    def __iadd__(self, other: Work) -> Work:
        for key, value in other.gemm_flops.items():
            self.gemm_flops[key] = self.gemm_flops.get(key, 0.0) + value
        for key, value in other.launches.items():
            self.launches[key] = self.launches.get(key, 0.0) + value
        self.bytes += other.bytes
        self.chain += other.chain
        self.gemms += other.gemms
        return self


@dataclass(frozen=True)
class Prediction:
    device_s: float
    host_s: float

    @property
    def seconds(self) -> float:
        return max(self.device_s, self.host_s)

    @property
    def ms(self) -> float:
        return 1e3 * self.seconds


# NVIDIA, "Matrix Multiplication Background User's Guide" (docs.nvidia.com/deeplearning/
# performance/dl-performance-matrix-multiplication), "Typical Tile Dimensions In cuBLAS"
# lists 128x128 among cuBLAS's tiles (the one counted here); "Dimension Quantization
# Effects": a GEMM runs in waves of one tile per SM, so the last wave's idle SMs and the
# tiles' overhang past M and N cost time. Counted without split-K (which cuBLAS may use
# for small outputs with a long K, the weight gradients): an upper bound there.
GEMM_TILE = 128


def rate(hw: HardwareProfile, kind: str) -> float:
    """FLOP/s of ``kind`` on ``hw``: its own rate where the profile has one, else a kernel
    family's (unaligned bf16 GEMMs, flash attention) is priced at the bfloat16 rate."""
    if kind in hw.flops:
        return hw.flops[kind]
    return hw.flop_rate("bfloat16" if kind.startswith(("bfloat16", "flash")) else kind)


def quantization(m: int, n: int, hw: HardwareProfile) -> float:
    """The fraction of an (m x n)-output GEMM's tile waves that does useful work (1.0 where
    the profile has no SM count)."""
    if not hw.multiprocessors:
        return 1.0
    tiles = -(-m // GEMM_TILE) * -(-n // GEMM_TILE)
    waves = -(-tiles // hw.multiprocessors)
    return m * n / (waves * hw.multiprocessors * GEMM_TILE * GEMM_TILE)


def predict(work: Work, hw: HardwareProfile) -> Prediction:
    """The step time of ``work`` on ``hw``: the longer of the device's and the host's."""
    device = sum(flops / rate(hw, kind) for kind, flops in work.gemm_flops.items())
    device += sum(count * 2.0 * m * n * k / rate(hw, kind) / quantization(m, n, hw)
                  for kind, m, n, k, count in work.gemms)
    device += work.bytes / hw.memory_bandwidth
    device += sum(count * max(seconds, hw.kernel_latency_seconds)
                  for count, seconds in work.chain)
    cost = {"compiled": hw.kernel_launch_seconds, "eager": hw.eager_op_seconds,
            "python": hw.python_op_seconds}
    host = sum(count * cost[kind] for kind, count in work.launches.items())
    return Prediction(device, host)


def _skinny_gemm_seconds(rows: int, inner: int, cols: int, itemsize: int, precision: str,
                         hw: HardwareProfile) -> float:
    """One per-step GEMM of a recurrence ([rows x inner] x [inner x cols], rows = batch):
    its FLOPs or the weight it streams, whichever is slower."""
    return max(2 * rows * inner * cols / hw.flop_rate(precision),
               inner * cols * itemsize / hw.memory_bandwidth)


def rnn_call_work(mode: str, batch: int, steps: int, input_size: int, hidden: int,
                  layers: int, directions: int, form: str, hw: HardwareProfile,
                  itemsize: int = 4, precision: str | None = None) -> Work:
    """One training step's work of one ``nn.LSTM``/``nn.GRU`` call (forward and backward).

    ``form`` "cudnn": cuDNN's RNN (TF32 GEMMs for fp32, torch's default for cuDNN), per
    layer-direction-step 2 chained kernels forward (recurrent GEMM, cell) and 2 backward
    (cell backward, recurrent GEMM of the hidden gradient), launched by cuDNN's C++ loop.
    ``form`` "fused": fuse_rnn's unrolled steps under Inductor (GEMMs at the matmul
    precision, fp32 for fp32: torch's default), per layer-direction-step: forward one GEMM
    (compiled launch) and the cell op (Python); backward the cell's backward op (Python),
    the hidden gradient's GEMM, the weight gradient's GEMM and its accumulation into the
    shared weight's gradient (read and write), the bias gradient's reduction and the
    scatter of the step's input-projection gradient (compiled launches).
    """
    gates = GATES[mode] * hidden
    tokens = batch * steps
    precision = precision or ("tf32" if form == "cudnn" and itemsize == 4 else
                              "float32" if itemsize == 4 else "bfloat16")
    work = Work()
    sequences = layers * directions
    # whole-sequence GEMMs: input projection forward, its input and weight gradients, and
    # the recurrent weight's gradient (cuDNN: one GEMM; fused: per step, counted below)
    inputs = [input_size] + [hidden * directions] * (layers - 1)
    whole = sum(3 * 2 * tokens * size * gates * directions for size in inputs)
    if form == "cudnn":
        whole += 2 * tokens * hidden * gates * sequences
    work.gemm_flops[precision] = float(whole)
    recurrent = _skinny_gemm_seconds(batch, hidden, gates, itemsize, precision, hw)
    cell_bytes = batch * gates * itemsize * 3          # gates read, states written
    cell = cell_bytes / hw.memory_bandwidth
    step_count = sequences * steps
    if form == "cudnn":
        work.chain += [(2 * step_count, recurrent), (2 * step_count, cell)]
        work.launches["compiled"] = 4 * step_count
        return work
    # fused: the weight gradient per step, written and accumulated
    accumulate = hidden * gates * itemsize * 3 / hw.memory_bandwidth
    work.chain += [(2 * step_count, recurrent), (2 * step_count, cell),
                   (step_count, max(recurrent, accumulate))]
    work.launches["compiled"] = 6 * step_count
    work.launches["python"] = 2 * step_count
    return work


def _lm_rest(vocab: int, embed: int, hidden: int, tokens: int, eager: bool) -> Work:
    """An LM's embedding, head GEMM (fp32: torch's default matmul precision) and
    cross-entropy: logits written, log-softmax read and written, its backward reading two
    and writing one, the head's input gradient; about 10 eager ops each way."""
    logits = tokens * vocab * 4
    work = Work(gemm_flops={"float32": 3 * 2.0 * tokens * hidden * vocab},
                bytes=float(6 * logits + 3 * tokens * embed * 4))
    work.launches["eager" if eager else "compiled"] = 20
    return work


def lstm_lm_work(vocab: int, embed: int, hidden: int, layers: int, batch: int, steps: int,
                 form: str, hw: HardwareProfile) -> Work:
    """The GPU table's nn.LSTM LM: Embedding -> nn.LSTM -> Linear -> cross-entropy, fp32;
    ``form`` "cudnn" (eager) or "fused" (fuse_rnn under Inductor)."""
    work = rnn_call_work("lstm", batch, steps, embed, hidden, layers, 1, form, hw)
    work += _lm_rest(vocab, embed, hidden, batch * steps, eager=form == "cudnn")
    return work


def cell_loop_work(vocab: int, embed: int, hidden: int, batch: int, steps: int, form: str,
                   hw: HardwareProfile) -> Work:
    """The GPU table's LSTMCell loop: Embedding -> one LSTMCell stepped ``steps`` times ->
    Linear -> cross-entropy, fp32.

    ``form`` "eager": per step forward 4 eager ops (the input's select, two GEMMs, the
    fused cell), backward 13 (the cell's backward and its bias sums, 4 GEMMs, the
    accumulation of 4 shared parameters' gradients, the select's backward: zeros and a
    copy, and the input gradient's accumulation); the select's backward writes and adds a
    whole (batch, steps, embed) gradient per step. ``form`` "fused": fuse_rnn's cells with
    the input projection hoisted, counted as :func:`rnn_call_work`'s "fused" form.
    """
    gates = 4 * hidden
    if form == "fused":
        work = rnn_call_work("lstm", batch, steps, embed, hidden, 1, 1, "fused", hw)
    else:
        work = Work(gemm_flops={"float32": 3 * 2.0 * batch * steps * (embed + hidden) * gates})
        weights = (embed + hidden) * gates * 4
        work.bytes = steps * (2 * weights + 3 * weights + 3 * batch * steps * embed * 4)
        work.chain += [(2 * steps, _skinny_gemm_seconds(batch, hidden, gates, 4, "float32",
                                                        hw))]
        work.launches["eager"] = 17 * steps
    work += _lm_rest(vocab, embed, hidden, batch * steps, eager=form == "eager")
    return work


# Bytes one GPT-2 block moves in its forward under bf16 autocast, in units of one
# (tokens x hidden) activation's elements, per op. Eager: layer norms in fp32 (autocast),
# GEMM inputs cast to bf16, SDPA's output made contiguous, dropouts with their masks, fp32
# residual adds, and transformers' Python GELU (8 ops, in fp32 from its pow on: autocast
# runs pow in fp32) on the 4x hidden MLP activation.
GPT2_EAGER_BLOCK = dict(ln_1=8, cast_1=6, c_attn=8, sdpa=8, merge_heads=4, attn_proj=4,
                        dropout_1=5, residual_1=10, ln_2=8, cast_2=6, c_fc=10, gelu=248,
                        cast_3=24, mlp_proj=10, dropout_2=5, residual_2=10)
# Inductor: each layer norm fused with the cast after it, dropout + residual + layer norm
# as one kernel, the GELU one kernel in bf16 out; the GEMMs and SDPA as in eager.
GPT2_INDUCTOR_BLOCK = dict(ln_1=6, c_attn=8, sdpa=8, merge_heads=4, attn_proj=4,
                           dropout_residual_ln_2=13, c_fc=10, gelu=16, mlp_proj=10,
                           dropout_residual=11)
BACKWARD_BYTES = 2      # a backward reads saved inputs and the output gradient, writes one
EAGER_OPS_PER_BLOCK = 100   # forward ops and backward autograd nodes
INDUCTOR_KERNELS_PER_BLOCK = 30
# The loss's bytes per logit (transformers' ForCausalLMLoss: logits.float(), cross-entropy).
# Eager, each kernel's passes over a row: the head GEMM writes bf16 (2); the upcast reads 2,
# writes 4; log_softmax in fp32: a row of an odd vocabulary is neither 16-byte aligned nor
# divisible by the kernel's vector width, so PyTorch takes cunn_SoftMaxForward, not the
# shared-memory kernel, and reads the row 3 times (max, sum of exponentials, output) and
# writes it (aten/src/ATen/native/cuda/SoftMax.cu: cunn_SoftMaxForwardSmem needs both);
# nll_loss's backward zero-fills the fp32 gradient (4) before its scatter; log_softmax's
# backward reads the gradient for its sum, then it and the output, and writes (16); the
# upcast's backward reads 4, writes 2.
GPT2_EAGER_LOSS = dict(head=2, upcast=6, log_softmax=16, nll_backward=4,
                       log_softmax_backward=16, upcast_backward=6)
# Inductor (the loss is its own graph, after transformers' logging graph break, with the
# bf16 logits as its input): the head writes bf16 (2); the loss graph's forward reads them
# once for the row's max and sum (Inductor's online_softmax) and saves only the bf16
# logits and two fp32 numbers per row; its backward recomputes the softmax from the
# logits (read 2; the NLL's one-hot gradient is a pointwise where(), its row sum costs no
# reads) and writes the bf16 gradient of the logits (2). What the partitioner saves was
# checked on the CPU (torch 2.13, the same ForCausalLMLoss under torch.compile: saved
# tensors bf16 logits, labels and two (tokens, 1) fp32 rows; eager saves the fp32
# log-softmax).
GPT2_INDUCTOR_LOSS = dict(head=2, max_and_sum=2, backward=2 + 2)
# Per fp32 parameter under autocast: its bf16 copy each forward (read 4, write 2) and its
# bf16 gradient made fp32 for .grad (read 2, write 4).
PARAM_BYTES = 6 + 6


def head_gemm_kind(vocab: int, itemsize: int) -> str:
    """The rate kind of an LM head's GEMMs, whose rows of logits (or their gradient) are
    ``vocab`` entries of ``itemsize`` bytes: fp32 GEMMs for 4 bytes; else bf16, at the
    unaligned rate where a row is not a multiple of 16 bytes (the hardware profile's note:
    no TMA descriptor)."""
    if itemsize == 4:
        return "float32"
    return "bfloat16" if vocab * itemsize % 16 == 0 else "bfloat16_unaligned"


def gpt2_parts(layers: int, hidden: int, vocab: int, seq: int, batch: int,
               form: str) -> dict[str, Work]:
    """One training step of transformers' GPT-2 (dropout on, bf16 autocast, the model's own
    loss, no optimizer, ``seq`` positions), ``form`` "eager" or "inductor", by part:

    - "block_gemms": per layer the 4 linear layers' forward, input-gradient and
      weight-gradient GEMMs, by shape (:data:`GEMM_TILE`);
    - "head_gemms": the tied LM head's 3 GEMMs; every one has the vocabulary as a row
      stride (the logits, their gradient), so an odd vocabulary prices them at the
      "bfloat16_unaligned" rate;
    - "attention": causal flash attention, 2 x batch x seq^2 x hidden forward per layer
      (FlashAttention's count: causal work halved), 2.5x that backward, at the flash rates;
    - "block_bytes": the block's bytes listed above, 1 + ``BACKWARD_BYTES`` times;
    - "loss_bytes": ``GPT2_EAGER_LOSS`` or ``GPT2_INDUCTOR_LOSS`` per logit;
    - "param_bytes": ``PARAM_BYTES`` per parameter;
    - "launches": the host's, per block.
    """
    tokens = batch * seq
    gemms = []
    for width_in, width_out in ((hidden, 3 * hidden), (hidden, hidden),
                                (hidden, 4 * hidden), (4 * hidden, hidden)):
        gemms += [("bfloat16", tokens, width_out, width_in, layers),
                  ("bfloat16", tokens, width_in, width_out, layers),
                  ("bfloat16", width_in, width_out, tokens, layers)]
    head = head_gemm_kind(vocab, 2)
    attention = layers * 2.0 * batch * seq * seq * hidden
    block = GPT2_EAGER_BLOCK if form == "eager" else GPT2_INDUCTOR_BLOCK
    loss = GPT2_EAGER_LOSS if form == "eager" else GPT2_INDUCTOR_LOSS
    params = layers * (12 * hidden * hidden + 13 * hidden) + (vocab + seq + 2) * hidden
    launches = ({"eager": EAGER_OPS_PER_BLOCK * layers} if form == "eager" else
                {"compiled": INDUCTOR_KERNELS_PER_BLOCK * layers})
    return {
        "block_gemms": Work(gemms=gemms),
        "head_gemms": Work(gemms=[(head, tokens, vocab, hidden, 1),
                                  (head, tokens, hidden, vocab, 1),
                                  (head, vocab, hidden, tokens, 1)]),
        "attention": Work(gemm_flops={"flash_attention_forward": attention,
                                      "flash_attention_backward": 2.5 * attention}),
        "block_bytes": Work(bytes=float(sum(block.values()) * (1 + BACKWARD_BYTES)
                                        * tokens * hidden * layers)),
        "loss_bytes": Work(bytes=float(sum(loss.values()) * tokens * vocab)),
        "param_bytes": Work(bytes=float(PARAM_BYTES * params)),
        "launches": Work(launches=launches),
    }


def gpt2_work(layers: int, hidden: int, vocab: int, seq: int, batch: int, form: str) -> Work:
    """:func:`gpt2_parts` summed: the step's whole work."""
    work = Work()
    for part in gpt2_parts(layers, hidden, vocab, seq, batch, form).values():
        work += part
    return work


def offload_step_seconds(plain_step_s: float, plain_optimizer_s: float,
                         offloaded_optimizer_s: float) -> float:
    """A step with the optimizer offloaded: the plain step (measured or predicted) less its
    optimizer phase, plus the offloaded optimizer phase (:func:`fxopt.optim.model.simulate`:
    gradients to the host, the CPU's updates, parameters back), which starts when the
    backward ends."""
    return plain_step_s - plain_optimizer_s + offloaded_optimizer_s



def linear_cross_entropy_work(form: str, tokens: int, hidden: int, vocab: int, pieces: int,
                              itemsize: int, grad_h: bool = True, grad_weight: bool = True,
                              fused_accumulate: bool = True) -> Work:
    """One forward and backward of fuse_linear_cross_entropy's op in ``form``
    ("recompute": ``pieces`` vocabulary blocks, the logits made twice; "with_grads":
    ``pieces`` chunks of token rows, the gradients made in the forward), the head's
    compute dtype ``itemsize`` bytes (:func:`head_gemm_kind`).

    GEMMs: the logits once per pass over them, and the wanted gradients' (2 x tokens x
    hidden x vocab each). Bytes per logit: per pass the logits written and read (2 x
    itemsize); the gradient read from them and written in the compute dtype (2 x itemsize:
    the Triton kernel's one pass). The accumulated gradient each piece adds to, in fp32 (h's
    over the vocabulary blocks, W's over the token chunks): read and written by the GEMM
    that adds to it (8 bytes an entry), or, where a half GEMM cannot (not
    ``fused_accumulate``), its fp32 product written and then added (16).
    Host: 8 launches a piece."""
    compute = head_gemm_kind(vocab, itemsize)
    gemm = 2.0 * tokens * hidden * vocab
    wanted = grad_h + grad_weight
    logits = tokens * vocab
    accumulate = 8 if itemsize == 4 or fused_accumulate else 16
    if form == "recompute":
        passes = 1 + (wanted > 0)
        accumulated = pieces * tokens * hidden * accumulate if grad_h else 0
    elif form == "with_grads":
        passes = 1
        accumulated = pieces * vocab * hidden * accumulate if grad_weight else 0
    else:
        raise ValueError(f"form {form!r} is not 'recompute' or 'with_grads'")
    gradient = 2 * itemsize * logits if wanted else 0
    return Work(gemm_flops={compute: gemm * (passes + wanted)},
                bytes=float(2 * itemsize * logits * passes + gradient + accumulated),
                launches={"compiled": 8 * pieces})
