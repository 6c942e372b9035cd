"""Tests of the local reduce: the CPU path here, the NCCL path only where cupy and 2 GPUs exist."""
import numpy as np
import pytest

from kvstore_byteps.engine import reduce
from kvstore_byteps.engine.partition import plan_partitions


def test_cpu_sum_into_separate_buffer_leaves_sources_untouched():
    sources = [np.full((2, 3), value, dtype=np.float32) for value in (1.0, 2.0, 4.5)]
    out = np.empty((2, 3), dtype=np.float32)
    assert reduce.cpu_sum(sources, out) is out
    np.testing.assert_array_equal(out, np.full((2, 3), 7.5, dtype=np.float32))
    assert [float(s[0, 0]) for s in sources] == [1.0, 2.0, 4.5]


def test_cpu_sum_accumulates_in_place_when_out_is_a_source():
    first, second = np.arange(4, dtype=np.float64), np.ones(4)
    reduce.cpu_sum([second, first], first)
    np.testing.assert_array_equal(first, [1.0, 2.0, 3.0, 4.0])
    with pytest.raises(ValueError, match="shape"):
        reduce.cpu_sum([np.ones(3)], np.ones(4))


def test_cpu_sum_per_partition_equals_whole_sum():
    sources = [np.random.default_rng(seed).standard_normal(1001).astype(np.float16)
               for seed in range(3)]
    out = np.zeros(1001, dtype=np.float16)
    for part in plan_partitions(1, out.nbytes, 2, 2, partition_bytes=64).partitions:
        views = [reduce.flat_view(s, part.offset, part.nbytes) for s in sources]
        reduce.cpu_sum(views, reduce.flat_view(out, part.offset, part.nbytes))
    expected = reduce.cpu_sum(sources, np.empty_like(out))
    np.testing.assert_array_equal(out, expected)


def test_flat_view_checks_alignment_and_contiguity():
    array = np.zeros((4, 4), dtype=np.float32)
    assert reduce.flat_view(array, 8, 16).shape == (4,)
    with pytest.raises(ValueError, match="whole"):
        reduce.flat_view(array, 2, 4)
    with pytest.raises(ValueError, match="contiguous"):
        reduce.flat_view(array.T, 0, 4)


def test_host_buffers_are_reused_until_the_size_changes():
    allocations = []

    def allocate(nbytes):
        allocations.append(nbytes)
        return np.empty(nbytes, dtype=np.uint8)

    buffers = reduce.HostBuffers(allocate)
    first = buffers.get("w", (2, 5), np.float32)
    assert first.shape == (2, 5) and first.dtype == np.float32
    assert np.shares_memory(buffers.get("w", (10,), np.float32), first)
    buffers.get("w", (3,), np.float64)
    assert allocations == [40, 24] and len(buffers) == 1


def test_missing_cupy_error_says_how_to_install(monkeypatch):
    import builtins
    real_import = builtins.__import__

    def no_cupy(name, *args, **kwargs):
        if name == "cupy" or name.startswith("cupy."):
            raise ImportError("No module named 'cupy'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_cupy)
    with pytest.raises(reduce.GpuSupportError, match=r"pip install kvstore-byteps\[gpu\]"):
        reduce.import_cupy()
    with pytest.raises(ImportError):   # also an ImportError for callers that expect one
        reduce.NcclLocalReducer([0, 1])


def _two_gpus():
    cupy = pytest.importorskip("cupy")
    pytest.importorskip("cupy.cuda.nccl")
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception:  # no driver / no device
        count = 0
    if count < 2:
        pytest.skip("needs 2 GPUs, found %d" % count)
    return cupy


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
def test_nccl_reduce_and_broadcast_on_two_gpus(dtype):
    cupy = _two_gpus()
    reducer = reduce.NcclLocalReducer([0, 1])
    try:
        arrays = []
        for device, value in ((0, 1.5), (1, 2.0)):
            with cupy.cuda.Device(device):
                arrays.append(cupy.full(1000, value, dtype=dtype))
        with cupy.cuda.Device(0):
            total = cupy.empty(1000, dtype=dtype)
        cupy.cuda.Device(0).synchronize(), cupy.cuda.Device(1).synchronize()
        reducer.reduce(arrays, total)
        reducer.synchronize()
        host = reduce.HostBuffers(reducer.pinned_allocator()).get("k", (1000,), dtype)
        reducer.copy_to_host(total, host)
        np.testing.assert_array_equal(host, np.full(1000, 3.5, dtype=dtype))
        assert float(arrays[0][0].get()) == 1.5        # inputs are only read
        host *= 2
        reducer.copy_from_host(host, total)
        reducer.broadcast(total, arrays)
        reducer.synchronize()
        for array in arrays:
            np.testing.assert_array_equal(array.get(), np.full(1000, 7.0, dtype=dtype))
    finally:
        reducer.close()
