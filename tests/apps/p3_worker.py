"""MXNet's own worker on the P3 van (DMLC_PS_VAN_TYPE=p3: MXNet makes a P3StoreDist, which
slices each parameter over the servers and updates on the workers), two CPU devices, checked
exactly as MXNet's nightly P3 test checks its GPUs: broadcasts of small keys and keys bigger
than a slice, then in-place pushpulls whose sums are known. Prints ``P3 OK rank R``."""
import mxnet as mx
import numpy as np

SHAPE, BIG = (2, 3), (1200, 1200)     # BIG: 36 slices of MXNET_KVSTORE_SLICE_THRESHOLD
DEVICES = [mx.cpu(0), mx.cpu(1)]


def check(name, array, want):
    got = array.asnumpy()
    assert np.all(got == want), "%s: got %s, want %s" % (name, got.reshape(-1)[:3], want)


kv = mx.kv.create("dist_sync")
assert not kv.is_capable("optimizer")          # P3: updates run on the workers
rank, workers = kv.rank, kv.num_workers
for i, key in enumerate(["200", "201", "300", "301"]):
    shape = SHAPE if key < "300" else BIG
    out = mx.nd.zeros(shape)
    kv.broadcast(key, mx.nd.ones(shape) * (i + 1) * (rank + 1), out=out)
    check("broadcast of " + key, out, i + 1)             # rank 0's value everywhere
kv.broadcast("3", mx.nd.ones(SHAPE), mx.nd.ones(SHAPE))
kv.broadcast("99", mx.nd.ones(BIG), mx.nd.ones(BIG))
for step in range(3):
    want = (workers + 1) * workers * len(DEVICES) // 2 * (step + 1)
    for key, shape in (("3", SHAPE), ("99", BIG)):
        arrays = [mx.nd.ones(shape, ctx=d) * (rank + 1) * (step + 1) for d in DEVICES]
        kv.pushpull(key, arrays)
        for array in arrays:
            check("pushpull of %s, step %d" % (key, step), array, want)
print("P3 OK rank %d" % rank, flush=True)
