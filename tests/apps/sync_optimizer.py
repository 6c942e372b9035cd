"""Synchronous training with the store's optimizer, as MXNet's rules choose it: trains a few
steps on this worker's shard and saves the parameters, for ``dist_byteps`` and ``dist_sync`` to
be compared.

    sync_optimizer.py CASE OUT_DIR [--kvstore dist_byteps]

CASE: ``gluon-sgd`` (gluon.Trainer, SGD with momentum, two CPU contexts), ``gluon-adam``
(Adam, one context), ``store-2bit`` (the store's push and pull with 2-bit compression, SGD with momentum),
``module`` (Module.fit, SGD with momentum), ``store-mp16`` (the
store's own push and pull of a float16 and a float32 key, SGD with momentum and
``multi_precision=True``: float32 master weights on the servers, as MXNet's nightly test
does). ``update_on_kvstore`` is left
to MXNet (``MXNET_UPDATE_ON_KVSTORE`` in the environment decides). Prints ``rank R
update_on_kvstore=U capable=C type=T``.
"""
import argparse
import os

import mxnet as mx
import numpy as np
from mxnet import autograd, gluon

FEATURES, BATCH, STEPS = 8, 6, 4


def batches(num_workers):
    """The global batch of every step, the same on every worker."""
    rng = np.random.RandomState(7)
    for _ in range(STEPS):
        yield (rng.randn(BATCH * num_workers, FEATURES).astype(np.float32),
               rng.randn(BATCH * num_workers, 4).astype(np.float32))


def gluon_case(kv, optimizer, params, contexts):
    mx.random.seed(42)
    net = gluon.nn.HybridSequential()
    net.add(gluon.nn.Dense(16, activation="relu"), gluon.nn.Dense(4))
    net.initialize(mx.init.Xavier(), ctx=contexts)
    trainer = gluon.Trainer(net.collect_params(), optimizer, params, kvstore=kv)
    loss_fn = gluon.loss.L2Loss()
    rows = slice(kv.rank * BATCH, (kv.rank + 1) * BATCH)
    for x, y in batches(kv.num_workers):
        xs, ys = np.array_split(x[rows], len(contexts)), np.array_split(y[rows], len(contexts))
        with autograd.record():
            losses = [loss_fn(net(mx.nd.array(a, ctx=c)), mx.nd.array(b, ctx=c))
                      for a, b, c in zip(xs, ys, contexts)]
        autograd.backward(losses)
        trainer.step(BATCH)
    values = {"p%02d" % i: p.data(p.list_ctx()[0]).asnumpy()
              for i, p in enumerate(net.collect_params().values())}
    return values, trainer._update_on_kvstore


def store_mp16_case(kv):
    """Also ``want_k<key>``: the weights MXNet's optimizer gives here, in this process, from
    every worker's gradients (each worker's are drawn from its rank's seed): MXNet's own
    dist_sync varies from run to run with pushes of fresh arrays, so it is no reference."""
    shapes = {3: ((5, 4), "float16"), 4: ((6,), "float32")}

    def optimizer():
        return mx.optimizer.SGD(learning_rate=0.01, momentum=0.9, multi_precision=True)
    for key, (shape, dtype) in shapes.items():
        kv.init(key, mx.nd.ones(shape, dtype=dtype))
    kv.set_optimizer(optimizer())
    rngs = [np.random.RandomState(11 + rank) for rank in range(kv.num_workers)]
    outs = {key: mx.nd.zeros(shape, dtype=dtype) for key, (shape, dtype) in shapes.items()}
    want = {key: mx.nd.ones(shape, dtype=dtype) for key, (shape, dtype) in shapes.items()}
    local = mx.optimizer.get_updater(optimizer())
    for _ in range(STEPS):            # each step a push and a pull of every key, as Module's
        for key, (shape, dtype) in shapes.items():
            grads = [rng.randn(*shape).astype(dtype) for rng in rngs]
            kv.push(key, mx.nd.array(grads[kv.rank], dtype=dtype))
            kv.pull(key, out=outs[key])
            total = np.sum([g.astype(np.float32) for g in grads], axis=0)   # rounded once
            local(key, mx.nd.array(total, dtype=dtype), want[key])
    values = {"k%d" % key: out.asnumpy().astype(np.float32) for key, out in outs.items()}
    values.update({"want_k%d" % key: w.asnumpy().astype(np.float32) for key, w in want.items()})
    return values, True


def store_2bit_case(kv):
    """MXNet's 2-bit compression with the servers' optimizer: the gradients quantized with
    each worker's residual, the weights pulled plain; ``want_k<key>``: MXNet's optimizer here
    on the sum of every worker's quantized gradients (computed with their residuals)."""
    threshold, shapes = 0.5, {5: (4, 3), 6: (300, 50)}

    def optimizer():
        return mx.optimizer.SGD(learning_rate=0.1, momentum=0.9)
    kv.set_gradient_compression({"type": "2bit", "threshold": threshold})
    for key, shape in shapes.items():
        kv.init(key, mx.nd.ones(shape))
    kv.set_optimizer(optimizer())
    rngs = [np.random.RandomState(21 + rank) for rank in range(kv.num_workers)]
    residuals = {key: [np.zeros(shape, np.float32)] * kv.num_workers
                 for key, shape in shapes.items()}
    outs = {key: mx.nd.zeros(shape) for key, shape in shapes.items()}
    want = {key: mx.nd.ones(shape) for key, shape in shapes.items()}
    local = mx.optimizer.get_updater(optimizer())
    for _ in range(STEPS):
        for key, shape in shapes.items():
            grads = [rng.uniform(-0.8, 0.8, shape).astype(np.float32) for rng in rngs]
            kv.push(key, mx.nd.array(grads[kv.rank]))
            kv.pull(key, out=outs[key])
            total = np.zeros(shape, np.float32)
            for rank, grad in enumerate(grads):
                kept = residuals[key][rank] + grad
                sent = np.where(kept >= threshold, threshold,
                                np.where(kept <= -threshold, -threshold, 0)).astype(np.float32)
                residuals[key][rank] = kept - sent
                total += sent
            local(key, mx.nd.array(total), want[key])
    values = {"k%d" % key: out.asnumpy() for key, out in outs.items()}
    values.update({"want_k%d" % key: w.asnumpy() for key, w in want.items()})
    return values, True


def module_case(kv):
    sym = mx.sym.SoftmaxOutput(mx.sym.FullyConnected(mx.sym.Variable("data"), num_hidden=2,
                                                     name="fc"), name="softmax")
    rng = np.random.RandomState(3)
    x = rng.randn(64, FEATURES).astype(np.float32)
    y = (x.sum(axis=1) > 0).astype(np.float32)
    mine = slice(kv.rank * 32, (kv.rank + 1) * 32)
    train = mx.io.NDArrayIter(x[mine], y[mine], batch_size=8, label_name="softmax_label")
    mod = mx.mod.Module(sym, context=mx.cpu())
    mx.random.seed(5)
    mod.fit(train, num_epoch=2, kvstore=kv, optimizer="sgd",
            optimizer_params={"learning_rate": 0.1, "momentum": 0.9, "wd": 0.01},
            initializer=mx.init.Xavier(rnd_type="gaussian"))
    args, _ = mod.get_params()
    return {name: value.asnumpy() for name, value in args.items()}, mod._update_on_kvstore


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("case", choices=("gluon-sgd", "gluon-adam", "module", "store-mp16",
                                         "store-2bit"))
    parser.add_argument("out_dir")
    parser.add_argument("--kvstore", default="dist_byteps")
    args = parser.parse_args()
    kv = mx.kv.create(args.kvstore)
    if args.case == "module":
        values, on_store = module_case(kv)
    elif args.case == "store-mp16":
        values, on_store = store_mp16_case(kv)
    elif args.case == "store-2bit":
        values, on_store = store_2bit_case(kv)

    elif args.case == "gluon-sgd":
        values, on_store = gluon_case(kv, "sgd", {"learning_rate": 0.05, "momentum": 0.9},
                                      [mx.cpu(0), mx.cpu(1)])
    else:
        values, on_store = gluon_case(kv, "adam", {"learning_rate": 0.01}, [mx.cpu(0)])
    np.savez(os.path.join(args.out_dir, "rank%d.npz" % kv.rank), **values)
    print("rank %d update_on_kvstore=%s capable=%s type=%s"
          % (kv.rank, on_store, kv.is_capable("optimizer"), kv.type), flush=True)


if __name__ == "__main__":
    main()
