"""The pass registry: every fxopt pass, in pipeline order.

One ordered list, read per stage by the runner (`fxopt.pipeline`); drivers never chain
``if config.x:`` and call no pass themselves. A pass that works at two stages is two
entries under one flag (swap_recompute decides on the joint graph; swap_prefetch places its
prefetches in the partitioned backward). The rules every pass keeps are in README.md
beside this file.
"""

from __future__ import annotations

from fxopt import _compat
from fxopt.passes.base import (
    GraphKind,
    PassContext,
    PassResult,
    PassSpec,
    RewriteCounter,
    Stage,
)
from fxopt.passes.fuse_elementwise import fuse_elementwise
from fxopt.passes.fuse_linear_cross_entropy import fuse_linear_cross_entropy
from fxopt.passes.fuse_linear_cross_entropy_chunks import fuse_linear_cross_entropy_chunks
from fxopt.passes.fuse_rnn import fuse_rnn
from fxopt.passes.library_rnn import library_rnn
from fxopt.passes.noop_dropout import noop_dropout
from fxopt.passes.offload_optimizer import offload_optimizer
from fxopt.passes.recompute_rnn import recompute_rnn
from fxopt.passes.reshape_lstm_states import reshape_lstm_states
from fxopt.passes.swap_prefetch import swap_prefetch
from fxopt.passes.swap_recompute import swap_recompute
from fxopt.passes.tempo import tempo

__all__ = [
    "GraphKind", "PassContext", "PassResult", "PassSpec", "RewriteCounter", "Stage",
    "PIPELINE", "passes_for", "get_pass",
]


def _budget_or_plan(ctx: PassContext) -> bool:
    return ctx.options.memory_budget is not None or ctx.options.plan is not None


def _cudnn_kept_without_budget(ctx: PassContext) -> bool:
    """library_rnn's default: on CUDA with no budget or plan, unless fuse_rnn=False (the
    calls fuse_rnn leaves, or all of them when it is off, run once by cuDNN, as eager's, not
    as AOTAutograd's per-step decomposition; under a budget recompute_rnn takes them)."""
    return (ctx.options.fuse_rnn is not False and ctx.is_cuda
            and not _budget_or_plan(ctx))


PIPELINE: list[PassSpec] = [
    PassSpec(
        name="noop_dropout", flag="swap_recompute", stages=(Stage.PRE_AUTOGRAD,),
        run=noop_dropout, default=_budget_or_plan,
        default_text="on when memory_budget (or plan) is set, as swap_recompute",
        description="drops dropout calls that return their input (p=0, training off), "
                    "whose decomposed clone autograd would save"),
    PassSpec(
        name="tempo", flag="tempo", stages=(Stage.PRE_AUTOGRAD,), run=tempo,
        default=lambda ctx: ctx.options.tempo == "auto",
        default_text="off unless asked (trades gradient accuracy and time for memory); "
                     "'auto': the site kinds that pay under memory_budget",
        description="memory-lean GELU, LayerNorm/RMSNorm, attention softmax-dropout (Tempo)"),
    PassSpec(
        name="fuse_rnn", flag="fuse_rnn", stages=(Stage.PRE_AUTOGRAD,), run=fuse_rnn,
        default=lambda ctx: ctx.options.fuse_rnn == "auto",
        default_text="off unless asked; 'auto': whole nn.LSTM/nn.GRU calls left to cuDNN "
                     "where the GPU cost model predicts it faster",
        description="fused LSTM/GRU cells with their own backward (EcoRNN)"),
    PassSpec(
        name="recompute_rnn", flag="swap_recompute", stages=(Stage.PRE_AUTOGRAD,),
        run=recompute_rnn, default=_budget_or_plan,
        default_text="on when memory_budget (or plan) is set, as swap_recompute",
        description="whole nn.LSTM/nn.GRU calls that fuse_rnn left run the library's fused "
                    "RNN, saving only their inputs, and run again in the backward"),
    PassSpec(
        name="library_rnn", flag="library_rnn", stages=(Stage.PRE_AUTOGRAD,),
        run=library_rnn, default=_cudnn_kept_without_budget,
        default_text="on CUDA unless fuse_rnn=False or memory_budget (or plan) is set",
        description="whole nn.LSTM/nn.GRU calls that fuse_rnn left to cuDNN run once, as "
                    "eager's, the library's autograd graph kept for the backward"),
    PassSpec(
        name="reshape_lstm_states", stages=(Stage.PRE_AUTOGRAD,), run=reshape_lstm_states,
        default=lambda ctx: _compat.decomposed_lstm_states_misshapen(),
        default_text="on torch 2.11 and 2.12, whose decomposition misshapes nn.LSTM's "
                     "h_n and c_n",
        description="gives the nn.LSTM calls left to torch's decomposition eager's h_n and "
                    "c_n shapes (internal: a fix for torch 2.11 and 2.12)"),
    PassSpec(
        name="fuse_linear_cross_entropy", flag="fuse_linear_cross_entropy",
        stages=(Stage.PRE_AUTOGRAD,), run=fuse_linear_cross_entropy, default=_budget_or_plan,
        default_text="on when memory_budget (or plan) is set",
        description="cross_entropy(linear(h)) as one op that computes the loss and its "
                    "gradients block by block, never storing the logits"),
    PassSpec(
        name="swap_recompute", flag="swap_recompute", stages=(Stage.JOINT,),
        run=swap_recompute, default=_budget_or_plan,
        default_text="on when memory_budget (or plan) is set",
        description="keep, recompute or swap each saved activation (DELTA)"),
    PassSpec(
        name="swap_prefetch", flag="swap_recompute", stages=(Stage.BACKWARD,),
        run=swap_prefetch, default=_budget_or_plan,
        default_text="on when memory_budget (or plan) is set, as swap_recompute",
        description="issues each swapped activation's prefetch where swap_recompute planned "
                    "it, after the partitioner's reordering"),
    PassSpec(
        name="fuse_linear_cross_entropy_chunks", flag="fuse_linear_cross_entropy",
        stages=(Stage.FORWARD, Stage.BACKWARD), run=fuse_linear_cross_entropy_chunks,
        default=_budget_or_plan,
        default_text="on when memory_budget (or plan) is set, as fuse_linear_cross_entropy",
        description="sizes each fused loss op's pieces: the fewest whose step stays within "
                    "the byte budget, or never above the default's peak"),
    PassSpec(
        name="fuse_elementwise", flag="fuse_elementwise",
        stages=(Stage.FORWARD, Stage.BACKWARD), run=fuse_elementwise,
        default_text="off (opt in; on a CPU it needs TRITON_INTERPRET=1)",
        description="pointwise op chains become generated Triton kernels"),
    PassSpec(
        name="offload_optimizer", flag="offload_optimizer", stages=(Stage.BACKWARD,),
        run=offload_optimizer,
        default_text="off (records the plan fxopt.optim.offload uses; adds only a "
                     "grad_ready call after each gradient)",
        description="optimizer state of some parameter groups on the CPU (Deep Optimizer States)"),
]


def passes_for(stage: Stage) -> list[PassSpec]:
    """The passes that run at ``stage``, in pipeline order."""
    return [spec for spec in PIPELINE if stage in spec.stages]


def get_pass(name: str) -> PassSpec:
    for spec in PIPELINE:
        if spec.name == name:
            return spec
    raise KeyError(f"fxopt: no pass named {name!r}; passes: {[s.name for s in PIPELINE]}")
