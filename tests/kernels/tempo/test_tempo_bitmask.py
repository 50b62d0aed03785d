"""pack_bits' multiply path (8 elements per int64 multiply) against plain shift-and-sum
packing: lengths with and without a tail, all ones (products past int64's sign bit), a mask
viewed at an odd offset, and a non-bool 0/1 tensor."""

import pytest
import torch

from fxopt.kernels.tempo.bitmask import _pack_bytes, pack_bits, unpack_bits


@pytest.mark.parametrize("numel", [8, 13, 64, 1029])
def test_pack_bits_equals_shift_and_sum(numel):
    generator = torch.Generator().manual_seed(numel)
    for mask in (torch.rand(numel, generator=generator) > 0.5,
                 torch.ones(numel, dtype=torch.bool),
                 (torch.rand(numel + 3, generator=generator) > 0.5)[3:],
                 (torch.rand(numel, generator=generator) > 0.5).to(torch.int32)):
        packed = pack_bits(mask)
        assert torch.equal(packed, _pack_bytes(mask.to(torch.uint8)))
        assert torch.equal(unpack_bits(packed, mask.shape), mask.bool())
