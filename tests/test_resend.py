"""ACK/resend bookkeeping (PS_RESEND), pure."""
import pytest

from kvstore_byteps.errors import PeerError
from kvstore_byteps.van.codec import decode_meta, encode_meta
from kvstore_byteps.van.message import ControlCommand, Message, Meta
from kvstore_byteps.van.resend import MAX_RETRIES, Resender, signature
from tests import vectors


def test_signature_of_captured_barrier_response_matches_captured_ack():
    barrier_reply = decode_meta(vectors.read("07_barrier_response.meta.bin"), sender=1, recver=9)
    ack = decode_meta(vectors.read("42_ack.meta.bin"))
    assert signature(barrier_reply) == ack.control.msg_sig == 1138166333448


def test_receiver_acks_once_per_message_and_drops_duplicates():
    node = Resender(my_id=9, timeout_ms=1000)
    msg = Message(Meta(head=0, app_id=0, timestamp=3, request=True, sender=8, recver=9))
    ack, deliver = node.on_receive(msg)
    assert deliver and ack.meta.recver == 8 and ack.meta.control.cmd == ControlCommand.ACK
    assert encode_meta(ack.meta) == encode_meta(decode_meta(encode_meta(ack.meta)))
    again, deliver_again = node.on_receive(msg)
    assert not deliver_again and again.meta.control.msg_sig == ack.meta.control.msg_sig


def test_sender_resends_until_acked_then_gives_up_naming_the_node():
    node = Resender(my_id=8, timeout_ms=100)
    msg = Message(Meta(head=0, app_id=0, timestamp=5, recver=11))
    node.on_send(msg, now=0.0)
    assert node.due(0.05) == [] and node.due(0.2) == [msg]
    receiver = Resender(my_id=11, timeout_ms=100)
    ack, _ = receiver.on_receive(Message(Meta(head=0, app_id=0, timestamp=5, sender=8,
                                              recver=11)))
    assert node.on_receive(ack) == (None, False)
    assert node.due(10.0) == []
    lost = Message(Meta(head=0, app_id=0, timestamp=6, recver=13))
    node.on_send(lost, now=0.0)
    for attempt in range(MAX_RETRIES):
        assert node.due(1.0 + attempt) == [lost]
    with pytest.raises(PeerError, match="node 13"):
        node.due(100.0)
