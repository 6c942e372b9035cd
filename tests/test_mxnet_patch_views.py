"""The per-key host-view cache of the dist_byteps store (no cluster needed)."""
import mxnet as mx
import numpy as np

from mxnet_patch.kvstore import _ViewCache


def handles(arrays):
    return tuple(a.handle.value for a in arrays)


def test_same_arrays_reuse_views_and_see_current_values():
    cache = _ViewCache()
    arrays = [mx.nd.ones((4,)), mx.nd.zeros((4,))]
    mx.nd.waitall()
    first = cache.host_views(7, handles(arrays), arrays)
    arrays[0][:] = 5
    mx.nd.waitall()
    again = cache.host_views(7, handles(arrays), arrays)
    assert again is first and again[0][0] == 5


def test_other_shape_or_dtype_rebuilds():
    cache = _ViewCache()
    a = mx.nd.ones((4,))
    mx.nd.waitall()
    views = cache.host_views(1, handles([a]), [a])
    b = mx.nd.ones((2, 2), dtype="float16")
    mx.nd.waitall()
    rebuilt = cache.host_views(1, handles([b]), [b])
    assert rebuilt is not views and rebuilt[0].shape == (2, 2)
    assert rebuilt[0].dtype == np.float16
