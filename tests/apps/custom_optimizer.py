"""MXNet's own dist_sync worker with a user-registered optimizer class, sent to the servers by
``set_optimizer`` (MXNet's C++ server would unpickle it; ours refuses classes outside MXNet).
Trains 20 rounds and prints the weights: if it gets that far with the optimizer refused, the
weights were never trained."""
import mxnet as mx


@mx.optimizer.register
class MySGD(mx.optimizer.SGD):
    """A user's optimizer: MXNet's SGD under another name."""


kv = mx.kv.create("dist_sync")
kv.init(3, mx.nd.ones((4,)))
kv.set_optimizer(MySGD(learning_rate=0.1))
out = mx.nd.zeros((4,))
for step in range(20):
    kv.push(3, mx.nd.ones((4,)))
    kv.pull(3, out=out)
print("rank %d weights %s" % (kv.rank, out.asnumpy()), flush=True)
