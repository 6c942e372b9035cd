"""The worker's side of the servers' optimizer (mxnet_patch/server_optimizer.py, as backup
workers use it): the optimizer goes to the servers, a step pushes the gradient and reads the
weights back, and a learning rate changed on the worker afterwards (gluon's
trainer.set_learning_rate) is refused, not silently ignored. No network: the engine and the
submission are recorded."""
import pickle

import mxnet as mx
import pytest

from kvstore_byteps.errors import KVStoreBytePSError
from mxnet_patch.server_optimizer import ServerUpdates

WHERE = "with backup workers"


class Engine:
    def __init__(self):
        self.sent = []

    def set_optimizer(self, body, multi_precision):
        self.sent.append(pickle.loads(body))


def test_the_optimizer_goes_to_the_servers_and_a_step_pushes_the_gradient():
    engine, submitted = Engine(), []
    updates = ServerUpdates(mx.optimizer.SGD(learning_rate=0.5), engine, WHERE)
    assert [type(o).__name__ for o in engine.sent] == ["SGD"] and engine.sent[0].lr == 0.5
    grad, weights = mx.nd.ones((2, 2)), mx.nd.zeros((2, 2))
    updates.step(0, [grad], weights, lambda values, outs, p: submitted.append((values, outs)), 0)
    (values, outs), = submitted
    assert values[0].asnumpy().tolist() == [[1, 1], [1, 1]] and outs == [weights]


def test_a_learning_rate_changed_on_the_worker_is_refused():
    updates = ServerUpdates(mx.optimizer.SGD(learning_rate=0.5), Engine(), WHERE)
    updates.optimizer.set_learning_rate(0.1)           # what trainer.set_learning_rate does
    with pytest.raises(KVStoreBytePSError, match="lr_scheduler"):
        updates.step(0, [mx.nd.ones(2)], mx.nd.zeros(2), lambda *a: None, 0)


def test_multi_precision_is_refused():
    with pytest.raises(KVStoreBytePSError, match="multi_precision"):
        ServerUpdates(mx.optimizer.SGD(multi_precision=True), Engine(), WHERE)
