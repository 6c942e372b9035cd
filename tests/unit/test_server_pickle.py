"""The restricted optimizer unpickler and kController with real MXNet optimizers."""
import os
import pickle

import numpy as np
import pytest

from kvstore_byteps.errors import ProtocolError
from kvstore_byteps.serving.dist import KVStoreDistServer
from kvstore_byteps.mxproto import ServerCommand
from kvstore_byteps.serving.unpickle import UnsafePickleError, load_optimizer
from kvstore_byteps.serving.updater import MXNetUpdater, RowSparseGrad, load_mxnet_updater
from tests.support.server_fakes import WORKER0, WORKER1, FakeServer, command, pull, push, vector_request

mx = pytest.importorskip("mxnet")


class _Evil:
    """Unpickling this runs ``os.system(cmd)`` under a plain ``pickle.loads``."""

    def __init__(self, cmd):
        self.cmd = cmd

    def __reduce__(self):
        return (os.system, (self.cmd,))


def test_golden_controller_body_unpickles_to_the_sgd_it_was():
    body = vector_request("20_cmd_controller_optimizer").meta.body
    opt = load_optimizer(body)
    assert type(opt) is mx.optimizer.SGD and opt.lr == 0.1 and opt.rescale_grad == 1.0


@pytest.mark.parametrize("make", [
    lambda: mx.optimizer.SGD(learning_rate=0.1, momentum=0.9, multi_precision=True),
    lambda: mx.optimizer.Adam(learning_rate=0.01, wd=1e-4),
    lambda: mx.optimizer.SGD(lr_scheduler=mx.lr_scheduler.FactorScheduler(step=10, factor=0.5)),
    lambda: mx.optimizer.RMSProp(), lambda: mx.optimizer.NAG(momentum=0.5),
])
def test_upstream_optimizer_pickles_are_admitted(make):
    opt = make()
    loaded = load_optimizer(pickle.dumps(opt, 0))
    assert type(loaded) is type(opt) and loaded.lr == opt.lr
    assert load_optimizer(pickle.dumps(opt, 4)).__dict__.keys() == loaded.__dict__.keys()


def test_malicious_pickle_is_rejected_and_not_executed(tmp_path):
    marker = tmp_path / "pwned"
    body = pickle.dumps(_Evil("touch %s" % marker), 0)
    pickle.loads(pickle.dumps(_Evil("true"), 0))          # the payload does run under loads
    with pytest.raises(UnsafePickleError, match=r"posix\.system|os\.system"):
        load_optimizer(body)
    assert not marker.exists()


@pytest.mark.parametrize("payload,name", [
    ((eval, ("1",)), r"__builtin__\.eval"),           # protocol 0 spells builtins that way
    ((__import__, ("os",)), r"__builtin__\.__import__"),
    ((mx.optimizer.optimizer.register, (None,)), r"__builtin__\.getattr"),  # a static method
    ((mx.optimizer.Updater, (None,)), "Updater"),
    ((np.load, ("x",)), "numpy"),
])
def test_globals_outside_the_allowlist_are_named_in_the_error(payload, name):
    class Reducer:
        def __reduce__(self):
            return payload
    with pytest.raises(UnsafePickleError, match=name):
        load_optimizer(pickle.dumps(Reducer(), 0))


def test_functions_and_private_names_of_mxnet_optimizer_modules_are_refused():
    for name in (b"get_updater", b"_flatten_list", b"np"):
        body = b"cmxnet.optimizer.optimizer\n" + name + b"\n(NtR."
        with pytest.raises(UnsafePickleError, match="%s, which is not a subclass" % name.decode()):
            load_optimizer(body)


def test_garbage_and_non_optimizers_are_protocol_errors():
    with pytest.raises(ProtocolError, match="cannot unpickle"):
        load_optimizer(b"this is not a pickle")
    with pytest.raises(ProtocolError, match="not an mxnet Optimizer"):
        load_optimizer(pickle.dumps({"lr": 0.1}, 0))


def test_mxnet_updater_matches_a_local_sgd_step_dense_and_row_sparse():
    updater = MXNetUpdater(mx.optimizer.SGD(learning_rate=0.5, momentum=0.9))
    weight = np.arange(6, dtype=np.float32)
    grad = np.ones(6, np.float32)
    new = updater(3, grad, weight)
    assert (weight == np.arange(6)).all()                         # not modified in place
    np.testing.assert_allclose(new, weight - 0.5, rtol=1e-6)
    new2 = updater(3, grad, new)                                  # momentum state kept per key
    np.testing.assert_allclose(new2, new - 0.5 - 0.9 * 0.5, rtol=1e-6)
    sparse = updater(4, RowSparseGrad(np.array([1]), np.ones((1, 2), np.float32), (3, 2)),
                     np.zeros((3, 2), np.float32))
    np.testing.assert_allclose(sparse, [[0, 0], [-0.5, -0.5], [0, 0]], rtol=1e-6)


def test_controller_command_installs_sgd_and_the_round_applies_it():
    srv, fake = KVStoreDistServer(2), FakeServer()
    srv.handle_command(command(WORKER0, ServerCommand.SYNC_MODE), fake)
    for sender in (WORKER0, WORKER1):   # every worker sends the optimizer
        srv.handle_command(vector_request("20_cmd_controller_optimizer", sender), fake)
    assert fake.errors() == [] and isinstance(srv.updater, MXNetUpdater)
    srv.handle_request(push(WORKER0, 8, np.ones(5, np.float32)), fake)
    srv.handle_request(push(WORKER0, 8, np.full(5, 1.0, np.float32)), fake)
    srv.handle_request(push(WORKER1, 8, np.full(5, 2.0, np.float32)), fake)
    p = pull(WORKER0, 8)
    srv.handle_request(p, fake)
    np.testing.assert_allclose(fake.answer_to(p).values(), 1.0 - 0.1 * 3.0, rtol=1e-6)


def test_malicious_controller_gets_an_error_answer_and_the_server_keeps_serving(tmp_path):
    marker = tmp_path / "pwned"
    srv, fake = KVStoreDistServer(1, updater_loader=load_mxnet_updater), FakeServer()
    bad = command(WORKER0, ServerCommand.CONTROLLER, pickle.dumps(_Evil("touch %s" % marker), 0))
    srv.handle_command(bad, fake)
    assert "refusing to unpickle" in fake.answer_to(bad).error
    assert not marker.exists() and srv.updater is None and not srv.stopped
    srv.handle_request(push(WORKER0, 1, np.ones(2, np.float32)), fake)
    p = pull(WORKER0, 1)
    srv.handle_request(p, fake)
    assert list(fake.answer_to(p).values()) == [1.0, 1.0]
