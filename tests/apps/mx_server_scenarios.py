"""Unmodified MXNet 1.9.1 worker scenarios for the server cluster tests.

    python mx_server_scenarios.py SCENARIO OUT.npz

``sums`` and ``async`` check exactly computed values in the worker (exit 1 and print WRONG on a
mismatch); ``trainer-sgd16``, ``trainer-adam``, ``compressed`` and ``sparse`` save what the
worker ends up with to OUT.npz, so the test can compare a run against MXNet's C++ server with a
run against ours.
"""
import sys

import mxnet as mx
import numpy as np


def check(name, got, want):
    got = got.asnumpy() if hasattr(got, "asnumpy") else got
    if got.shape != np.shape(want) and np.size(want) != 1 or not np.all(got == want):
        print("WRONG %s: got %s want %s" % (name, got.reshape(-1)[:4], np.reshape(want, -1)[:4]),
              flush=True)
        sys.exit(1)


def sums(out_path):
    """dist_sync without optimizer: every pull equals the exact sum of the round's pushes."""
    kv = mx.kv.create("dist_sync")
    rank, nw = kv.rank, kv.num_workers
    shapes = {3: ((50,), "float32"), 4: ((300,), "float32"), 5: ((7,), "float16"),
              6: ((120,), "float64"), 7: ((200,), "float32")}
    keys = sorted(shapes)
    kv.init(keys, [mx.nd.full(s, k, dtype=d) for k, (s, d) in sorted(shapes.items())])
    for key in keys:                       # a pull right after init returns the init value
        shape, dtype = shapes[key]
        out = mx.nd.zeros(shape, dtype=dtype)
        kv.pull(key, out=out)
        check("init of key %d" % key, out, key)
    for step in range(3):
        want = (step + 1) * nw * (nw + 1) // 2
        for key in keys[:-1]:
            shape, dtype = shapes[key]
            kv.push(key, mx.nd.full(shape, (rank + 1) * (step + 1), dtype=dtype))
            out = mx.nd.zeros(shape, dtype=dtype)
            kv.pull(key, out=out)
            check("key %d step %d" % (key, step), out, want)
        out = mx.nd.zeros((200,))          # update_on_kvstore=False style pushpull
        kv.pushpull(7, mx.nd.full((200,), (rank + 1) * (step + 1)), out=out)
        check("pushpull step %d" % step, out, want)
    print("rank %d SUMS OK" % rank, flush=True)


def run_async(out_path):
    """dist_async with SGD: w = w0 - lr * (sum of every push), exact in float32 here."""
    kv = mx.kv.create("dist_async")
    kv.set_optimizer(mx.optimizer.SGD(learning_rate=0.5, rescale_grad=1.0))
    kv.init(3, mx.nd.zeros((64,)))
    kv._barrier()
    for _ in range(4):
        kv.push(3, mx.nd.ones((64,)))
    out = mx.nd.zeros((64,))
    kv.pull(3, out=out)                    # waits for this worker's pushes to be applied
    out.wait_to_read()
    kv._barrier()
    kv.pull(3, out=out)
    check("async weights", out, -0.5 * 4 * kv.num_workers)
    print("rank %d ASYNC OK" % kv.rank, flush=True)


def trainer(out_path, optimizer, dtype):
    """gluon.Trainer with update_on_kvstore=True: the server runs the optimizer.

    An elementwise model, because MXNet has no float16 FullyConnected on CPU; ``w`` has 300
    elements, so with MXNET_KVSTORE_BIGARRAY_BOUND=100 it is split over the servers.
    """
    mx.random.seed(0)
    params = mx.gluon.ParameterDict()
    w = params.get("w", shape=(300,), dtype=dtype, init=mx.init.Uniform(1.0))
    b = params.get("b", shape=(10,), dtype=dtype, init=mx.init.Zero())
    params.initialize()
    settings = {"learning_rate": 0.05, "multi_precision": dtype == "float16"}
    if optimizer == "sgd":
        settings["momentum"] = 0.9
    kv = mx.kv.create("dist_sync")
    train = mx.gluon.Trainer(params, optimizer, settings, kvstore=kv, update_on_kvstore=True)
    rng = np.random.RandomState(kv.rank + 1)
    for _ in range(5):
        x, y = (mx.nd.array(rng.randn(300), dtype=dtype) for _ in range(2))
        t = mx.nd.array(rng.randn(10), dtype=dtype)
        with mx.autograd.record():
            loss = ((w.data() * x - y) ** 2).mean() + ((b.data() - t) ** 2).sum()
        loss.backward()
        train.step(1)
    save(out_path, {name: p.data().astype("float32").asnumpy() for name, p in params.items()})


def trainer_pushpull(out_path):
    """gluon.Trainer, update_on_kvstore=False (one pushpull per parameter, 6 steps): each worker
    replays every rank's gradients locally and checks its parameters against that, exactly."""
    def model(dtype="float32"):
        mx.random.seed(0)
        params = mx.gluon.ParameterDict()
        params.get("w", shape=(300,), init=mx.init.Uniform(1.0))
        params.get("b", shape=(10,), init=mx.init.Zero())
        params.initialize()
        return params

    def grads(params, rank, step):
        rng = np.random.RandomState(1000 * rank + step)
        x, y, t = mx.nd.array(rng.randn(300)), mx.nd.array(rng.randn(300)), \
            mx.nd.array(rng.randn(10))
        with mx.autograd.record():
            loss = ((params["w"].data() * x - y) ** 2).mean() + \
                ((params["b"].data() - t) ** 2).sum()
        loss.backward()
        return {name: p.grad().copy() for name, p in params.items()}

    kv = mx.kv.create("dist_sync")
    params, replica = model(), model()
    train = mx.gluon.Trainer(params, "sgd", {"learning_rate": 0.1, "momentum": 0.9},
                             kvstore=kv, update_on_kvstore=False)
    local = mx.gluon.Trainer(replica, "sgd", {"learning_rate": 0.1, "momentum": 0.9},
                             kvstore=None)
    for step in range(6):
        grads(params, kv.rank, step)
        train.step(1)
        per_rank = [grads(replica, r, step) for r in range(kv.num_workers)]
        for name, p in replica.items():
            p.grad()[:] = per_rank[0][name] + sum(g[name] for g in per_rank[1:])
        local.step(1)
        for name, p in params.items():
            check("%s after step %d" % (name, step), p.data(), replica[name].data().asnumpy())
    print("rank %d PUSHPULL TRAINER OK" % kv.rank, flush=True)


def compressed(out_path):
    """2-bit gradient compression: pulls return the dequantized sums."""
    kv = mx.kv.create("dist_sync")
    kv.set_gradient_compression({"type": "2bit", "threshold": 0.5})
    shapes = {3: (100,), 4: (300,)}
    kv.init(sorted(shapes), [mx.nd.zeros(shapes[k]) for k in sorted(shapes)])
    rng = np.random.RandomState(kv.rank + 1)
    results = {}
    for step in range(3):
        for key, shape in sorted(shapes.items()):
            kv.push(key, mx.nd.array(rng.uniform(-1.5, 1.5, shape)))
            out = mx.nd.zeros(shape)
            kv.pull(key, out=out)
            results["k%d_s%d" % (key, step)] = out.asnumpy()
    save(out_path, results)


def sparse(out_path, optimizer=None, rows_with_gradients=10):
    """row_sparse weights updated on the servers by ``optimizer`` (default SGD with momentum);
    gradients only ever touch the first ``rows_with_gradients`` rows; all rows pulled with
    row_sparse_pull."""
    kv = mx.kv.create("dist_sync")
    kv.set_optimizer(optimizer or mx.optimizer.SGD(learning_rate=0.1, momentum=0.9,
                                                   rescale_grad=1.0))
    weight = mx.nd.array(np.arange(30, dtype=np.float32).reshape(10, 3)).tostype("row_sparse")
    kv.init(8, weight)
    kv.init(9, mx.nd.ones((40,)))
    rng = np.random.RandomState(kv.rank + 1)
    all_rows = mx.nd.arange(10, dtype="int64")
    results = {}
    for step in range(3):
        rows = np.sort(rng.choice(rows_with_gradients, 4, replace=False))
        grad = mx.nd.sparse.row_sparse_array((rng.randn(4, 3).astype(np.float32), rows),
                                             shape=(10, 3))
        kv.push(8, grad)
        kv.push(9, mx.nd.array(rng.randn(40)))
        out = mx.nd.sparse.zeros("row_sparse", (10, 3))
        kv.row_sparse_pull(8, out=out, row_ids=all_rows)
        dense = mx.nd.zeros((40,))
        kv.pull(9, out=dense)
        # read at once: an MXNet worker that reads its pulled arrays only at the end of the run
        # was seen to return values of neither step (worker side, with either server)
        results["rows_s%d" % step] = out.tostype("default").asnumpy()
        results["dense_s%d" % step] = dense.asnumpy()
    save(out_path, results)


def save(out_path, arrays):
    np.savez(out_path, **arrays)
    print("SAVED %d arrays" % len(arrays), flush=True)


SCENARIOS = {
    "sums": sums, "async": run_async, "compressed": compressed, "sparse": sparse,
    # rows 8 and 9 never get a gradient: on a row_sparse weight they keep their values
    "sparse-ftrl": lambda out: sparse(out, mx.optimizer.Ftrl(learning_rate=0.1, lamda1=0.01,
                                                             rescale_grad=1.0), 8),
    "trainer-pushpull": trainer_pushpull,
    "trainer-sgd16": lambda out: trainer(out, "sgd", "float16"),
    "trainer-adam": lambda out: trainer(out, "adam", "float32"),
}

if __name__ == "__main__":
    SCENARIOS[sys.argv[1]](sys.argv[2] if len(sys.argv) > 2 else None)
