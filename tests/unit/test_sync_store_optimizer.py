"""Synchronous training's store with the servers' optimizer (mxnet_patch/sync_training.py) and
the engine's side of it (engine/modes.py, engine/recovery.py, WorkerEngine.set_optimizer): the
store is optimizer-capable; before set_optimizer rounds are sums, after it a round's answer is
the weights and a pull with no push reads the servers; set_optimizer is refused after the first
round or with buckets formed, and then turns buckets and server recovery off and has
compressed partitions pull the weights plain. No network: the store's port and the engine's parts are recorded."""
import pickle
from types import SimpleNamespace

import mxnet as mx
import numpy as np
import pytest

from kvstore_byteps.config import TrainingMode
from kvstore_byteps.engine.modes import SERVERS_UPDATE, servers_update_refusal
from kvstore_byteps.engine.recovery import RecoveryKeeper, Unrecoverable
from kvstore_byteps.engine.routes import compression_refusal
from kvstore_byteps.engine.worker import WorkerEngine
from kvstore_byteps.errors import KVStoreBytePSError, PeerError
from kvstore_byteps.van.wire.message import Node, Role
from mxnet_patch.store_modes import StorePort, store_mode


class Store:
    """What the mode may do with its store, recorded."""

    def __init__(self):
        self.held = {0: mx.nd.zeros((2,))}
        self.submitted, self.sent, self.reads = [], [], []

    def port(self):
        return StorePort(
            rank=lambda: 0, initialised_key=lambda key: key, held=self.held.__getitem__,
            submit=lambda ikey, values, outs, priority, fusable=True: self.submitted.append(
                (ikey, values, outs, fusable)),
            read=self.read, training_over=lambda: False,
            set_optimizer=lambda body, multi_precision: self.sent.append(
                (pickle.loads(body), multi_precision)))

    def read(self, ikey, shape, dtype):
        self.reads.append(ikey)
        return np.full(shape, 7.0, dtype)


@pytest.fixture
def store():
    recorded = Store()
    return recorded, store_mode(TrainingMode(), recorded.port())


def test_the_store_is_optimizer_capable_and_sums_until_set_optimizer(store):
    recorded, mode = store
    assert mode.takes_optimizer and mode.type_word == "sync"
    grads = [mx.nd.ones((2,))]
    mode.pushpull(0, grads, grads, 0)
    mode.push(0, grads, 0)
    mode.before_pull(0, recorded.held[0], 0)
    mode.before_pull(0, recorded.held[0], 0)        # no push since: still the held sum
    assert recorded.reads == [] and [s[3] for s in recorded.submitted] == [True, False]
    with pytest.raises(NotImplementedError, match="keeps no optimizer"):
        mode.optimizer_states("save")


def test_with_the_servers_optimizer_a_round_answers_into_the_weights(store):
    recorded, mode = store
    mode.set_optimizer(mx.optimizer.SGD(learning_rate=0.5, momentum=0.9))
    assert [type(o).__name__ for o, _ in recorded.sent] == ["SGD"]
    grads, weights = [mx.nd.ones((2,))], [mx.nd.zeros((2,))]
    mode.pushpull(0, grads, weights, -1)
    assert recorded.submitted[-1] == (0, grads, weights, True)
    mode.push(0, grads, 0)
    mode.before_pull(0, recorded.held[0], 0)        # after its push: the round's weights
    assert recorded.reads == []
    mode.before_pull(0, recorded.held[0], 0)        # no push since the last pull: the servers'
    assert recorded.reads == [0] and recorded.held[0].asnumpy().tolist() == [7.0, 7.0]
    assert mode.updater is None


def test_the_servers_optimizer_states_are_refused_with_what_to_do(store):
    _, mode = store
    mode.set_optimizer(mx.optimizer.Adam())
    for what in ("save", "load"):
        with pytest.raises(NotImplementedError, match="%s_optimizer_states.*update_on_kvstore="
                                                      "False" % what):
            mode.optimizer_states(what)


def test_multi_precision_goes_to_the_servers_and_a_changed_learning_rate_is_refused(store):
    recorded, mode = store
    mode.set_optimizer(mx.optimizer.SGD(multi_precision=True))
    assert [flag for _, flag in recorded.sent] == [True]      # kSetMultiPrecision follows
    optimizer = mx.optimizer.SGD(learning_rate=0.5)
    mode.set_optimizer(optimizer)
    optimizer.set_learning_rate(0.1)                # what trainer.set_learning_rate does
    with pytest.raises(KVStoreBytePSError, match="lr_scheduler"):
        mode.pushpull(0, [mx.nd.ones((2,))], [mx.nd.zeros((2,))], 0)


@pytest.mark.parametrize("begun,buckets,compressed,words", [
    (True, 0, False, "after the first push"),
    (True, 3, False, "after gradient buckets were formed \\(3\\)")])
def test_set_optimizer_is_refused_where_the_servers_cannot_take_it(begun, buckets, compressed,
                                                                   words):
    refusal = servers_update_refusal(begun, buckets)
    assert refusal.startswith("set_optimizer") and "update_on_kvstore=False" in refusal
    engine = _engine(begun, buckets, compressed)
    with pytest.raises(KVStoreBytePSError, match=words):
        WorkerEngine.set_optimizer(engine, b"body")
    assert engine.sent == [] and engine.fusion.enabled and engine.keeper.reason == ""


def test_set_optimizer_with_compression_set_has_compressed_partitions_pull_weights():
    engine = _engine(False, 0, True)
    WorkerEngine.set_optimizer(engine, b"body")
    assert engine.sent == ["weights", b"body"] and engine.keeper.reason is SERVERS_UPDATE


def test_set_optimizer_turns_buckets_and_server_recovery_off():
    assert servers_update_refusal(False, 0) is None
    engine = _engine(False, 0, False)
    WorkerEngine.set_optimizer(engine, b"body")
    assert engine.sent == ["weights", b"body"] and not engine.fusion.enabled
    assert engine.keeper.reason is SERVERS_UPDATE
    engine.rounds.begun = lambda: True       # a second set_optimizer replaces the servers'
    WorkerEngine.set_optimizer(engine, b"again")
    assert engine.sent == ["weights", b"body", b"again"]
    # compression after set_optimizer is taken too (the gradients compressed, weights plain)
    assert compression_refusal(False, None, TrainingMode()) is None


def test_a_keeper_that_gave_up_keeps_nothing_and_restores_no_server():
    failures, failed = [], []
    keeper = RecoveryKeeper(SimpleNamespace(fail_server=lambda node, e: failed.append(e)), 1,
                            failures.append)
    keeper.give_up(SERVERS_UPDATE)
    part = SimpleNamespace(ps_key=5, nbytes=8, server=0)
    keeper.keep(SimpleNamespace(partitions=[part], dtype=np.float32))
    assert keeper.on_send([SimpleNamespace(partition=part)], [np.zeros(2, np.float32)]) is None
    keeper.answered([SimpleNamespace(partition=part)])
    keeper.recover(Node(role=Role.SERVER, id=8), 1)
    assert len(failures) == 1 and isinstance(failures[0], PeerError)
    assert "the servers keep the weights" in str(failures[0]) and failed == failures
    plain = Unrecoverable(None, 0, "no BYTEPS_SERVER_RECOVERY", failures.append)
    plain.give_up(SERVERS_UPDATE)
    assert plain.reason is SERVERS_UPDATE


def _engine(begun, buckets, compressed):
    """The parts of a worker engine that set_optimizer uses."""
    sent = []
    fusion = SimpleNamespace(enabled=True, plan=SimpleNamespace(fused=lambda: [0] * buckets))
    fusion.disable = lambda why: setattr(fusion, "enabled", False)
    return SimpleNamespace(
        mode=TrainingMode(), sent=sent, fusion=fusion, rank=1,
        rounds=SimpleNamespace(begun=lambda: begun, compressed=object() if compressed else None,
                               answer_weights=lambda: sent.append("weights")),
        keeper=RecoveryKeeper(None, 0, lambda error: None),
        cluster=SimpleNamespace(set_optimizer=lambda body, multi_precision: sent.append(body)))
