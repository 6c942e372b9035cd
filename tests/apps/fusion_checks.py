"""Gradient buckets checked from inside a worker: ``fusion_checks.py MODE [ARGS]``.

sums STORE ROUNDS  60 small keys (float32, then float16, then float32) and two big ones, every
         round integer values that differ by rank, key and round, each worker pushing its
         keys in its own random order; every sum is checked exactly, and the last line is
         ``SUMS <digest>``, a hash of every output of every round (the test compares the digest
         of dist_byteps with and without buckets and of dist_sync).
wait     keys 0-2 declared, then pushed one at a time, each read before the next is pushed
         (a test of sums, one key at a time): rank 0 sees it in the first round of calls and
         the bucket's keys go alone on every worker; every sum is exact; "WAIT OK <seconds of
         all rounds>".
paced    keys 0-2 declared in one init and pushed every round last key first, as a backward
         does, rank 1 pausing PAUSE seconds between keys 1 and 0 (a slower layer: over a
         second) and rank 0 0.1 s: every round goes in the bucket on both, every sum exact;
         "PACED OK".
stuck    keys 0-2 declared and pushed twice (the first round forms the bucket, the second
         goes alone while it is set up), then pushed again
         with key 1's gradient held back by an engine operation that does not finish: reading key 0 must fail within BYTEPS_FUSION_TIMEOUT,
         naming key 1; "STUCK FAILED: <error>".
late     keys 0-2 declared; on rank 1 the first round's gradient of key 1 is held back by an
         engine operation until the second round's calls formed the bucket (a gradient that is
         ready late, as a slow backward's): that round must still go alone, as on rank 0,
         and every round's sums be exact; "LATE OK".
mismatch every rank declares the same keys in the same order; run with a different
         BYTEPS_FUSION_BYTES on one worker, its buckets differ from rank 0's: the buckets are
         formed at the second step and set up meanwhile; the job must end by the third saying
         the workers fused keys differently, never sum wrong bytes.
"""
import hashlib
import sys
import threading
import time

import mxnet as mx
import numpy as np

SMALL = [(int(n),) for n in np.random.RandomState(0).randint(1, 3000, size=60)]
DTYPES = ["float32"] * 25 + ["float16"] * 10 + ["float32"] * 25
BIG = [(700000,), (300001,)]       # cut into partitions, and near the bucket capacity


def check_sums(store, rounds):
    kv = mx.kv.create(store)
    shapes = SMALL[:25] + [BIG[0]] + SMALL[25:] + [BIG[1]]
    dtypes = DTYPES[:25] + ["float32"] + DTYPES[25:] + ["float32"]
    for key, (shape, dtype) in enumerate(zip(shapes, dtypes)):
        kv.init(key, mx.nd.zeros(shape, dtype=dtype))
    digest = hashlib.sha256()
    order = np.random.RandomState(100 + kv.rank)
    for r in range(rounds):
        grads = [mx.nd.array(np.full(shape, (kv.rank + 1) * (r % 7 + 1) + key % 5), dtype=dtype)
                 for key, (shape, dtype) in enumerate(zip(shapes, dtypes))]
        for key in order.permutation(len(shapes)):
            kv.pushpull(int(key), grads[key], priority=-int(key))
        for key, grad in enumerate(grads):
            want = sum((w + 1) * (r % 7 + 1) + key % 5 for w in range(kv.num_workers))
            got = grad.asnumpy()
            assert got.dtype == np.dtype(dtypes[key]) and np.all(got == want), \
                (r, key, got[:3], want)
            digest.update(got.tobytes())
    engine = getattr(kv, "_engine", None)
    if engine is not None:
        print("BUCKETS %d" % len(engine.fusion.plan.fused()) if engine.fusion.enabled
              else "BUCKETS 0")
    print("SUMS %s" % digest.hexdigest())


def check_wait():
    kv = mx.kv.create("dist_byteps")
    for key in range(3):
        kv.init(key, mx.nd.zeros((10,)))
    began = time.monotonic()
    for r in range(5):
        for key in range(3):
            grad = mx.nd.ones((10,)) * (key + r)
            kv.pushpull(key, grad)
            assert np.all(grad.asnumpy() == (key + r) * kv.num_workers), (r, key)
    print("WAIT OK %.1f" % (time.monotonic() - began))


def check_paced(pause, rounds=4):
    kv = mx.kv.create("dist_byteps")
    outs = [mx.nd.zeros((10 + key,)) for key in range(3)]
    kv.init(list(range(3)), outs)
    grads = [mx.nd.zeros((10 + key,)) for key in range(3)]
    for r in range(rounds):
        for key in (2, 1, 0):
            if key == 0:
                time.sleep(pause if kv.rank == 1 else 0.1)
            grads[key][:] = (kv.rank + 1) * (r + 1) + key
            kv.pushpull(key, grads[key], out=outs[key], priority=-key)
        for key in range(3):
            want = sum((w + 1) * (r + 1) + key for w in range(kv.num_workers))
            got = outs[key].asnumpy()
            assert np.all(got == want), (r, key, got[:3], want)
    fused = [b for b in kv._engine.fusion.plan.fused() if not b.dissolved]
    assert len(fused) == 1, kv._engine.fusion.plan.fused()
    print("PACED OK")


def check_stuck():
    from mxnet_patch.engine_async import push_async
    kv = mx.kv.create("dist_byteps")
    for key in range(3):
        kv.init(key, mx.nd.zeros((10,)))
    grads = [mx.nd.ones((10,)) for _ in range(3)]
    for _ in range(2):      # the first round of calls forms the bucket, the second goes alone
        for key in range(3):
            kv.pushpull(key, grads[key])
    release = threading.Event()
    mx.nd.waitall()
    push_async(lambda done: threading.Thread(target=lambda: (release.wait(), done())).start(),
               const_arrays=[], mutable_arrays=[grads[1]], priority=0, name="held_back")
    for key in range(3):
        kv.pushpull(key, grads[key])
    try:
        grads[0].asnumpy()
        print("STUCK DID NOT FAIL")
    except Exception as exc:     # MXNet's error, carrying ours
        print("STUCK FAILED: %s" % str(exc).splitlines()[0])
    release.set()


def check_late(rounds=5):
    from mxnet_patch.engine_async import push_async
    kv = mx.kv.create("dist_byteps")
    for key in range(3):
        kv.init(key, mx.nd.zeros((10,)))
    grads = [mx.nd.zeros((10,)) for _ in range(3)]      # the same arrays every round, as gluon's
    outs = [[mx.nd.zeros((10,)) for _ in range(3)] for _ in range(rounds)]
    release = threading.Event()
    if kv.rank == 1:
        push_async(lambda done: threading.Thread(target=lambda: (release.wait(), done())).start(),
                   const_arrays=[], mutable_arrays=[grads[1]], priority=0, name="held_back")
    for r in range(rounds):
        for key in range(3):
            grads[key][:] = (kv.rank + 1) * (r + 1) + key    # queued after the last round's
            kv.pushpull(key, grads[key], out=outs[r][key])
        if r == 1:        # the first round of calls is over: the bucket was formed
            release.set()
    for r in range(rounds):
        for key in range(3):
            want = sum((w + 1) * (r + 1) + key for w in range(kv.num_workers))
            got = outs[r][key].asnumpy()
            assert np.all(got == want), (r, key, got[:3], want)
    print("LATE OK")


def check_mismatch():
    kv = mx.kv.create("dist_byteps")
    for key in range(6):
        kv.init(key, mx.nd.zeros((key + 1,)))
    grads = [mx.nd.ones((key + 1,)) for key in range(6)]
    try:
        for _ in range(3):            # formed at the second step, set up and checked
            for key in range(6):    # meanwhile, used (the error raised) at the third
                kv.pushpull(key, grads[key])
            mx.nd.waitall()
    except Exception as exc:   # the error of the first step
        print("MISMATCH FAILED rank %d: %s" % (kv.rank, str(exc).splitlines()[0]))
        sys.stdout.flush()
        raise SystemExit(3)
    print("MISMATCH DID NOT FAIL rank %d" % kv.rank)


if __name__ == "__main__":
    mode = sys.argv[1]
    if mode == "sums":
        check_sums(sys.argv[2], int(sys.argv[3]))
    elif mode == "wait":
        check_wait()
    elif mode == "stuck":
        check_stuck()
    elif mode == "paced":
        check_paced(float(sys.argv[2]))
    elif mode == "late":
        check_late()
    elif mode == "mismatch":
        check_mismatch()
    else:
        raise SystemExit("unknown mode %r" % mode)
