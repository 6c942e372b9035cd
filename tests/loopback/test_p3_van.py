"""The P3 van (DMLC_PS_VAN_TYPE=p3): ZeroMQ's wire, sends ordered by priority."""
import threading

import pytest

from kvstore_byteps.config import Config, VanType
from kvstore_byteps.errors import ProtocolError
from kvstore_byteps.van.zmq import van as zmq_van
from kvstore_byteps.van.runtime.membership import terminate_message
from kvstore_byteps.van.wire.message import K_EMPTY, Message, Meta
from kvstore_byteps.van.p3.van import P3Van
from kvstore_byteps.van.registry import make_van


def test_p3_is_a_van_type_of_its_own():
    config = Config.from_env({"DMLC_PS_VAN_TYPE": "p3"})
    assert config.van_type is VanType.P3
    van = make_van(config)
    try:
        assert isinstance(van, P3Van) and isinstance(van, zmq_van.ZMQVan)
    finally:
        van.close()


def test_queued_messages_leave_highest_priority_first_equal_ones_in_order(monkeypatch):
    sent, first_out, go = [], threading.Event(), threading.Event()

    def socket_send(van, message):          # the ZeroMQ send, slow for the first message
        sent.append(message.meta.timestamp)
        if len(sent) == 1:
            first_out.set()
            go.wait(10)
        return 0
    monkeypatch.setattr(zmq_van.ZMQVan, "send", socket_send)
    van = P3Van(Config())
    van._locks[8] = threading.Lock()         # as if connected to node 8
    try:
        van.send(Message(Meta(timestamp=0, priority=0, recver=8)))
        assert first_out.wait(10)
        for timestamp, priority in ((1, -5), (2, 3), (3, 0), (4, 3), (5, -1)):
            van.send(Message(Meta(timestamp=timestamp, priority=priority, recver=8)))
        van._locks[1] = threading.Lock()
        van.send(terminate_message(1))       # goes last: the sender stops after it
        go.set()
        van._sender.join(10)
        assert not van._sender.is_alive()
        assert sent == [0, 2, 4, 3, 5, 1, K_EMPTY]
    finally:
        go.set()
        van.close()


def test_a_send_to_a_node_never_connected_fails_at_once():
    van = P3Van(Config())
    try:
        with pytest.raises(ProtocolError, match="no connection to node 8"):
            van.send(Message(Meta(recver=8)))
    finally:
        van.close()
