"""What a worker hands over to a late one where the workers update (kvstore_byteps/handover.py):
bytes that carry arrays and JSON without pickle, refused when malformed, and a gluon Trainer's
parameters and optimizer state (momentum, update counts) that make a fresh trainer step
exactly as the old one."""
import mxnet as mx
import numpy as np
import pytest
from mxnet import autograd, gluon

from kvstore_byteps import handover


def test_arrays_and_meta_round_trip_and_malformed_bytes_are_refused():
    arrays = {"a": np.arange(6, dtype=np.float32).reshape(2, 3),
              "b": np.array([1, 2], np.int64), "c": np.zeros((0,), np.float16)}
    meta, back = handover.decode(handover.encode(arrays, {"x": [1, None]}))
    assert meta == {"x": [1, None]} and back.keys() == arrays.keys()
    for name, value in arrays.items():
        assert back[name].dtype == value.dtype and np.array_equal(back[name], value)
    data = handover.encode(arrays, {})
    for bad, why in [(b"pickle" + data, "does not start"), (data[:-4], "cut short"),
                     (data + b"x", "past its arrays"),
                     (data.replace(b"float32", b"float31"), "dtype")]:
        with pytest.raises(ValueError, match=why):
            handover.decode(bad)


def _trainer(seed):
    net = gluon.nn.Dense(3, in_units=4)
    mx.random.seed(seed)
    net.initialize(mx.init.Xavier())
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1,
                                                          "momentum": 0.9}, kvstore=None)
    return net, trainer


def _step(net, trainer, x):
    with autograd.record():
        loss = (net(x) ** 2).sum()
    loss.backward()
    trainer.step(1)


def test_a_fresh_trainer_given_the_hand_over_steps_exactly_as_the_old_one():
    x = mx.nd.array(np.random.RandomState(0).rand(2, 4))
    old_net, old = _trainer(1)
    for _ in range(3):          # momentum built up
        _step(old_net, old, x)
    new_net, new = _trainer(2)  # other initial weights, no optimizer state
    handover.to_trainer(new, handover.of_trainer(old))
    _step(old_net, old, x)
    _step(new_net, new, x)
    for a, b in zip(old_net.collect_params().values(), new_net.collect_params().values()):
        assert np.array_equal(a.data().asnumpy(), b.data().asnumpy())
    assert new._optimizer.num_update == old._optimizer.num_update
    dense = gluon.nn.Dense(5, in_units=4)
    dense.initialize()
    other = gluon.Trainer(dense.collect_params(), "sgd", kvstore=None)
    with pytest.raises(ValueError, match="does not fit"):
        handover.to_trainer(other, handover.of_trainer(old))
