"""Module.fit over dist_byteps vs one process fitting the union of the shards.

Worker r fits rows [32r, 32r+32) in batches of 8; step i of the distributed run therefore sums
the gradients of batch i of both shards, scaled by the global batch (16): the same as one
process fitting batches made of batch i of shard 0 followed by batch i of shard 1.
"""
import sys

import mxnet as mx
import numpy as np

BATCH = 8


def fit(data, labels, batch_size, kvstore):
    sym = mx.sym.SoftmaxOutput(mx.sym.FullyConnected(mx.sym.Variable("data"), num_hidden=2,
                                                     name="fc"), name="softmax")
    train = mx.io.NDArrayIter(data, labels, batch_size=batch_size, label_name="softmax_label")
    mod = mx.mod.Module(sym, context=mx.cpu())
    mx.random.seed(5)
    mod.fit(train, num_epoch=2, kvstore=kvstore, optimizer="sgd",
            optimizer_params={"learning_rate": 0.1},
            initializer=mx.init.Xavier(rnd_type="gaussian"))
    return mod.get_params()[0]["fc_weight"].asnumpy()


rng = np.random.RandomState(3)
x = rng.randn(64, 8).astype(np.float32)
y = (x.sum(axis=1) > 0).astype(np.float32)
kv = mx.kv.create("dist_byteps")
mine = slice(kv.rank * 32, (kv.rank + 1) * 32)
weights = fit(x[mine], y[mine], BATCH, kv)
print("rank %d type %s CHECKSUM %.6f" % (kv.rank, kv.type, np.abs(weights).sum()), flush=True)
if kv.rank == 0:
    order = np.concatenate([np.r_[i * BATCH:(i + 1) * BATCH, 32 + i * BATCH:32 + (i + 1) * BATCH]
                            for i in range(32 // BATCH)])
    reference = fit(x[order], y[order], 2 * BATCH, None)
    print("REFERENCE %.6f max-diff %.2e" % (np.abs(reference).sum(),
                                            np.abs(reference - weights).max()), flush=True)
sys.exit(0)
