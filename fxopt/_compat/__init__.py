"""The one adapter between fxopt and torch's private APIs (this package: Dynamo's side in
:mod:`fxopt._compat.dynamo`, symbolic sizes' ints in :mod:`fxopt._compat.sizes`, both
re-exported here).

fxopt needs a few things torch does not expose publicly: AOTAutograd's entry for backends,
its partitioners, Inductor's per-graph compiler and decomposition table (and its Triton
code generated for CPU graphs, read without compiling it), Dynamo's
graph-break counters and the C bindings it records ``F.linear``/``F.gelu`` as, the pytree
utilities, ``OpOverload`` and schema alias sets, ``TorchDispatchMode`` (documented, but in
a private module) and the min-cut partitioner's activation budget. Every such import lives
here, so a torch upgrade breaks one file. The profiler's raw allocation records are the one
other private use; they live in the profiler's own adapter, `fxopt.profile._torch`, with
the data types the profiler builds from them (tests/test_layout.py checks that no other
module names a private torch API). Supported: torch >= 2.11.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import inspect
from collections.abc import Callable, Iterator, Sequence
from operator import getitem
from typing import Any

import torch
import torch.fx as fx
from torch.fx.graph import CodeGen
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_leaves, tree_map

from fxopt._compat.dynamo import (
    dynamo_allow_rnn,
    dynamo_frame_id,
    dynamo_ignoring_functions,
    dynamo_input_sources,
    dynamo_reset,
    dynamo_suppresses_errors,
    dynamo_traces_rnn,
    fake_mode_of,
    graph_break_counts,
    is_dynamo_protocol_error,
    tracing_again,
)
from fxopt._compat.sizes import size_hint, sizes_planned_at

__all__ = [
    "NN_GELU", "NN_LINEAR", "TorchDispatchMode", "activation_memory_budget", "aot_autograd",
    "boxed_fx_callable", "call_kernel", "copy_graph", "copy_graph_module",
    "decomposed_lstm_states_misshapen", "default_partition", "dynamo_allow_rnn",
    "dynamo_frame_id", "dynamo_ignoring_functions",
    "dynamo_input_sources", "dynamo_reset", "dynamo_suppresses_errors", "dynamo_traces_rnn",
    "fake_mode_of", "graph_break_counts", "inductor_backend", "inductor_compile",
    "inductor_decompositions", "inductor_generates_triton", "inductor_graph_context",
    "inductor_inference_passes", "inductor_partition", "inductor_triton_code_on_cpu",
    "is_dynamo_protocol_error", "is_op_overload", "is_symbolic", "min_cut_partition",
    "modes_suspended", "op_alias_sets", "PARTITION_SEARCH", "queue_backward_callback",
    "rng_wrapped_call",
    "size_hint", "sizes_planned_at", "tracing_again", "tree_flatten",
    "tree_leaves", "tree_map",
]

# What Dynamo records ``F.linear`` and ``F.gelu`` as: their C bindings.
NN_LINEAR = torch._C._nn.linear
NN_GELU = torch._C._nn.gelu


def is_op_overload(target: Any) -> bool:
    """Whether a call_function target is an op overload (``aten.mm.default``, ``fxopt::*``)."""
    return isinstance(target, torch._ops.OpOverload)


def queue_backward_callback(callback: Callable[[], None]) -> None:
    """Run ``callback`` once the running backward pass has finished (every node and hook
    of it, as DistributedDataParallel's reducer does); call it from inside that pass."""
    torch.autograd.Variable._execution_engine.queue_callback(callback)


def call_kernel(op: Any, device_type: str, args: Sequence[Any], kwargs: dict[str, Any]) -> Any:
    """Run an op overload's kernel for ``device_type`` (or its CompositeExplicitAutograd
    one, where ``torch.library.custom_op`` registers a kernel for every device) directly,
    below the dispatcher's Python key: a ``TorchDispatchMode`` that calls it from its
    ``__torch_dispatch__`` with itself re-entered sees the ops the kernel runs inside."""
    key = torch._C.DispatchKey.CPU if device_type == "cpu" else torch._C.DispatchKey.CUDA
    if not torch._C._dispatch_has_kernel_for_dispatch_key(op.name(), key):
        key = torch._C.DispatchKey.CompositeExplicitAutograd
    return op._op_dk(key, *args, **kwargs)


@contextlib.contextmanager
def modes_suspended() -> Iterator[None]:
    """No dispatch mode active inside (a ``FakeTensorMode`` that is tracing the caller,
    say): tensors made here are real, and ops run on them really run, as at run time: the
    Python dispatcher a compilation turns on is off too (under it ``torch.lstm`` runs
    AOTAutograd's per-step decomposition instead of the library's fused call)."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily
    from torch.utils._python_dispatch import _disable_current_modes

    with unset_fake_temporarily(), _disable_current_modes(), \
            torch._C._DisablePythonDispatcher():
        yield


@contextlib.contextmanager
def activation_memory_budget(fraction: float) -> Iterator[None]:
    """torch's knob for the min-cut partitioner's saved-activation budget (a fraction of
    what it would save otherwise), set for the ``with`` block."""
    from torch._functorch import config as functorch_config

    with functorch_config.patch(activation_memory_budget=fraction):
        yield


def aot_autograd(**kwargs: Any) -> Callable[..., Any]:
    """AOTAutograd as a Dynamo backend (fw/bw/inference compilers, partition_fn, ...)."""
    from torch._dynamo.backends.common import aot_autograd as _aot_autograd

    return _aot_autograd(**kwargs)


def default_partition(joint: fx.GraphModule, joint_inputs: Any, **kwargs: Any
                      ) -> tuple[fx.GraphModule, fx.GraphModule]:
    """Saves what plain autograd would save, except the nodes tagged ``MUST_RECOMPUTE``,
    which the backward rebuilds. A tagged random op is replayed from its forward's RNG
    state: torch's ``functionalize_rng_ops`` wraps it in ``run_and_save_rng_state`` in the
    forward and ``run_with_rng_state`` in the backward, so its bits are the forward's."""
    from torch._functorch.partitioners import default_partition as _default

    return _with_rng_wrapper_values(_default(joint, joint_inputs, **kwargs))


def _with_rng_wrapper_values(graphs: tuple[fx.GraphModule, fx.GraphModule]
                             ) -> tuple[fx.GraphModule, fx.GraphModule]:
    """A partition's (forward, backward), its RNG wrappers given values. The wrappers that
    ``functionalize_rng_ops`` adds carry no ``meta["val"]``; their getitem users do: the
    wrapper's value is the tuple of those. fxopt's cost and planner read every node's."""
    from torch._prims.rng_prims import run_and_save_rng_state, run_with_rng_state

    for gm in graphs:
        for node in gm.graph.nodes:
            if node.target not in (run_and_save_rng_state, run_with_rng_state) \
                    or "val" in node.meta:
                continue
            items = {u.args[1]: u.meta.get("val") for u in node.users if u.target is getitem}
            if items and len(items) == len(node.users) and None not in items.values():
                node.meta["val"] = tuple(items.get(i) for i in range(max(items) + 1))
    return graphs


def rng_wrapped_call(node: fx.Node) -> tuple[Any, tuple, dict, Any] | None:
    """For an RNG wrapper node (``functionalize_rng_ops``'s ``run_and_save_rng_state`` or
    ``run_with_rng_state``): the op it runs, that op's args and kwargs, and the op's own
    value (without the saved RNG state) where the node carries one. None for another node."""
    from torch._prims.rng_prims import run_and_save_rng_state, run_with_rng_state

    val = node.meta.get("val")
    if node.target is run_and_save_rng_state:  # (op, *args) -> (state, op's value)
        return node.args[0], node.args[1:], dict(node.kwargs), \
            val[1] if isinstance(val, tuple) and len(val) == 2 else None
    if node.target is run_with_rng_state:      # (state, op, *args) -> op's value
        return node.args[1], node.args[2:], dict(node.kwargs), val
    return None


def min_cut_partition(joint: fx.GraphModule, joint_inputs: Any, **kwargs: Any
                      ) -> tuple[fx.GraphModule, fx.GraphModule]:
    """Inductor's partitioner: recomputes cheap ops that a fusing compiler gets for free."""
    from torch._functorch.partitioners import min_cut_rematerialization_partition

    # a recomputed random op is replayed through the RNG wrappers, as in default's
    return _with_rng_wrapper_values(
        min_cut_rematerialization_partition(joint, joint_inputs, **kwargs))


PARTITION_SEARCH = "fxopt_partition_search"  # joint gm.meta key: a budgeted min-cut search


def inductor_partition(joint: fx.GraphModule, joint_inputs: Any, **kwargs: Any
                       ) -> tuple[fx.GraphModule, fx.GraphModule]:
    """What Inductor does at the partition: its joint-graph passes (canonicalisation,
    pattern rewrites, random ops made seedable), then the min-cut partitioner. Inductor's
    lowering relies on those passes having run.

    A joint graph whose ``meta[PARTITION_SEARCH]`` holds a search (swap_recompute's
    ``BudgetedMinCut`` under a fraction budget) is partitioned by it: after the joint-graph
    passes, it calls ``partition(copy, budget)``, the min-cut of a copy of the graph under
    functorch's ``activation_memory_budget=budget`` (None: no budget), as often as it needs."""
    from torch._inductor import compile_fx

    search = joint.meta.get(PARTITION_SEARCH)
    inductor_partition_fn = getattr(compile_fx, "partition_fn", None)
    if search is None and inductor_partition_fn is not None:
        # a random op recomputed in the backward (dropout or SDPA inside the user's
        # torch.utils.checkpoint) is replayed through the RNG wrappers, as in min-cut's
        return _with_rng_wrapper_values(inductor_partition_fn(joint, joint_inputs, **kwargs))

    def min_cut(gm: fx.GraphModule, inputs: Any, **options: Any
                ) -> tuple[fx.GraphModule, fx.GraphModule]:
        if search is None:
            return min_cut_partition(gm, inputs, compiler="inductor", **options)

        def partition(copy: fx.GraphModule, budget: float | None
                      ) -> tuple[fx.GraphModule, fx.GraphModule]:
            with (activation_memory_budget(budget) if budget is not None
                  else contextlib.nullcontext()):
                return min_cut_partition(copy, inputs, compiler="inductor", **options)

        return search(gm, partition)

    if inductor_partition_fn is not None and "partitioner_fn_override" in \
            inspect.signature(inductor_partition_fn).parameters:
        return inductor_partition_fn(joint, joint_inputs, partitioner_fn_override=min_cut,
                                     **kwargs)
    joint = compile_fx._recursive_joint_graph_passes(joint)  # older torch: no hook
    return min_cut(joint, joint_inputs, **kwargs)


def inductor_inference_passes(gm: fx.GraphModule) -> fx.GraphModule:
    """Inductor runs its joint-graph passes on an inference graph before lowering it."""
    from torch._inductor.compile_fx import _recursive_joint_graph_passes

    return _recursive_joint_graph_passes(gm)


def inductor_graph_context(example_inputs: Sequence[Any]) -> contextlib.AbstractContextManager:
    """The context Inductor's own ``compile_fx`` sets around AOTAutograd: its virtualized
    fake mode. Inductor's joint-graph passes (run at the partition and on an inference
    graph) read it, e.g. ``fuse_seed_creation_pass`` makes the fused seeds' metadata under
    ``V.fake_mode``; without it they fail on any graph with dropout."""
    from torch._inductor.virtualized import V
    from torch._subclasses.fake_tensor import FakeTensorMode

    fake_mode = fake_mode_of(example_inputs) or FakeTensorMode(allow_non_fake_inputs=True)
    return V.set_fake_mode(fake_mode)


def inductor_decompositions() -> dict[Any, Callable[..., Any]]:
    """Inductor's decomposition table. Some decompositions (max_pool2d's) consult
    ``torch._inductor.lowering``, which only Inductor's own compile imports: without this
    import a model whose first Inductor compile is fxopt's fails while tracing."""
    import torch._inductor.lowering  # noqa: F401
    from torch._inductor.decomposition import select_decomp_table

    return select_decomp_table()


def inductor_compile(gm: fx.GraphModule, example_inputs: Sequence[Any], *,
                     is_backward: bool, is_inference: bool, max_autotune: bool,
                     layout_optimization: bool = True, model_outputs: int | None = None
                     ) -> Callable[..., Any]:
    """Inductor's code generation for one final forward or backward graph (boxed).
    ``layout_optimization=False`` keeps convolutions in their tensors' own layout (see
    ``Backend._inductor``). ``model_outputs``: how many outputs the Dynamo graph has (a
    forward's first ones after its mutated inputs are the user's), see
    :func:`_mark_user_visible_outputs`."""
    from torch._inductor import config as inductor_config
    from torch._inductor.compile_fx import compile_fx_inner

    _mark_user_visible_outputs(gm, is_backward, is_inference, model_outputs)
    patch = {"max_autotune": max_autotune}
    if not layout_optimization:
        patch["layout_optimization"] = False
    with inductor_config.patch(patch):
        return compile_fx_inner(gm, list(example_inputs), is_backward=is_backward,
                                is_inference=is_inference)


def _mark_user_visible_outputs(gm: fx.GraphModule, is_backward: bool, is_inference: bool,
                               model_outputs: int | None) -> None:
    """Tell Inductor which of the graph's outputs the user sees, as torch.compile's own
    forward and backward compilers do: those keep eager's strides, and the others (the
    activations saved for backward) may take any layout. Without the mark Inductor treats
    every output as internal, so with padding on (its default on CUDA) a user's output,
    GPT-2's 50257-wide logits say, comes back in a padded layout, and a gradient in
    another layout than its parameter's, which autograd copies."""
    from torch._inductor import config as inductor_config

    output = next(iter(gm.graph.find_nodes(op="output")))
    leaves = tree_leaves(output.args)
    if is_backward:
        visible = (range(len(leaves)) if getattr(inductor_config, "bw_outputs_user_visible",
                                                 True) else range(0))
    elif model_outputs is None or not getattr(inductor_config, "keep_output_stride", True):
        visible = range(0)
    else:
        context = torch._guards.TracingContext.try_get()
        start = (context.fw_metadata.num_mutated_inp_runtime_indices
                 if context is not None and context.fw_metadata and not is_inference else 0)
        visible = range(start, min(start + model_outputs, len(leaves)))
    output.meta["user_visible_output_idxs"] = [i for i in visible
                                               if isinstance(leaves[i], fx.Node)]


class _BoxedCodeGen(CodeGen):
    """fx codegen for AOTAutograd's boxed calling convention: the generated function takes
    the argument list and clears it, so each input is freed at its last use inside the
    graph (fx's code already drops every local after its last use). Without this, the
    caller's list would keep saved activations alive through the whole backward."""

    def gen_fn_def(self, free_vars: list[str], maybe_return_annotation: str,
                   **kwargs: Any) -> str:
        names = [v.split(":")[0].split("=")[0].strip() for v in free_vars if v != "self"]
        lines = [f"def forward(self, args_list){maybe_return_annotation}:"]
        if names:
            lines.append(f"    {', '.join(names)}, = args_list")
            lines.append("    args_list.clear()")
        return "\n".join(lines)


def boxed_fx_callable(gm: fx.GraphModule) -> Callable[[list[Any]], Any]:
    """fxopt's default code generation: the graph's own Python code, boxed."""
    gm.graph.set_codegen(_BoxedCodeGen())
    gm.recompile()
    # A lazy graph module (AOTAutograd's) generates its code at the first call and routes
    # every later call through a recompile check and Module.__call__: generate it now and
    # call the generated forward directly.
    getattr(gm, "real_recompile", lambda: None)()
    forward = gm.forward

    def run(args: list[Any]) -> Any:
        return forward(args)

    run._boxed_call = True  # type: ignore[attr-defined]
    run.graph_module = gm  # type: ignore[attr-defined]
    return run


def copy_graph(graph: fx.Graph) -> fx.Graph:
    """A copy of ``graph`` with shallow copies of node meta. Unlike ``copy.deepcopy`` it
    shares the codegen (a pytree spec for AOTAutograd's joint graph, which deepcopy copies
    through a deprecated path and warns); codegens are replaced, never mutated."""
    new = fx.Graph(tracer_cls=graph._tracer_cls)
    copied = new.graph_copy(graph, {}, return_output_node=True)
    new._codegen = graph._codegen
    if copied is not None:
        value, old_output = copied
        output = new.output(value, type_expr=getattr(old_output, "type", None))
        output.meta = copy.copy(old_output.meta)
    return new


# What Dynamo leaves on its graph module beside the graph: AOTAutograd reads the first two
# (its frontend takes a module without them for an exported one, whose parameters are not
# static inputs: Inductor's min-cut then partitions differently, BERT's step peaking 1.5%
# higher); the reason is Dynamo's, for its debugging backends
_DYNAMO_MODULE_ATTRIBUTES = ("_param_name_to_source", "_source_to_user_stacks",
                             "compile_subgraph_reason")


def copy_graph_module(gm: fx.GraphModule) -> fx.GraphModule:
    """A copy whose graph can be rewritten freely: node meta is copied shallowly (fake
    values are shared, never mutated), attributes and submodules are shared with ``gm``,
    and a Dynamo graph keeps what Dynamo recorded on it (the sources of its parameters and
    placeholders, as torch's own DDP graph splitter carries them over), so AOTAutograd
    treats the copy as the Dynamo graph it is."""
    new = fx.GraphModule(gm, copy_graph(gm.graph), gm.__class__.__name__)
    new.meta = dict(gm.meta)
    for name in _DYNAMO_MODULE_ATTRIBUTES:
        if hasattr(gm, name):
            setattr(new, name, getattr(gm, name))
    sources = {node.name: node._dynamo_source
               for node in gm.graph.find_nodes(op="placeholder")
               if hasattr(node, "_dynamo_source")}
    for node in new.graph.find_nodes(op="placeholder"):
        if node.name in sources:
            node._dynamo_source = sources[node.name]
    return new


def softmax_backward(grad: torch.Tensor, output: torch.Tensor, dim: int,
                     input_dtype: torch.dtype) -> torch.Tensor:
    """ATen's fused softmax backward from softmax's output (``_softmax_backward_data``)."""
    return torch.ops.aten._softmax_backward_data(grad, output, dim, input_dtype)


@functools.cache
def decomposed_lstm_states_misshapen() -> bool:
    """Whether torch's own decomposition of ``nn.LSTM`` (what Dynamo's fake tensors and
    AOTAutograd trace a call through wherever oneDNN does not run it: training, CUDA,
    ``proj_size``) returns ``h_n`` and ``c_n`` with an extra dimension, (layers, 1, batch,
    hidden) where eager's are (layers, batch, hidden). torch 2.11 and 2.12's do (their
    ``one_layer_lstm`` squeezes dim 1, not 0), so plain ``torch.compile`` under
    ``allow_rnn`` returns misshapen states there; 2.13 fixed it. Read by running it once on
    a batch of 2, where a wrong squeeze leaves the extra dimension."""
    from torch._decomp import decompositions

    one_layer = getattr(decompositions, "one_layer_lstm", None)
    if one_layer is None:
        return False
    batch, hidden = 2, 3
    states = (torch.zeros(batch, hidden), torch.zeros(batch, hidden))
    params = [torch.zeros(4 * hidden, 1), torch.zeros(4 * hidden, hidden)]
    with torch.no_grad():
        _, (h_n, _) = one_layer(torch.zeros(1, batch, 1), states, params, False)
    return h_n.dim() != 2


def op_alias_sets(op: Any) -> tuple[list[tuple[str, frozenset[str], bool]],
                                     list[frozenset[str]]]:
    """An op's schema alias sets: per argument (name, alias set, written?), per return
    its alias set. torch's own schema parser reads the set of a list return such as
    split's ``Tensor(a)[]``, which ``FunctionSchema.returns[i].alias_info`` leaves empty;
    without the parser, such a return is taken to alias the first aliased argument."""
    try:
        from torch.utils._python_dispatch import get_alias_info
    except ImportError:
        get_alias_info = None
    if get_alias_info is not None:
        info = get_alias_info(op)
        return ([(a.name, frozenset(a.alias_set), bool(a.is_write)) for a in info.args],
                [frozenset(r.alias_set) for r in info.outs])
    schema = op._schema
    args = [(a.name, frozenset(a.alias_info.before_set) if a.alias_info else frozenset(),
             bool(a.alias_info and a.alias_info.is_write)) for a in schema.arguments]
    first_aliased = next((sets for _, sets, _ in args if sets), frozenset())
    outs = [frozenset(r.alias_info.before_set) or first_aliased if r.alias_info
            else frozenset() for r in schema.returns]
    return args, outs


def is_symbolic(value: Any) -> bool:
    return isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool))


def autograd_dispatch_restored() -> Any:
    """A context in which autograd records again inside a custom op's kernel.

    ``torch.library``'s autograd wrapper runs an op's kernel with the autograd dispatch keys
    excluded (``_AutoDispatchBelowAutograd``), so ``torch.enable_grad()`` alone records
    nothing there. A kernel that runs a library function with its own autograd graph (the
    fused RNN that :mod:`fxopt.kernels.recompute_rnn` replays) lifts that exclusion for its
    body; everything else in the thread's dispatch state is kept."""
    keys = torch._C.DispatchKey
    exclude = torch._C._dispatch_tls_local_exclude_set()
    for key in (keys.AutogradFunctionality, keys.AutogradOther, keys.AutogradNestedTensor,
                keys.ADInplaceOrView):
        exclude = exclude.remove(key)  # only what the wrapper excluded: autocast stays as is
    return torch._C._ForceDispatchKeyGuard(torch._C._dispatch_tls_local_include_set(), exclude)


def inductor_generates_triton(device: torch.device) -> bool:
    """Whether Inductor generates Triton (not C++) for graphs on ``device``: on a GPU, or
    on the CPU where its ``cpu_backend`` says so (:func:`inductor_triton_code_on_cpu`)."""
    from torch._inductor import config as inductor_config

    return device.type != "cpu" or inductor_config.cpu_backend == "triton"


class _TritonCodeCaptured(Exception):
    """Raised where Inductor would load a graph's generated code, once it is recorded."""


@contextlib.contextmanager
def inductor_triton_code_on_cpu() -> Iterator[list[tuple[str, bool]]]:
    """Inside, Inductor generates Triton code (the code generator it uses on CUDA) for the
    CPU graphs it compiles, and each graph's output code (its kernels, their launches, the
    extern GEMM calls, and Inductor's own estimate of each kernel's bytes,
    ``kernel_num_gb``) is appended to the yielded list, with whether the graph is a
    backward (Inductor's ``is_backward``), instead of being loaded; the graph
    then runs as its uncompiled fx code, so a training step completes. No Triton driver is
    needed: nothing generated is compiled. Inductor's caches are off inside (a cached
    graph would skip the code generation). Compile with :func:`inductor_compile` (fxopt's
    Inductor path) or :func:`inductor_backend` (plain ``torch.compile``'s)."""
    import torch.utils._triton as triton_utils
    from torch._functorch import config as functorch_config
    from torch._inductor import codecache
    from torch._inductor import compile_fx as compile_fx_module
    from torch._inductor import config as inductor_config

    sources: list[tuple[str, bool]] = []
    compiling_backward = [False]  # the graph compile_and_capture is compiling
    real_compile = compile_fx_module.compile_fx_inner

    def record(cls: Any, key: str, path: str, *args: Any, **kwargs: Any) -> Any:
        with open(path) as file:
            sources.append((file.read(), compiling_backward[0]))
        raise _TritonCodeCaptured(path)

    def compile_and_capture(gm: fx.GraphModule, example_inputs: Sequence[Any],
                            **kwargs: Any) -> Any:
        fallback = fx.GraphModule(gm, copy_graph(gm.graph))  # Inductor's passes edit gm
        compiling_backward[0] = bool(kwargs.get("is_backward", False))
        try:
            return real_compile(gm, example_inputs, **kwargs)
        except Exception as error:
            cause: BaseException | None = error
            while cause is not None and not isinstance(cause, _TritonCodeCaptured):
                cause = cause.__cause__ or cause.__context__
            if cause is None:
                raise
        return boxed_fx_callable(fallback)

    # one compile thread: with a warm worker pool Inductor hands each kernel to the pool
    # as it generates it (and, under TRITON_INTERPRET, loads it here), which compiles it
    patches = {"cpu_backend": "triton", "benchmark_kernel": True, "fx_graph_cache": False,
               "compile_threads": 1}
    autograd_cache = getattr(functorch_config, "enable_autograd_cache", None)
    saved = (codecache.PyCodeCache.__dict__["load_by_key_path"],
             triton_utils.triton_hash_with_backend)
    with inductor_config.patch(patches):
        codecache.PyCodeCache.load_by_key_path = classmethod(record)
        triton_utils.triton_hash_with_backend = lambda: "0" * 64
        compile_fx_module.compile_fx_inner = compile_and_capture
        if autograd_cache is not None:
            functorch_config.enable_autograd_cache = False
        try:
            yield sources
        finally:
            codecache.PyCodeCache.load_by_key_path = saved[0]
            triton_utils.triton_hash_with_backend = saved[1]
            compile_fx_module.compile_fx_inner = real_compile
            if autograd_cache is not None:
                functorch_config.enable_autograd_cache = autograd_cache


def inductor_backend(gm: fx.GraphModule, example_inputs: Sequence[Any]) -> Any:
    """Plain ``torch.compile``'s backend, with the per-graph compiler looked up at the
    call (so :func:`inductor_triton_code_on_cpu` reaches it, where ``compile_fx``'s
    default argument was bound at import)."""
    from torch._inductor import compile_fx as compile_fx_module

    return compile_fx_module.compile_fx(gm, example_inputs,
                                        inner_compile=compile_fx_module.compile_fx_inner)
