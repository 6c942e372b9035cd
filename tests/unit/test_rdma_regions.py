"""The byteps_rdma van's registration cache (van/rdma/regions.py) on the strict soft provider:
one registration per numpy-owned buffer, reused; none kept past the buffer's life; none for
memory numpy does not own; the receive pool's reuse unchanged."""
import ctypes
import gc
import threading
import time

import mxnet as mx
import numpy as np
import pytest

from kvstore_byteps.van.rdma.regions import RegistrationCache, root_of
from kvstore_byteps.van.tcp.recv_buffers import RecvBufferPool
from kvstore_byteps.van.rdma.verbs.api import Access
from kvstore_byteps.van.rdma.verbs.soft import InProcessFabric
from mxnet_patch.engine_async import host_view

LANDING = Access.LOCAL_WRITE | Access.REMOTE_WRITE


@pytest.fixture
def device():
    return InProcessFabric().device()


@pytest.fixture
def cache(device):
    return RegistrationCache(device.alloc_pd())


def as_piece(array):
    """What the channel registers: a byte view through a memoryview, as van.send makes it."""
    return np.frombuffer(memoryview(array).cast("B"), np.uint8)


def test_the_root_is_the_array_owning_the_memory():
    owner = np.zeros(1000, np.float32)
    assert root_of(as_piece(owner[100:200])) is owner
    assert root_of(owner.view(np.uint8).reshape(40, 100)[3]) is owner
    assert root_of(np.frombuffer(b"x" * 64, np.uint8)) is None
    assert root_of(np.frombuffer(bytearray(64), np.uint8)) is None
    assert root_of(memoryview(b"abc")) is None


def test_an_ndarray_host_view_is_a_root_its_ndarray_keeps_in_place(cache):
    gradient = mx.nd.ones((256, 64))
    view = host_view(gradient).reshape(-1).view(np.uint8)
    raw = root_of(as_piece(view[4096:8192]))
    assert raw is not None and raw.owner is gradient
    region = cache.acquire(as_piece(view[4096:8192]), Access(0))
    assert cache.acquire(as_piece(view[:4096]), Access(0)) is region
    assert (region.addr, region.length) == (view.ctypes.data, view.nbytes)
    del view, raw
    gc.collect()                               # the last view gone: so is the registration
    assert not region.registered and len(cache) == 0
    assert root_of(np.frombuffer((ctypes.c_ubyte * 8)(), np.uint8)) is None   # no owner


def test_pieces_of_one_buffer_share_one_registration_per_access(cache, device):
    owner = np.zeros(1 << 20, np.uint8)
    regions = [cache.acquire(as_piece(owner[i * 4096:(i + 1) * 4096]), Access(0))
               for i in range(10)]
    assert all(region is regions[0] for region in regions)
    assert regions[0].addr == owner.ctypes.data and regions[0].length == owner.nbytes
    assert regions[0].access == Access(0)        # reading needs no more
    landing = cache.acquire(as_piece(owner[:4096]), LANDING)
    assert landing is not regions[0] and landing.access == LANDING
    assert (cache.registered, cache.reused, len(cache)) == (2, 9, 2)
    for region in regions + [landing]:
        cache.release(region)
    assert regions[0].registered and landing.registered      # cached: they stay
    assert device.by_rkey[landing.rkey] is landing


def test_memory_numpy_does_not_own_is_registered_per_message(cache, device):
    data = bytearray(100000)
    region = cache.acquire(np.frombuffer(data, np.uint8), Access(0))
    again = cache.acquire(np.frombuffer(data, np.uint8), Access(0))
    assert region is not again and cache.registered == 2 and len(cache) == 0
    cache.release(region)
    cache.release(again)
    assert not region.registered and not again.registered
    assert region.lkey not in device.by_lkey


def test_a_freed_buffer_takes_its_registrations_with_it_before_its_memory_goes(cache, device):
    owner = np.ones(1 << 16, np.uint8)
    region = cache.acquire(as_piece(owner), LANDING)
    cache.release(region)
    rkey = region.rkey
    del owner
    gc.collect()
    assert not region.registered and rkey not in device.by_rkey
    assert len(cache) == 0
    fresh = np.ones(1 << 16, np.uint8)         # perhaps at the same address: registered anew
    assert cache.acquire(as_piece(fresh), LANDING) is not region
    assert cache.registered == 2


def test_a_cached_buffer_cannot_move_and_is_not_kept_alive(cache):
    owner = np.zeros(4096, np.uint8)
    cache.acquire(as_piece(owner), Access(0))
    with pytest.raises(ValueError):
        owner.resize(1 << 20)                  # numpy refuses: the cache's weak reference
    before = len(gc.get_referrers(owner))
    assert before == len(gc.get_referrers(np.zeros(1)))   # nothing in the cache refers to it


def test_a_buffer_freed_on_another_thread_is_deregistered(cache):
    holder = [np.zeros(65536, np.uint8)]
    region = cache.acquire(as_piece(holder[0]), Access(0))
    worker = threading.Thread(target=holder.clear)
    worker.start()
    worker.join()
    assert not region.registered and len(cache) == 0


def test_a_buffer_freed_under_the_providers_lock_does_not_deadlock_a_registration(cache,
                                                                                     device):
    """The thread freeing a root may hold any lock, e.g. the soft device's, while another
    thread registers (holding the cache's lock, waiting for the device's)."""
    holder = [np.zeros(65536, np.uint8)]
    region = cache.acquire(as_piece(holder[0]), Access(0))
    other = np.zeros(65536, np.uint8)
    locked, done = threading.Event(), []

    def free_under_the_device_lock():
        with device.lock:
            locked.set()
            time.sleep(0.3)                    # the registration waits for this lock now
            holder.clear()                     # the root dies here: its callback runs

    def register():
        locked.wait()
        done.append(cache.acquire(as_piece(other), Access(0)))
    threads = [threading.Thread(target=f, daemon=True)
               for f in (free_under_the_device_lock, register)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert done and not any(thread.is_alive() for thread in threads)
    assert not region.registered and done[0].registered


def test_the_receive_pool_reuses_its_buffers_and_their_registrations(cache):
    pool = RecvBufferPool(min_bytes=1024)
    pool.register(5, 8192)
    regions = []
    for _ in range(4):
        landing = pool.take(5, 8192)
        regions.append(cache.acquire(landing, LANDING))
        del landing                            # the consumer is done with it
    assert pool.allocated == 1 and pool.reused == 4
    assert all(region is regions[0] for region in regions) and cache.registered == 1
    first = pool.take(5, 8192)
    cache.acquire(first, LANDING)
    assert pool.take(5, 8192) is not first     # still in use: the pool sees it


def test_off_every_acquisition_registers_and_every_release_deregisters(device):
    cache = RegistrationCache(device.alloc_pd(), enabled=False)
    owner = np.zeros(65536, np.uint8)
    regions = [cache.acquire(as_piece(owner), Access(0)) for _ in range(3)]
    assert len({id(region) for region in regions}) == 3 and len(cache) == 0
    for region in regions:
        cache.release(region)
    assert not any(region.registered for region in regions)


def test_close_deregisters_what_is_cached_and_later_releases_are_harmless(cache, device):
    owner = np.zeros(65536, np.uint8)
    region = cache.acquire(as_piece(owner), LANDING)
    cache.close()
    assert not region.registered and region.rkey not in device.by_rkey
    cache.release(region)                      # a completion after the van's end
    del owner
    gc.collect()
    later = np.zeros(100, np.uint8)
    once = cache.acquire(as_piece(later), Access(0))
    cache.release(once)
    assert not once.registered                 # after close: per message
