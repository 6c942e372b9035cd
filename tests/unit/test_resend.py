"""ACK/resend bookkeeping (PS_RESEND), pure."""
import pytest

from kvstore_byteps.errors import PeerError
from kvstore_byteps.van.wire.codec import decode_meta, encode_meta
from kvstore_byteps.van.wire.message import Control, ControlCommand, Message, Meta
from kvstore_byteps.van.runtime.resend import (INITIAL_RTO_S, MAX_RETRIES, MAX_RTO_S, MIN_RTO_S,
                                       Resender, RetransmitTimer, signature)
from tests.support import vectors


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


def _request(timestamp, recver, sender=9):
    return Message(Meta(head=0, app_id=0, timestamp=timestamp, request=True, push=True,
                        sender=sender, recver=recver))


def test_an_answer_acknowledges_its_request_even_when_the_ack_is_lost():
    worker = Resender(my_id=9, timeout_ms=100)
    worker.on_send(_request(5, recver=8), now=0.0)
    worker.on_send(_request(6, recver=8), now=0.0)
    answer = Message(Meta(head=0, app_id=0, timestamp=5, request=False, push=True, sender=8,
                          recver=9))
    ack, deliver = worker.on_receive(answer, now=0.01)
    assert deliver and ack is not None          # the answer itself is acknowledged as usual
    assert [m.meta.timestamp for m in worker.due(1.0)] == [6]   # only the unanswered one
    assert worker.pending == 1


def test_adaptive_timeout_follows_measured_round_trips_not_a_fixed_second():
    worker = Resender(my_id=9)                  # PS_RESEND_TIMEOUT unset
    server = Resender(my_id=8)
    for ts in range(20):                        # round trips of 2 ms
        sent = _request(ts, recver=8)
        worker.on_send(sent, now=ts)
        ack, _ = server.on_receive(sent)
        worker.on_receive(ack, now=ts + 0.002)
    timer = worker.timer(8)
    assert timer.rto == MIN_RTO_S and abs(timer.srtt - 0.002) < 1e-9
    lost = _request(99, recver=8)
    worker.on_send(lost, now=100.0)
    assert worker.due(100.0 + MIN_RTO_S / 2) == []
    assert worker.due(100.0 + MIN_RTO_S) == [lost]          # a round trip, not a second
    assert worker.due(100.0 + 2 * MIN_RTO_S) == []          # backed off: twice as long
    assert worker.due(100.0 + 3 * MIN_RTO_S) == [lost]
    assert timer.rto == 4 * MIN_RTO_S                       # new messages wait longer too


def test_karns_rule_no_sample_from_a_resent_message_and_the_timeout_is_capped():
    worker = Resender(my_id=9)
    msg = _request(1, recver=8)
    worker.on_send(msg, now=0.0)
    now = 0.0
    for _ in range(6):                          # unanswered: 1 s, then capped at MAX_RTO_S
        now += MAX_RTO_S
        assert worker.due(now) == [msg]
    assert worker.timer(8).rto == MAX_RTO_S
    ack, _ = Resender(my_id=8).on_receive(msg)
    worker.on_receive(ack, now=now + 5.0)       # ambiguous round trip: not sampled
    assert worker.timer(8).srtt is None and worker.pending == 0


def test_a_fixed_timeout_stays_fixed():
    worker = Resender(my_id=9, timeout_ms=300)
    msg = _request(1, recver=8)
    worker.on_send(msg, now=0.0)
    assert worker.due(0.29) == [] and worker.due(0.3) == [msg]
    assert worker.due(0.59) == [] and worker.due(0.6) == [msg]


def test_after_leaving_an_unacknowledged_message_is_given_up_quietly():
    node = Resender(my_id=1, timeout_ms=100)
    goodbye = Message(Meta(head=0, app_id=0, timestamp=3, recver=9,
                           control=Control(cmd=ControlCommand.BARRIER, barrier_group=7)))
    node.on_send(goodbye, now=0.0)
    node.leave()
    for attempt in range(MAX_RETRIES):
        assert node.due(1.0 + attempt) == [goodbye]
    assert node.due(100.0) == [] and node.given_up == 1 and node.pending == 0


def test_retransmit_timer_is_rfc_6298():
    timer = RetransmitTimer(initial=1.0, minimum=0.0, maximum=60.0)
    timer.sample(0.1)
    assert (timer.srtt, timer.rttvar) == (0.1, 0.05) and abs(timer.rto - 0.3) < 1e-12
    timer.sample(0.3)
    assert abs(timer.rttvar - (0.75 * 0.05 + 0.25 * 0.2)) < 1e-12
    assert abs(timer.srtt - (0.875 * 0.1 + 0.125 * 0.3)) < 1e-12
    assert abs(timer.rto - (timer.srtt + 4 * timer.rttvar)) < 1e-12
    timer.backoff()
    assert abs(timer.rto - 2 * (timer.srtt + 4 * timer.rttvar)) < 1e-12


def _ack_of(message):
    ack, _ = Resender(my_id=message.meta.recver).on_receive(message)
    return ack


def test_fast_retransmit_an_ack_of_a_later_message_resends_the_earlier_ones_at_once():
    worker = Resender(my_id=9)
    a, b, c = (_request(ts, recver=8) for ts in (1, 2, 3))
    other = _request(4, recver=10)
    for message in (a, other, b, c):
        worker.on_send(message, now=0.0)
    worker.on_receive(_ack_of(b), now=0.01)
    assert worker.due(0.01) == [a]              # long before any timeout; not c, not node 10
    assert worker.timer(8).rto == MIN_RTO_S     # (b's round trip measured; no backoff)
    worker.on_receive(_ack_of(c), now=0.02)     # a was sent again after c: not lost again
    assert worker.due(0.02) == []
    srtt = worker.timer(8).srtt
    worker.on_receive(_ack_of(a), now=0.5)      # the resend's ACK: no sample (Karn)
    assert worker.timer(8).srtt == srtt and worker.pending == 1 and worker.resent == 1


def test_no_fast_retransmit_where_the_van_reorders_sends():
    worker = Resender(my_id=9, in_order=False)  # the p3 van sends by priority
    a, b = _request(1, recver=8), _request(2, recver=8)
    worker.on_send(a, now=0.0)
    worker.on_send(b, now=0.0)
    worker.on_receive(_ack_of(b), now=0.01)
    assert worker.due(0.01) == [] and worker.due(INITIAL_RTO_S) == [a]


class _GoneVan:
    """A van whose every peer has closed its connection."""

    def send(self, message):
        raise PeerError("sending to node %d failed: [Errno 32] Broken pipe" % message.meta.recver)


def _postoffice_receiving_with_resend(leaving):
    from kvstore_byteps.config import Config, Role
    from kvstore_byteps.van.runtime.postoffice import Postoffice
    office = Postoffice(Config(role=Role.WORKER), van=_GoneVan())
    office._link.resender = Resender(my_id=9, timeout_ms=1000)
    if leaving:
        office._link.resender.leave()
    return office


def test_ack_to_a_sender_that_already_left_is_quiet_after_the_shutdown_barrier_began():
    """CI saw it: a server resent an answer whose ACK was lost, then exited; the worker,
    already in its shutdown barrier, failed its whole receive loop on the ACK's broken pipe."""
    answer = Message(Meta(head=0, app_id=0, timestamp=3, sender=8, recver=9))
    office = _postoffice_receiving_with_resend(leaving=True)
    assert office._on_message(answer) is True
    mid_job = _postoffice_receiving_with_resend(leaving=False)
    with pytest.raises(PeerError, match="Broken pipe"):
        mid_job._on_message(answer)
