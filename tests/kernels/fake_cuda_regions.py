"""The kernels fuse_elementwise generates for a model's CUDA graph, captured on a CPU-only
torch: what the AOT check (fxopt.kernels.aot) must compile besides the CPU graph's.

A CUDA graph differs from the CPU one where it matters to the generator: CUDA autocast
casts other ops than CPU autocast (``pow``, ``exp``, ``layer_norm``, ``softmax`` run in
fp32 on CUDA, so GPT-2's tanh GELU mixes bf16 and fp32), and SDPA is a fused kernel (flash
or memory-efficient attention), not the math decomposition. A CPU-only build cannot run
autograd on CUDA tensors (no CUDA device guard), so the capture has two steps:

1. Dynamo captures the model's graphs on the CPU (real tensors). Each is rewritten for a
   CUDA trace (devices, SDPA as CUDA would choose it, factory calls lifted to inputs) and
   traced by ``make_fx`` on fake CUDA tensors under CUDA autocast, with no gradients: an
   aten graph whose casts are CUDA autocast's.
2. That graph, relabelled to the CPU, goes through ``fxopt.backend(fuse_elementwise=True)``
   with gradients, which partitions it into a forward and a backward and generates their
   kernels (the backward compiled at once, not at the first ``backward()``).

What differs from a real CUDA compile: the backward is traced without autocast, where a
CUDA compile traces it under the ambient autocast (AOTAutograd's ``backward_pass_autocast``
"same_as_forward"); the backward's ops see the dtypes the forward's casts chose, so only
backward ops on autocast's lists fed mixed dtypes could differ. A graph whose CUDA trace
fails on this build is skipped and named in the result, never silently.
"""

from __future__ import annotations

import contextlib
import operator
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.fx as fx
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.proxy_tensor import make_fx

import fxopt
from fxopt.kernels.fuse_elementwise import triton_source

CUDA = torch.device("cuda", 0)
aten = torch.ops.aten


def _sdpa(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
          enable_gqa=False):
    """SDPA as CUDA dispatches it on an H100: flash attention for fp16/bf16 without a
    mask, memory-efficient attention otherwise."""
    if enable_gqa and k.shape[-3] != q.shape[-3]:
        k = k.repeat_interleave(q.shape[-3] // k.shape[-3], dim=-3)
        v = v.repeat_interleave(q.shape[-3] // v.shape[-3], dim=-3)
    if attn_mask is None and q.dtype in (torch.float16, torch.bfloat16):
        return aten._scaled_dot_product_flash_attention(q, k, v, dropout_p, is_causal,
                                                        scale=scale)[0]
    if attn_mask is not None and attn_mask.dtype == torch.bool:
        attn_mask = torch.zeros_like(attn_mask, dtype=q.dtype).masked_fill(
            ~attn_mask, float("-inf"))
    return aten._scaled_dot_product_efficient_attention(q, k, v, attn_mask, True, dropout_p,
                                                        is_causal, scale=scale)[0]


def _slices(x, index):
    """``x[index]`` for an index of slices, None and Ellipsis, as aten calls (a CUDA
    tensor's ``__getitem__`` initializes CUDA, which a CPU-only build cannot)."""
    if Ellipsis in index:
        at = index.index(Ellipsis)
        taken = sum(i is not None and i is not Ellipsis for i in index)
        index = index[:at] + (slice(None),) * (x.dim() - taken) + index[at + 1:]
    for dim, item in enumerate(index):  # each item is one dimension of the result
        if item is None:
            x = aten.unsqueeze.default(x, dim)
        elif item != slice(None):
            stop = x.shape[dim] if item.stop is None else item.stop
            x = aten.slice.Tensor(x, dim, item.start or 0, stop, item.step or 1)
    return x


def _contiguous(x):
    return x if x.is_contiguous() else aten.clone.default(
        x, memory_format=torch.contiguous_format)


def _is_slicing(node: fx.Node) -> bool:
    return (node.target is operator.getitem and isinstance(node.args[1], tuple)
            and all(i is None or i is Ellipsis or isinstance(i, slice) for i in node.args[1]))


def _for_cuda(gm: fx.GraphModule, mode: FakeTensorMode) -> list[torch.Tensor]:
    """Rewrite a Dynamo graph captured on the CPU for a trace on fake CUDA tensors; returns
    the fake values of the factory calls it lifted to new trailing inputs."""
    lifted, last = [], [n for n in gm.graph.nodes if n.op == "placeholder"][-1]
    for node in list(gm.graph.nodes):
        if node.target is torch._C._nn.scaled_dot_product_attention:
            node.target = _sdpa
        elif node.op == "call_function" and _is_slicing(node):
            node.target = _slices
        elif (node.op == "call_function" and "device" in node.kwargs
              and not any(isinstance(a, fx.Node) for a in node.args)):
            with mode:  # factories: made here, where the fake mode allows a CUDA device
                lifted.append(node.target(*node.args, **{**node.kwargs, "device": CUDA}))
            with gm.graph.inserting_after(last):
                last = gm.graph.placeholder(f"{node.name}_lifted")
            node.replace_all_uses_with(last)
            gm.graph.erase_node(node)
        elif node.op == "call_method" and node.target == "contiguous" and not node.kwargs:
            # Tensor.contiguous() on a CUDA tensor asks for a device guard; clone does not
            node.op, node.target = "call_function", _contiguous
        elif node.op == "call_method" and node.target == "to":
            # everything is on the device already: keep only a dtype conversion
            args = tuple(a for a in node.args[1:] if not isinstance(a, torch.device))
            kwargs = {k: v for k, v in node.kwargs.items() if k != "device"}
            if args or kwargs:
                node.args, node.kwargs = (node.args[0], *args), kwargs
            else:
                node.replace_all_uses_with(node.args[0])
                gm.graph.erase_node(node)
    gm.recompile()
    return lifted


def _on_cpu(gm: fx.GraphModule) -> fx.GraphModule:
    def relabel(x: Any) -> Any:
        return torch.device("cpu") if isinstance(x, torch.device) else x

    for node in gm.graph.nodes:
        node.args = fx.node.map_aggregate(node.args, relabel)
        node.kwargs = fx.node.map_aggregate(node.kwargs, relabel)
    gm.recompile()
    return gm


@contextlib.contextmanager
def _cuda_autocast(dtype: torch.dtype | None) -> Iterator[None]:
    """CUDA autocast's dispatch on fake CUDA tensors (``torch.autocast("cuda")`` refuses
    to turn on without a GPU; the dispatcher's autocast kernels do not mind)."""
    if dtype is None:
        yield
        return
    before = torch.is_autocast_enabled("cuda"), torch.get_autocast_dtype("cuda")
    torch.set_autocast_enabled("cuda", True)
    torch.set_autocast_dtype("cuda", dtype)
    try:
        yield
    finally:
        torch.set_autocast_enabled("cuda", before[0])
        torch.set_autocast_dtype("cuda", before[1])


def capture_dynamo_graphs(run: Callable[[], Any]) -> list[tuple[fx.GraphModule, list[Any]]]:
    """The Dynamo graphs (and example inputs) of ``run()``, which calls a model compiled
    with the backend it is given: ``run(backend)``."""
    graphs = []

    def backend(gm: fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
        graphs.append((gm, list(example_inputs)))
        return gm.forward

    torch._dynamo.reset()
    run(backend)
    return graphs


def cuda_regions(run: Callable[[Any], Any], autocast: torch.dtype | None
                 ) -> tuple[list[tuple[triton_source.Program, triton_source.Layout]], list[str]]:
    """(program, layout) of every kernel fuse_elementwise generates for the CUDA graphs of
    ``run(backend)`` (a forward on the CPU through ``torch.compile(model, backend=...)``,
    under ``torch.autocast("cpu", autocast)`` when set, so tensors passed between graphs
    have the dtypes CUDA autocast gives them), and the graphs skipped, with the reason."""
    import torch._functorch.config as functorch_config

    graphs = capture_dynamo_graphs(run)
    before = set(triton_source.cached_programs())
    backend = fxopt.backend(codegen="fx", fuse_elementwise=True, strict=True)
    skipped = []
    for index, (gm, example_inputs) in enumerate(graphs):
        mode = FakeTensorMode()
        try:
            lifted = _for_cuda(gm, mode)
            with mode:
                fake = [torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=CUDA)
                        if isinstance(t, torch.Tensor) else t for t in example_inputs]
            with _cuda_autocast(autocast):
                traced = make_fx(gm)(*fake, *lifted)
        except Exception as exc:  # noqa: BLE001 (named in the result)
            skipped.append(f"graph {index}: {type(exc).__name__}: {str(exc)[:120]}")
            continue
        inputs = [t.detach().clone().requires_grad_(t.requires_grad)
                  if isinstance(t, torch.Tensor) else t for t in example_inputs]
        inputs += [torch.zeros(t.shape, dtype=t.dtype) for t in lifted]
        try:
            with _patched(functorch_config, force_non_lazy_backward_lowering=True):
                backend(_on_cpu(traced), inputs)
        except Exception as exc:  # noqa: BLE001 (an fxopt failure on the CUDA graph: named)
            skipped.append(f"graph {index}: fxopt failed: {type(exc).__name__}: "
                           f"{str(exc)[:120]}")
    programs = [key for key in triton_source.cached_programs() if key not in before]
    return programs, skipped


@contextlib.contextmanager
def _patched(module: Any, **values: Any) -> Iterator[None]:
    saved = {name: getattr(module, name) for name in values}
    for name, value in values.items():
        setattr(module, name, value)
    try:
        yield
    finally:
        for name, value in saved.items():
            setattr(module, name, value)
