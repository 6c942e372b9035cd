"""The per-key host-view cache of the dist_byteps store (no cluster needed)."""
import mxnet as mx
import numpy as np

from mxnet_patch.pushpull_ops import _ViewCache


def test_same_arrays_reuse_views_and_see_current_values():
    cache = _ViewCache()
    arrays = [mx.nd.ones((4,)), mx.nd.zeros((4,))]
    mx.nd.waitall()
    first = cache.host_views(7, arrays)
    arrays[0][:] = 5
    mx.nd.waitall()
    again = cache.host_views(7, list(arrays))
    assert again is first and again[0][0] == 5


def test_other_arrays_rebuild_even_at_a_reused_address():
    cache = _ViewCache()
    a = mx.nd.ones((4,))
    mx.nd.waitall()
    views = cache.host_views(1, [a])
    b = mx.nd.ones((2, 2), dtype="float16")
    mx.nd.waitall()
    rebuilt = cache.host_views(1, [b])
    assert rebuilt is not views and rebuilt[0].shape == (2, 2)
    assert rebuilt[0].dtype == np.float16
    # an array with the same shape (possibly the memory of a freed one): its own views
    c = mx.nd.full((2, 2), 3, dtype="float16")
    mx.nd.waitall()
    assert cache.host_views(1, [c])[0][0, 0] == 3


def test_the_cache_keeps_its_arrays_alive():
    cache = _ViewCache()
    cache.host_views(3, [mx.nd.full((8,), 2)])     # the caller drops its reference
    mx.nd.waitall()
    junk = [mx.nd.full((8,), 9) for _ in range(50)]   # would reuse freed memory
    mx.nd.waitall()
    assert cache[3].views[0][0] == 2 and len(junk) == 50


def test_a_slice_of_a_host_view_keeps_its_array_and_memory_alive():
    # A push's frame is a slice of a host view; with PS_RESEND the resender keeps the message
    # after the engine operation completed and the script dropped the array. The frame must
    # still read the array's bytes, not memory MXNet freed (and another array reused, or the
    # allocator unmapped: that read crashed workers under ACK loss).
    from mxnet_patch.engine_async import host_view
    n = 1 << 20                                  # 4 MB: the allocator gives such blocks back
    source = mx.nd.full((n,), 7)
    mx.nd.waitall()
    frame = memoryview(host_view(source)[n // 2:])
    del source
    mx.nd.waitall()
    junk = [mx.nd.full((n,), 3) for _ in range(4)]   # would reuse freed memory
    mx.nd.waitall()
    assert np.all(np.frombuffer(frame, np.float32) == 7) and len(junk) == 4


def test_a_keys_engine_operands_are_rebuilt_for_other_arrays_or_another_split():
    from mxnet_patch.pushpull_ops import _KeyCall
    grad, out, other = mx.nd.ones((4,)), mx.nd.zeros((4,)), mx.nd.zeros((4,))
    call = _KeyCall(5, [grad], [out])
    assert call.made_for([grad], [out]) and not call.on_gpu
    assert call.operands.const_count == 1 and call.operands.mutable_count == 1
    assert call.operands.name == b"byteps_pushpull_5"
    assert not call.made_for([grad], [other])          # another output: its own operands
    assert not call.made_for([grad, out], [])           # the same arrays split otherwise
    in_place = _KeyCall(5, [grad], [grad])              # read and written: only written
    assert in_place.operands.const_count == 0 and in_place.operands.mutable_count == 1
    assert in_place.made_for([grad], [grad])
