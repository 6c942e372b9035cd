"""A BytePS- or Horovod-style elastic worker (``STYLE=bps`` or ``hvd``): a small dense model,
``DistributedTrainer`` with momentum, ``kvstore_byteps.elastic.State(trainer=..., step=0)``
committed every step. The worker of rank ``KILL_RANK`` kills itself with SIGKILL at step
``KILL_STEP`` unless it was restarted (``BYTEPS_RESTART_COUNT``); ``DEFER=1``: the model's
initialisation is deferred to its first forward pass; ``HOLD_END_FOR=<file>``: a fifth worker
(rank 4) makes the file as it asks to join (after ``HOLD_END_PAUSE`` more seconds), and the
others end (without another commit) only once it is there; ``HOLD_FOR_JOIN``: the others
hold their commit ten steps before the end until a late worker asks to join (join_hold.py).
Prints ``DIGEST <rank> <md5 of the parameters> joined_late=<bool>`` at the end (every worker
must print the same digest)."""
import hashlib
import os
import signal
import time

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
hold = os.environ.get("HOLD_END_FOR")
if hold and api.rank() == 4:
    open(hold, "w").close()
    time.sleep(float(os.environ.get("HOLD_END_PAUSE", "0")))    # (the others end meanwhile)
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
deadline = time.monotonic() + 60
while hold and not os.path.exists(hold) and time.monotonic() < deadline:
    time.sleep(0.1)
time.sleep(1.0 if hold else 0)      # (the fifth asks to join meanwhile)
weights = np.concatenate([p.data().asnumpy().ravel() for p in params.values()])
print("DIGEST %d %s joined_late=%s" % (api.rank(), hashlib.md5(weights.tobytes()).hexdigest(),
                                       state.joined_late), flush=True)
