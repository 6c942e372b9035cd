"""A BytePS-API training script that runs at least SECONDS: ``bps_long_train.py SECONDS``.

Every rank trains one Dense layer with ``bps.DistributedTrainer`` on batches of its own (so
the sums matter), one step at least every 0.2 s, until SECONDS passed since ``bps.init()``
and at least 5 steps were made; the number of steps is rank 0's, broadcast, so every rank
makes the same. Prints ``RANK r/size LOCAL l/ls PARAMS <sha256 of the final weights>`` and
``BPS LONG OK``.
"""
import hashlib
import sys
import time

import mxnet as mx
import numpy as np

import kvstore_byteps.mxnet as bps


def main(seconds: float) -> None:
    bps.init()
    started = time.monotonic()
    rank, size = bps.rank(), bps.size()
    mx.random.seed(5)
    net = mx.gluon.nn.Dense(3, in_units=5)
    net.initialize(mx.init.Uniform(1.0))
    trainer = bps.DistributedTrainer(net.collect_params(), "sgd", {"learning_rate": 0.05})
    loss = mx.gluon.loss.L2Loss()
    rng = np.random.default_rng(rank)
    step, more = 0, True
    while more:
        data = mx.nd.array(rng.standard_normal((8, 5)).astype(np.float32))
        label = mx.nd.array(rng.standard_normal((8, 3)).astype(np.float32))
        with mx.autograd.record():
            out = loss(net(data), label)
        out.backward()
        trainer.step(8)
        step += 1
        # every rank takes rank 0's word for whether to go on: the same number of steps
        go_on = mx.nd.array([1.0 if rank == 0 and (step < 5 or time.monotonic() - started
                                                       < seconds) else 0.0])
        bps.byteps_push_pull(go_on, name="go_on_%d" % step, is_average=False)
        more = go_on.asscalar() > 0
        time.sleep(0.2)
    digest = hashlib.sha256()
    for name, param in sorted(net.collect_params().items()):
        digest.update(param.data().asnumpy().tobytes())
    print("RANK %d/%d LOCAL %d/%d STEPS %d PARAMS %s"
          % (rank, size, bps.local_rank(), bps.local_size(), step, digest.hexdigest()),
          flush=True)
    print("BPS LONG OK", flush=True)


if __name__ == "__main__":
    main(float(sys.argv[1]))
