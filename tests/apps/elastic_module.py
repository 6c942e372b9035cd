"""An elastic worker that trains with MXNet's ``Module.fit`` (the servers update, with
momentum): ``kvstore_byteps.elastic.State(kv, epoch=0)`` before ``fit``, committed by its
``epoch_end_callback``, and ``fit`` resumes at ``begin_epoch=state.epoch``. The worker of rank
``KILL_RANK`` kills itself with SIGKILL mid-epoch ``KILL_EPOCH`` unless it was restarted
(``BYTEPS_RESTART_COUNT``). Prints ``DIGEST <rank> <md5 of the parameters> joined_late=<bool>``
at the end (every worker must print the same digest). ``HOLD_FOR_JOIN``: the others hold
their commit at the end of the last epoch but two until a late worker asks to join
(join_hold.py)."""
import hashlib
import os
import signal

import mxnet as mx
import numpy as np

import join_hold
import kvstore_byteps

EPOCHS = int(os.environ.get("EPOCHS", "30"))
KILL_EPOCH, KILL_RANK = int(os.environ.get("KILL_EPOCH", "-1")), int(os.environ.get("KILL_RANK", "2"))

join_hold.install(lambda state: state.epoch == EPOCHS - 2)
kv = mx.kv.create("dist_byteps")
state = kvstore_byteps.elastic.State(kv, epoch=0)
rng = np.random.RandomState(kv.rank)
x = rng.rand(320, 8).astype(np.float32)
y = (x.sum(axis=1) > 4).astype(np.float32)
batches = mx.io.NDArrayIter(x, y, batch_size=32)
net = mx.sym.SoftmaxOutput(mx.sym.FullyConnected(mx.sym.Variable("data"), num_hidden=2),
                           name="softmax")
module = mx.mod.Module(net, context=mx.cpu())


def epoch_end(epoch, *_):
    state.epoch = epoch + 1
    state.commit()


def batch_end(param):
    if (param.epoch == KILL_EPOCH and param.nbatch == 4 and kv.rank == KILL_RANK
            and not os.environ.get("BYTEPS_RESTART_COUNT")):
        os.kill(os.getpid(), signal.SIGKILL)


module.fit(batches, kvstore=kv, optimizer="sgd",
           optimizer_params={"learning_rate": 0.1, "momentum": 0.9},
           initializer=mx.init.Constant(0.01), begin_epoch=state.epoch, num_epoch=EPOCHS,
           epoch_end_callback=epoch_end, batch_end_callback=batch_end)
arg_params, _ = module.get_params()
weights = np.concatenate([arg_params[name].asnumpy().ravel() for name in sorted(arg_params)])
print("DIGEST %d %s joined_late=%s" % (kv.rank, hashlib.md5(weights.tobytes()).hexdigest(),
                                       state.joined_late), flush=True)
