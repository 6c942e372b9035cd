"""Asynchronous training (BYTEPS_ENABLE_ASYNC=1) through MXNet's three paths, with exact answers.

    async_train.py {kv,gluon,module,bps-optimizer,bps-trainer} STEPS

Every path trains a loss whose gradient is known whatever the weights (``sum(w)``: ones), with
plain SGD, so each push changes the shared weights by exactly ``-lr * rescale * 1`` and after
all workers are done the servers hold ``initial - workers * STEPS * lr * rescale``. Each
worker waits for the others (a barrier), reads the weights fresh and prints
``ASYNC_RESULT <path> <rank> <value> <expected>``; exit 3 if they differ.

* ``kv``: the store's own API: pushpull without an optimizer is refused, then
  ``set_optimizer`` and ``pushpull(key, grad, out=weight)``;
* ``gluon``: ``gluon.Trainer(..., kvstore=kv)`` (gluon requires update_on_kvstore=True in async
  mode, and gets it);
* ``module``: ``Module.fit`` (``push``/``pull`` of gradients and weights through the store's
  optimizer);
* ``bps-optimizer``, ``bps-trainer``: BytePS's API (``import kvstore_byteps.mxnet as bps``):
  ``bps.DistributedOptimizer`` in a gluon Trainer without a kvstore, ``bps.DistributedTrainer``
  (which scales by batch x size, as in synchronous training); ``broadcast_parameters`` takes
  rank 0's values, ``byteps_push_pull`` is a running total (the workers count themselves done
  with it, then read the weights with a push of zeros).
"""
import os
import sys
import tempfile
import time

import mxnet as mx
import numpy as np
from mxnet import autograd, gluon

INITIAL, LR, BATCH, SHAPE = 3.0, 0.5, 8, (2, 3)
EXIT_WRONG = 3


def run_kv(kv, steps):
    """Key 0 holds float32 weights, key 1 float16 ones updated in float32 (multi-precision)."""
    ws = [mx.nd.full(SHAPE, INITIAL, dtype=dtype) for dtype in ("float32", "float16")]
    for key, w in enumerate(ws):
        kv.init(key, w)
    try:
        kv.pushpull(0, mx.nd.ones(SHAPE), out=ws[0])
        mx.nd.waitall()
        raise SystemExit("pushpull without an optimizer was not refused in async mode")
    except Exception as exc:     # KVStoreBytePSError, raised or surfaced by waitall
        assert "optimizer" in str(exc), exc
    kv.set_optimizer(mx.optimizer.SGD(learning_rate=LR, rescale_grad=1.0 / BATCH,
                                      multi_precision=True))
    for _ in range(steps):
        for key, w in enumerate(ws):
            kv.pushpull(key, mx.nd.ones(SHAPE, dtype=w.dtype), out=w)
    mx.nd.waitall()
    kv._barrier()
    for key, w in enumerate(ws):
        kv.pull(key, out=w)
    return np.concatenate([w.asnumpy().astype(np.float32).ravel() for w in ws])


class SumOfWeights(gluon.Block):
    def __init__(self):
        super().__init__()
        self.w = self.params.get("w", shape=SHAPE, init=mx.init.Constant(INITIAL))

    def forward(self, x):
        return self.w.data().sum() + 0 * x.sum()


def train(net, trainer, steps):
    x = mx.nd.ones((BATCH, 1))
    for _ in range(steps):
        with autograd.record():
            loss = net(x)
        loss.backward()
        trainer.step(BATCH)


def run_gluon(kv, steps):
    net = SumOfWeights()
    net.initialize()
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": LR}, kvstore=kv)
    train(net, trainer, steps)
    assert trainer._update_on_kvstore, "gluon did not update on the store in async mode"
    handle, states = tempfile.mkstemp(suffix=".states")   # the store keeps them in async mode
    os.close(handle)
    try:
        trainer.save_states(states)
        trainer.load_states(states)
    finally:
        os.remove(states)
    assert isinstance(trainer._optimizer, mx.optimizer.SGD), trainer._optimizer
    net.w.data().wait_to_read()
    kv._barrier()
    out = mx.nd.zeros(SHAPE)
    kv.pull(0, out=out)
    return out.asnumpy()


def run_module(kv, steps):
    data, label = mx.sym.Variable("data"), mx.sym.Variable("label")
    w = mx.sym.Variable("w_weight", shape=SHAPE)   # "weight": the initializer takes it
    loss = mx.sym.MakeLoss(mx.sym.sum(w) + 0 * (mx.sym.sum(data) + mx.sym.sum(label)))
    mod = mx.mod.Module(loss, data_names=["data"], label_names=["label"], context=mx.cpu())
    ones = np.ones((steps * BATCH, 1), np.float32)
    train = mx.io.NDArrayIter(ones, ones, batch_size=BATCH, label_name="label")
    mod.fit(train, num_epoch=1, kvstore=kv, optimizer="sgd",
            optimizer_params={"learning_rate": LR}, eval_metric=mx.metric.Loss(),
            initializer=mx.init.Constant(INITIAL))
    assert mod._update_on_kvstore, "Module did not update on the store in async mode"
    mx.nd.waitall()
    kv._barrier()
    out = mx.nd.zeros(SHAPE)
    kv.pull("w_weight", out=out)
    return out.asnumpy()


def run_bps(path, steps):
    """(this process's rank, the servers' final weights, what they must be)."""
    import kvstore_byteps.mxnet as bps
    bps.init()
    rank, size = bps.rank(), bps.size()
    mine = {"t": mx.nd.full((4,), rank + 1.0)}
    bps.broadcast_parameters(mine)
    assert np.all(mine["t"].asnumpy() == 1.0), mine["t"]          # rank 0's
    net = SumOfWeights()
    net.initialize()
    if path == "bps-optimizer":
        # gluon sets rescale_grad on the wrapper, which (as BytePS's) keeps the wrapped one's
        optimizer = bps.DistributedOptimizer(mx.optimizer.SGD(learning_rate=LR,
                                                              rescale_grad=1.0 / BATCH))
        trainer = gluon.Trainer(net.collect_params(), optimizer, kvstore=None)
        expected = INITIAL - size * steps * LR / BATCH
    else:
        trainer = bps.DistributedTrainer(net.collect_params(), "sgd", {"learning_rate": LR})
        expected = INITIAL - steps * LR / BATCH                    # scaled by batch x size
    train(net, trainer, steps)
    net.w.data().wait_to_read()
    done = mx.nd.ones((1,))
    bps.byteps_push_pull(done, name="done", is_average=False)     # a running total
    deadline = time.monotonic() + 60
    while done.asscalar() < size:
        if time.monotonic() > deadline:
            raise SystemExit("rank %d: only %d of %d workers said done within 60 s"
                             % (rank, done.asscalar(), size))
        time.sleep(0.05)
        done[:] = 0
        bps.byteps_push_pull(done, name="done", is_average=False)
    final = mx.nd.zeros(SHAPE)
    bps.byteps_push_pull(final, name="weight_0", is_average=False)  # adds nothing: reads
    return rank, final.asnumpy(), expected


def main():
    path, steps = sys.argv[1], int(sys.argv[2])
    if path.startswith("bps-"):
        rank, got, expected = run_bps(path, steps)
    else:
        kv = mx.kv.create("dist_byteps")
        assert kv.type == "dist_async_byteps", kv.type
        got = {"kv": run_kv, "gluon": run_gluon, "module": run_module}[path](kv, steps)
        rank, expected = kv.rank, INITIAL - kv.num_workers * steps * LR / BATCH
    print("ASYNC_RESULT %s %d %r %r" % (path, rank, float(got.flat[0]), expected),
          flush=True)
    return 0 if np.all(got == expected) else EXIT_WRONG


if __name__ == "__main__":
    sys.exit(main())
