"""A BytePS- or Horovod-style elastic worker (``STYLE=bps`` or ``hvd``): a small dense model,
``DistributedTrainer`` with momentum, ``kvstore_byteps.elastic.State(trainer=..., step=0)``
committed every step. The worker of rank ``KILL_RANK`` kills itself with SIGKILL at step
``KILL_STEP`` unless it was restarted (``BYTEPS_RESTART_COUNT``); ``DEFER=1``: the model's
initialisation is deferred to its first forward pass; ``HOLD_FOR_JOIN``: the others hold
their commit ten steps before the end until a late worker asks to join; ``HOLD_END_FOR``: the
others end only once a fifth worker (rank 4) asks (join_hold.py).
Prints ``DIGEST <rank> <md5 of the parameters> joined_late=<bool>`` at the end (every worker
must print the same digest)."""
import hashlib
import os
import signal

import mxnet as mx
import numpy as np
from mxnet import autograd, gluon

import join_hold
import kvstore_byteps

STYLE = os.environ.get("STYLE", "hvd")
if STYLE == "hvd":
    import kvstore_byteps.horovod as api
else:
    import kvstore_byteps.mxnet as api

api.init()
net = gluon.nn.Dense(4)
net.initialize(mx.init.Constant(0.1))
if os.environ.get("DEFER") != "1":
    net(mx.nd.ones((2, 8)))
params = net.collect_params()
optimizer_params = {"learning_rate": 0.1, "momentum": 0.9}
if STYLE == "hvd":
    api.broadcast_parameters(params, root_rank=0)
trainer = api.DistributedTrainer(params, "sgd", optimizer_params)
STEPS = int(os.environ.get("STEPS", "2000"))
join_hold.install(lambda state: state.step == STEPS - 10)
if api.rank() == 4:
    join_hold.asking()
state = kvstore_byteps.elastic.State(trainer=trainer, step=0)
rng = np.random.RandomState(api.rank())
kill_step, kill_rank = int(os.environ.get("KILL_STEP", "-1")), int(os.environ.get("KILL_RANK", "2"))
while state.step < STEPS:
    if (state.step == kill_step and api.rank() == kill_rank
            and not os.environ.get("BYTEPS_RESTART_COUNT")):
        os.kill(os.getpid(), signal.SIGKILL)
    x, y = mx.nd.array(rng.rand(16, 8)), mx.nd.array(rng.rand(16, 4))
    with autograd.record():
        loss = ((net(x) - y) ** 2).mean()
    loss.backward()
    trainer.step(16)
    state.step += 1
    state.commit()
join_hold.end()
weights = np.concatenate([p.data().asnumpy().ravel() for p in params.values()])
print("DIGEST %d %s joined_late=%s" % (api.rank(), hashlib.md5(weights.tobytes()).hexdigest(),
                                       state.joined_late), flush=True)
