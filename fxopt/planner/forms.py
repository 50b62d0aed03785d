"""Step-time predictions of whole training-step forms from counted work (issue 30.5): what
lets fuse_rnn, the planner and ``codegen="auto"`` choose on a GPU nobody here measured.

A form's :class:`Work` counts what one step does: GEMM FLOPs per precision, bytes through
device memory outside GEMMs, the kernels of a dependent chain (a recurrence: each waits for
the previous one), and the host's launches by kind. :func:`predict` prices it with a
:class:`~fxopt.planner.HardwareProfile`: the device time is the GEMMs at the profile's rate
(or their weight bytes, when a skinny per-step GEMM is memory-bound), the other bytes at
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
- :func:`gpt2_work`: transformers' GPT-2 under bf16 autocast, eager or Inductor, from
  the block's ops listed with their bytes;
- :func:`offload_step_seconds`: a step with the optimizer offloaded, from the plain step
  and :func:`fxopt.optim.model.simulate`.

The H100 table these are checked against is ``benchmarks/results/gpu_h100_2026-11-26.md``
(tests/planner/test_gpu_forms.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from fxopt.planner.hardware import HardwareProfile

__all__ = ["Prediction", "Work", "cell_loop_work", "gpt2_work", "lstm_lm_work",
           "offload_step_seconds", "predict", "rnn_call_work"]

GATES = {"lstm": 4, "gru": 3}


@dataclass
class Work:
    """One training step's counted work. ``gemm_flops`` maps a precision ("float32",
    "tf32", "bfloat16") to FLOPs; ``chain`` lists the dependent kernels of a recurrence as
    (count, seconds of one at its roofline); ``launches`` maps a host cost kind
    ("compiled", "eager", "python") to launches."""

    gemm_flops: dict[str, float] = field(default_factory=dict)
    bytes: float = 0.0
    chain: list[tuple[int, float]] = field(default_factory=list)
    launches: dict[str, float] = field(default_factory=dict)

    def __iadd__(self, other: Work) -> Work:
        for key, value in other.gemm_flops.items():
            self.gemm_flops[key] = self.gemm_flops.get(key, 0.0) + value
        for key, value in other.launches.items():
            self.launches[key] = self.launches.get(key, 0.0) + value
        self.bytes += other.bytes
        self.chain += other.chain
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


def predict(work: Work, hw: HardwareProfile) -> Prediction:
    """The step time of ``work`` on ``hw``: the longer of the device's and the host's."""
    device = sum(flops / hw.flop_rate(kind) for kind, flops in work.gemm_flops.items())
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


def gpt2_work(layers: int, hidden: int, vocab: int, seq: int, batch: int, form: str) -> Work:
    """One training step of transformers' GPT-2 (dropout on, bf16 autocast, the model's own
    loss, no optimizer), ``form`` "eager" or "inductor".

    GEMMs: 3 x (2 x tokens x 12 hidden^2 per block + the head's 2 x tokens x hidden x
    vocab); causal flash attention, 2 x 2 x batch x seq^2 x hidden / 2 forward per block,
    3.5x that with its backward. Bytes: the block's listed above, 1 + ``BACKWARD_BYTES``
    times; the loss: eager writes bf16 logits, casts them to fp32, log-softmaxes, and the
    backward writes the NLL gradient, the log-softmax's (reading two) and the cast's;
    Inductor writes the bf16 logits and reads them twice each way.
    """
    tokens = batch * seq
    activation = tokens * hidden
    gemm = 3 * (2.0 * tokens * 12 * hidden * hidden * layers + 2.0 * tokens * hidden * vocab)
    attention = 3.5 * layers * 2 * batch * seq * seq * hidden
    logits = tokens * vocab
    block = GPT2_EAGER_BLOCK if form == "eager" else GPT2_INDUCTOR_BLOCK
    per_layer = sum(block.values()) * (1 + BACKWARD_BYTES) * activation
    if form == "eager":
        loss = logits * (2 + 6 + 8 + 4 + 12 + 6)
        launches = {"eager": EAGER_OPS_PER_BLOCK * layers}
    else:
        loss = logits * (2 + 4 + 4 + 2)
        launches = {"compiled": INDUCTOR_KERNELS_PER_BLOCK * layers}
    return Work(gemm_flops={"bfloat16": gemm + attention},
                bytes=float(per_layer * layers + loss), launches=launches)


def offload_step_seconds(plain_step_s: float, plain_optimizer_s: float,
                         offloaded_optimizer_s: float) -> float:
    """A step with the optimizer offloaded: the plain step (measured or predicted) less its
    optimizer phase, plus the offloaded optimizer phase (:func:`fxopt.optim.model.simulate`:
    gradients to the host, the CPU's updates, parameters back), which starts when the
    backward ends."""
    return plain_step_s - plain_optimizer_s + offloaded_optimizer_s

