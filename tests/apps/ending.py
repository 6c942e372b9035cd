"""A dist_byteps worker script that ends with work still queued, as users' scripts do.

    python ending.py pushpull    # pushpulls of 8 x 4 MB keys, then the script ends
    python ending.py fit         # Module.fit, then the script ends
    python ending.py fresh STEPS MB   # STEPS rounds of pushpulls of arrays made fresh every
                                     # step and dropped at once; sums checked every 5 steps
    python ending.py crash       # rank 1 raises after 5 rounds; rank 0 goes on pushing
    python ending.py exit        # rank 1 calls sys.exit(3) after 5 rounds; rank 0 goes on
    python ending.py early       # rank 1's loop ends after 5 rounds (its program ends, status
                                 # 0); rank 0 goes on pushing
    python ending.py extra       # rank 1 declares one key more than rank 0, which trains

Prints ``ENDING <mode> rank R`` as its last line; everything after is the store's exit.
"""
import sys

import mxnet as mx
import numpy as np


def pushpull(kv):
    n = 1 << 20
    outs = [mx.nd.zeros(n) for _ in range(8)]
    for key, out in enumerate(outs):
        kv.init(key, mx.nd.zeros(n))
    for key, out in enumerate(outs):
        kv.pushpull(key, mx.nd.ones(n), out=out, priority=-key)


def fit(kv):
    rng = np.random.RandomState(3)
    x = rng.randn(256, 4096).astype(np.float32)     # 32 KB of weights: sent without copying
    y = (x.sum(axis=1) > 0).astype(np.float32)
    sym = mx.sym.SoftmaxOutput(mx.sym.FullyConnected(mx.sym.Variable("data"), num_hidden=2),
                               name="softmax")
    train = mx.io.NDArrayIter(x, y, batch_size=16, label_name="softmax_label")
    mx.mod.Module(sym, context=mx.cpu()).fit(train, num_epoch=2, kvstore=kv, optimizer="sgd")


def fresh(kv, steps, megabytes):
    """The pushed arrays are made fresh every step and dropped as soon as they are queued:
    after an operation completed its memory goes back to the allocator (arrays of 32 MB and
    more are unmapped at once), while PS_RESEND may still hold a message made of it."""
    n = megabytes * (1 << 20) // 4
    keys = range(2)
    for key in keys:
        kv.init(key, mx.nd.zeros(n))
    outs = [mx.nd.zeros(n) for _ in keys]
    for step in range(1, steps + 1):
        for key in keys:
            kv.pushpull(key, mx.nd.full(n, step), out=outs[key], priority=-key)
        if step % 5 == 0:
            for out in outs:
                got, want = out.asnumpy(), step * kv.num_workers
                assert np.all(got == want), "step %d: got %s, want %s" % (step, got[:3], want)
            print("step %d exact" % step, flush=True)


def crash(kv, how="raise"):
    kv.init(0, mx.nd.zeros(1024))
    out = mx.nd.zeros(1024)
    for step in range(1, 10 ** 6):
        kv.pushpull(0, mx.nd.ones(1024), out=out)
        out.wait_to_read()
        if step == 5 and kv.rank == 1:
            if how == "exit":
                sys.exit(3)
            if how == "early":
                return
            raise RuntimeError("rank 1 fails at step 5")


def extra(kv):
    keys = 3 if kv.rank == 1 else 2
    kv.init(list(range(keys)), [mx.nd.zeros(64) for _ in range(keys)])
    out = mx.nd.zeros(64)
    for _ in range(10 ** 6):
        kv.pushpull(0, mx.nd.ones(64), out=out)
        out.wait_to_read()


def main():
    kv = mx.kv.create("dist_byteps")
    mode = sys.argv[1]
    if mode == "pushpull":
        pushpull(kv)
    elif mode == "fit":
        fit(kv)
    elif mode in ("crash", "exit", "early"):
        crash(kv, mode)
    elif mode == "extra":
        extra(kv)
    elif mode == "fresh":
        fresh(kv, int(sys.argv[2]), int(sys.argv[3]))
    else:
        raise SystemExit("unknown mode %r" % mode)
    print("ENDING %s rank %d" % (mode, kv.rank), flush=True)


main()
