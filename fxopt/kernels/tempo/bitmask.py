"""Bit-packed boolean masks: 1 bit per element, 8x smaller than torch's bool (1 byte).

Tempo's GELU branch mask and the attention dropout mask are saved for backward this way.
Layout: element i of the flattened mask is bit (i % 8) of byte i // 8; the last byte is
zero-padded. The Triton kernels in this package read and write the same layout.
"""

from __future__ import annotations

import torch

__all__ = ["packed_size", "pack_bits", "unpack_bits"]


def packed_size(numel: int) -> int:
    """Bytes that hold ``numel`` bits (works on SymInts too)."""
    return (numel + 7) // 8


def _bit_weights(device: torch.device) -> torch.Tensor:
    return torch.arange(8, device=device, dtype=torch.uint8)


def pack_bits(mask: torch.Tensor) -> torch.Tensor:
    """A bool tensor as a flat uint8 tensor of ``packed_size(mask.numel())`` bytes."""
    flat = mask.reshape(-1).to(torch.uint8)
    padding = packed_size(flat.numel()) * 8 - flat.numel()
    if padding:
        flat = torch.cat([flat, flat.new_zeros(padding)])
    return (flat.view(-1, 8) << _bit_weights(mask.device)).sum(1, dtype=torch.uint8)


def unpack_bits(packed: torch.Tensor, shape: torch.Size | tuple[int, ...]) -> torch.Tensor:
    """The bool tensor of ``shape`` that :func:`pack_bits` packed."""
    numel = 1
    for size in shape:
        numel *= size
    bits = (packed.unsqueeze(1) >> _bit_weights(packed.device)) & 1
    return bits.reshape(-1)[:numel].view(shape).bool()
