"""The callable a fused region becomes in the graph: allocates its outputs, launches.

:class:`FusedPointwise` is called by the graph's fx code with the region's tensor inputs and
returns a tuple of fresh outputs, each allocated with the shape and strides the replaced
node recorded (``meta["val"]``), so what follows in the graph sees the same layout as
before. Its layout (which tensor is read linearly, which by strides) is worked out per call
from the actual tensors, so a tensor whose strides differ from the recorded ones is still
read correctly; each new layout gets its kernel from the cache.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch

from fxopt.kernels import triton_interpreting
from fxopt.kernels.fuse_elementwise.triton_source import Layout, Program, get_kernel

__all__ = ["FusedPointwise", "broadcast_strides", "layout_for"]

_INT32_LIMIT = 2**31 - 1


def contiguous_strides(shape: Sequence[int]) -> tuple[int, ...]:
    strides, step = [], 1
    for size in reversed(shape):
        strides.append(step)
        step *= size
    return tuple(reversed(strides))


def broadcast_strides(tensor_shape: Sequence[int], tensor_strides: Sequence[int],
                      shape: Sequence[int]) -> tuple[int, ...]:
    """Strides that read a tensor broadcast to ``shape`` (0 along broadcast dims)."""
    lead = len(shape) - len(tensor_shape)
    strides = [0] * lead
    for size, stride, full in zip(tensor_shape, tensor_strides, shape[lead:]):
        strides.append(stride if size == full and full != 1 else 0)
    return tuple(strides)


def _is_linear(strides: Sequence[int], shape: Sequence[int]) -> bool:
    return all(s == c for s, c, n in zip(strides, contiguous_strides(shape), shape) if n != 1)


def _reach(strides: Sequence[int], shape: Sequence[int]) -> int:
    return sum(abs(s) * (n - 1) for s, n in zip(strides, shape))


def layout_for(shape: Sequence[int], input_strides: Sequence[Sequence[int]],
               output_strides: Sequence[Sequence[int]]) -> Layout:
    """The layout of one call: inputs' strides already broadcast to ``shape``."""
    numel = math.prod(shape)
    every = [*input_strides, *output_strides]
    wide = numel > _INT32_LIMIT or any(_reach(s, shape) > _INT32_LIMIT for s in every)
    return Layout(ndim=len(shape),
                  strided_inputs=tuple(not _is_linear(s, shape) for s in input_strides),
                  strided_outputs=tuple(not _is_linear(s, shape) for s in output_strides),
                  wide=wide)


class FusedPointwise:
    """One fused region: ``fused(*inputs) -> tuple of outputs``."""

    def __init__(self, program: Program, shape: Sequence[int],
                 output_strides: Sequence[Sequence[int]], name: str) -> None:
        self.program = program
        self.shape = tuple(shape)
        self.output_strides = tuple(tuple(s) for s in output_strides)
        self.__name__ = self.__qualname__ = name  # how fx code names the call
        self._launches: dict[tuple[Any, ...], tuple[Any, list[int]]] = {}

    def __repr__(self) -> str:
        return f"{self.__name__}({len(self.program.instrs)} ops)"

    def __call__(self, *inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        device = inputs[0].device
        outputs = tuple(torch.empty_strided(self.shape, strides, dtype=dtype, device=device)
                        for strides, dtype in zip(self.output_strides,
                                                  self.program.output_dtypes))
        numel = math.prod(self.shape)
        if numel == 0:
            return outputs
        key = tuple((tuple(t.shape), t.stride()) for t in inputs)
        if key not in self._launches:  # once per input layout, not per call
            self._launches[key] = self._prepare(inputs)
        kernel, extra = self._launches[key]
        args = [*inputs, *outputs, numel, *extra]
        if triton_interpreting():
            block = min(1024, 1 << max(numel - 1, 0).bit_length())
            kernel[(-(-numel // block),)](*args, BLOCK=block)
        else:
            kernel[lambda meta: (-(-numel // meta["BLOCK"]),)](*args)
        return outputs

    def _prepare(self, inputs: Sequence[torch.Tensor]) -> tuple[Any, list[int]]:
        """The kernel for these inputs' layout and the size and stride arguments after
        ``numel`` (sizes and strides of the tensors read or written by index arithmetic)."""
        in_strides = [broadcast_strides(t.shape, t.stride(), self.shape) for t in inputs]
        layout = layout_for(self.shape, in_strides, self.output_strides)
        kernel, _ = get_kernel(self.program, layout)
        extra = list(self.shape[1:]) if layout.any_strided else []
        for strides, strided in zip([*in_strides, *self.output_strides],
                                    [*layout.strided_inputs, *layout.strided_outputs]):
            if strided:
                extra += list(strides)
        return kernel, extra
