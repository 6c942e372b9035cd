"""The byteps_rdma van's connection logic (van/rdma/channel.py, van/rdma/wire.py) over the strict
soft provider in one process: inline and rendezvous messages, order, credits, failures."""
import numpy as np
import pytest

from kvstore_byteps.errors import PeerError, ProtocolError
from kvstore_byteps.van.rdma import wire
from kvstore_byteps.van.rdma.channel import Channel
from kvstore_byteps.van.rdma.regions import RegistrationCache
from kvstore_byteps.van.tcp.recv_buffers import RecvBufferPool
from kvstore_byteps.van.rdma.verbs.soft import InProcessFabric


class Link:
    """Two channels joined through two soft devices; :meth:`settle` runs both ends' polling."""

    def __init__(self, cached=False, **options):
        """``cached``: each end registers through a cache and lands in a receive pool, as
        the van does."""
        fabric = InProcessFabric()
        self.ends = []
        self.landings = []
        self.caches, self.pools = [], []
        for _ in range(2):
            device = fabric.device()
            pd, cq = device.alloc_pd(), device.create_cq(4096)
            if cached:
                self.caches.append(RegistrationCache(pd))
                self.pools.append(RecvBufferPool(min_bytes=1024))
                options.update(registrations=self.caches[-1], landing=self.pools[-1].take)
            else:
                options.update(landing=self._landing)
            channel = Channel(device, pd, cq, **options)
            self.ends.append((channel, cq))
        a, b = (channel for channel, _ in self.ends)
        a_info, b_info = a.info(), b.info()
        a.connect(wire.ChannelInfo.decode(b_info.encode()))
        b.connect(wire.ChannelInfo.decode(a_info.encode()))

    def _landing(self, key, nbytes):
        self.landings.append((key, nbytes))
        return np.empty(nbytes, np.uint8)

    def settle(self, rounds=1000):
        for _ in range(rounds):
            busy = False
            for channel, cq in self.ends:
                for completion in cq.poll(64):
                    busy = True
                    channel.on_completion(completion)
                channel.pump()
            if not busy:
                return
        raise AssertionError("the channels did not settle")

    def messages(self, end):
        channel = self.ends[end][0]
        got = [[bytes(memoryview(piece).cast("B")) for piece in message]
               for message in channel.delivered]
        channel.delivered.clear()
        return got


def kv_message(key, nbytes, fill):
    meta = b"meta-%d" % key
    return [meta, np.array([key], np.uint64), np.full(nbytes, fill, np.uint8),
            np.array([nbytes], np.int32)]


def as_bytes(message):
    return [bytes(memoryview(piece).cast("B")) for piece in message]


def test_small_messages_travel_inline_in_order_both_ways():
    link = Link()
    a, b = link.ends[0][0], link.ends[1][0]
    sent_ab = [kv_message(k, 100 + k, k) for k in range(10)]
    sent_ba = [kv_message(k, 10, 255 - k) for k in range(5)]
    for message in sent_ab:
        a.send(message)
    for message in sent_ba:
        b.send(message)
    link.settle()
    assert link.messages(1) == [as_bytes(m) for m in sent_ab]
    assert link.messages(0) == [as_bytes(m) for m in sent_ba]
    assert link.landings == []                       # nothing was written


def test_large_frames_are_written_into_a_landing_chosen_by_key_and_stay_in_order():
    link = Link(written_from=4096)
    a = link.ends[0][0]
    sent = [kv_message(7, 100000, 1), kv_message(8, 20, 2), kv_message(9, 5000, 3)]
    for message in sent:
        a.send(message)
    link.settle()
    assert link.messages(1) == [as_bytes(m) for m in sent]   # the small one waited its turn
    assert link.landings == [(7, 100000), (9, 5000)]


def test_a_meta_larger_than_the_slot_is_written_too():
    link = Link(slot_bytes=256)
    message = [b"x" * 1000, np.arange(4, dtype=np.uint64)]
    link.ends[0][0].send(message)
    link.settle()
    assert link.messages(1) == [as_bytes(message)]
    assert link.landings == [(-1, 1000)]


def test_credits_bound_what_is_in_flight_and_come_back_without_rnr():
    link = Link(slots=4, max_send_wr=8)
    a = link.ends[0][0]
    sent = [kv_message(k, 64, k) for k in range(50)]
    for message in sent:
        a.send(message)                 # far more than the peer's 4 receives
    assert len(a._queue) == 50 - 4      # posted only what the peer had receives for
    link.settle()
    assert link.messages(1) == [as_bytes(m) for m in sent]
    assert a.failure is None and link.ends[1][0].failure is None


def test_many_rendezvous_at_once_with_few_slots_and_work_requests():
    link = Link(slots=2, max_send_wr=4, written_from=1024)
    a, b = link.ends[0][0], link.ends[1][0]
    sent = [kv_message(k, 2048 + k, k) for k in range(20)]
    back = [kv_message(k, 3000, 100 + k) for k in range(20)]
    for x, y in zip(sent, back):
        a.send(x)
        b.send(y)
    link.settle()
    assert link.messages(1) == [as_bytes(m) for m in sent]
    assert link.messages(0) == [as_bytes(m) for m in back]


def test_landing_regions_are_gone_once_the_data_landed():
    link = Link(written_from=1024)
    device = link.ends[1][0].qp.device
    before = len(device.by_rkey)
    link.ends[0][0].send(kv_message(1, 50000, 9))
    link.settle()
    assert len(device.by_rkey) == before            # deregistered: no later write lands
    assert len(link.ends[0][0].qp.device.by_lkey) == len(
        link.ends[0][0]._regions)                   # the sender's piece region too


def test_cached_registrations_serve_every_round_and_read_the_current_contents():
    link = Link(cached=True, written_from=1024)
    a, b = link.ends[0][0], link.ends[1][0]
    gradient = np.zeros(3 * 50000, np.uint8)          # one buffer, three partitions
    for step in range(4):
        gradient[:] = step + 1
        sent = [[b"meta", np.array([key], np.uint64), gradient[key * 50000:(key + 1) * 50000],
                 np.array([50000], np.int32)] for key in range(3)]
        for message in sent:
            a.send(message)
        link.settle()
        got = link.messages(1)                        # copied out: the landings are free
        assert got == [as_bytes(m) for m in sent]
        if step == 0:
            first = [cache.registered for cache in link.caches]
    # after the first round nothing is registered: the sender's buffer once, each landing once
    assert [cache.registered for cache in link.caches] == first == [1, 3]
    assert link.pools[1].allocated == 3 and link.pools[1].reused == 9
    assert a.failure is None and b.failure is None


def test_a_peer_gone_fails_the_channel_with_a_peer_error():
    link = Link()
    a, b = link.ends[0][0], link.ends[1][0]
    b.qp.to_error()
    a.send(kv_message(1, 10, 1))
    link.settle()
    assert isinstance(a.failure, PeerError) and "RETRY_EXC_ERR" in str(a.failure)
    with pytest.raises(PeerError):
        a.send(kv_message(2, 10, 1))


def test_wire_messages_that_do_not_add_up_are_refused():
    header = wire.encode_announce(wire.INLINE, 0, [5], [True])
    assert wire.decode(memoryview(header + b"hello")).pieces[0].tobytes() == b"hello"
    for bad in (header + b"hell", header + b"hello!", b"\x01",
                wire.encode_announce(wire.INLINE, 0, [5], [False]),
                wire.encode_reply(3, [(1, 2)])[:-1], bytes([9, 0, 0, 0, 0, 0, 0, 0])):
        with pytest.raises(ProtocolError):
            wire.decode(memoryview(bad))
    with pytest.raises(ProtocolError, match="malformed RDMA channel info"):
        wire.ChannelInfo.decode(b'{"address": "x"}')


def test_a_reply_that_does_not_match_its_start_fails_the_channel(monkeypatch):
    link = Link(written_from=1024)
    real = wire.encode_reply
    monkeypatch.setattr(wire, "encode_reply",       # the peer answers with a target too many
                        lambda message_id, targets: real(message_id, targets + [(3, 4)]))
    link.ends[0][0].send(kv_message(1, 5000, 1))
    link.settle()
    assert "does not match" in str(link.ends[0][0].failure)


def test_too_many_frames_are_refused_before_anything_is_queued():
    link = Link()
    with pytest.raises(ProtocolError, match="at most 15"):
        link.ends[0][0].send([b"meta"] + [b"x"] * 16)
    assert not link.ends[0][0]._queue


def test_a_queue_pair_failing_between_two_posts_fails_the_channel_with_a_peer_error():
    """The peer is gone: the first SEND's answer moves this QP to ERROR at once (as the soft
    fabric does when the peer's socket is closed), before the next post. Sending then raises
    the channel's PeerError (which the KV layer parks for a restarted server), never the
    verbs layer's 'sends need RTS', and the failure stays the channel's from then on."""
    link = Link()
    a, b = link.ends[0][0], link.ends[1][0]
    b.qp.to_error()
    a.send(kv_message(1, 10, 1))               # its answer (RETRY_EXC_ERR) fails a's QP
    with pytest.raises(PeerError, match="sends need RTS"):
        a.send(kv_message(2, 10, 2))
    with pytest.raises(PeerError):
        a.send(kv_message(3, 10, 3))
    link.settle()                              # the flushed completions change nothing
    assert isinstance(a.failure, PeerError)
