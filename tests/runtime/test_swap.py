"""The swap runtime's custom ops and host buffer pool (CPU; the CUDA path has a gpu test)."""

import gc

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from fxopt.runtime import HostBufferPool, runtime

ops = torch.ops.fxopt


def _offload(x):
    return ops.swap_offload_finish(ops.swap_offload_start(x), x, [])


def _round_trip(x, device):
    host = _offload(x)
    token = ops.swap_prefetch_start(host, device, [])
    return host, ops.swap_prefetch_wait(token, host, device, [])


def test_round_trip_keeps_values_strides_and_dtype():
    x = torch.randn(6, 7).t()  # not contiguous: the copy keeps the strides
    host, back = _round_trip(x, x.device)
    assert host.device.type == "cpu" and host.stride() == x.stride()
    assert back.stride() == x.stride() and back.dtype == x.dtype
    torch.testing.assert_close(back, x, rtol=0, atol=0)
    assert back.untyped_storage().data_ptr() != x.untyped_storage().data_ptr()
    assert runtime.in_flight == 0


def test_a_prefetch_is_consumed_once_and_a_dropped_token_frees_its_slot():
    x = torch.randn(5)
    offload = ops.swap_offload_start(x)
    host = ops.swap_offload_finish(offload, x, [])
    with pytest.raises(RuntimeError, match="never started or was already consumed"):
        ops.swap_offload_finish(offload, x, [])
    token = ops.swap_prefetch_start(host, x.device, [])
    ops.swap_prefetch_wait(token, host, x.device, [])
    with pytest.raises(RuntimeError, match="never started or was already consumed"):
        ops.swap_prefetch_wait(token, host, x.device, [])
    unused = ops.swap_prefetch_start(host, x.device, [])
    assert runtime.in_flight == 1
    del unused
    gc.collect()
    assert runtime.in_flight == 0


def test_pool_reuses_a_buffer_once_its_tensor_dies():
    pool = HostBufferPool()
    like = torch.empty(3, 4)
    first = pool.acquire(like, pinned=False)
    second = pool.acquire(like, pinned=False)  # the first is still alive: a new buffer
    pointers = {t.untyped_storage().data_ptr() for t in (first, second)}
    assert pool.allocations == 2 and len(pointers) == 2
    del first, second
    gc.collect()
    third = pool.acquire(like, pinned=False)
    assert pool.allocations == 2 and third.untyped_storage().data_ptr() in pointers
    assert pool.acquire(torch.empty(2), pinned=False).shape == (2,)
    assert pool.allocations == 3


def test_fake_implementations_give_shapes_devices_and_strides():
    with FakeTensorMode():
        x = torch.empty(4, 6).t()
        offload = ops.swap_offload_start(x)
        host = ops.swap_offload_finish(offload, x, [x])
        token = ops.swap_prefetch_start(host, torch.device("cpu"), [])
        back = ops.swap_prefetch_wait(token, host, torch.device("cpu"), [])
    assert host.device.type == "cpu" and host.stride() == x.stride()
    assert offload.shape == token.shape == (1,) and token.dtype == torch.int64
    assert back.shape == x.shape and back.stride() == x.stride()


@pytest.mark.gpu
def test_cuda_round_trip_is_pinned_and_stream_ordered():
    x = torch.randn(1024, 1024, device="cuda")
    expected = x.clone()
    offload = ops.swap_offload_start(x)
    expected @ expected  # compute while the copy runs
    host = ops.swap_offload_finish(offload, x, [])
    del x  # the compute stream waited for the copy at finish: reuse is ordered after it
    torch.randn(1024, 1024, device="cuda")  # may reuse freed blocks; must not clobber
    token = ops.swap_prefetch_start(host, torch.device("cuda"), [])
    back = ops.swap_prefetch_wait(token, host, torch.device("cuda"), [])
    assert host.is_pinned()
    torch.testing.assert_close(back, expected, rtol=0, atol=0)
