"""Push pacing (serving/pacing.py): the pure pacer, and BytePSServer holding a leader's acks."""
import time

import numpy as np
import pytest

from kvstore_byteps.config import Config
from kvstore_byteps.mxproto import RequestType
from kvstore_byteps.serving.byteps import BytePSServer
from kvstore_byteps.serving.pacing import HoldExpiry, PushPacer
from tests.support.server_fakes import WORKER0, WORKER1, FakeServer, pull, push

MB = 1 << 20


class Acks:
    """Named acknowledgements that record the order they are sent in."""

    def __init__(self):
        self.sent, self.created = [], []

    def __call__(self, name):
        self.created.append(name)
        return lambda: self.sent.append(name)

    def run(self, acks):
        for ack in acks:
            ack()


def test_a_worker_within_the_lead_is_acked_at_once():
    pacer, acks = PushPacer(2, lead_bytes=2 * MB, hold_s=1.0), Acks()
    acks.run(pacer.arrived(WORKER0, MB, acks("a1"), now=0.0))
    acks.run(pacer.arrived(WORKER0, MB, acks("a2"), now=0.0))   # 2 MB ahead: still allowed
    assert acks.sent == ["a1", "a2"] and pacer.held() == 0


def test_a_leader_is_held_until_the_slowest_worker_catches_up_in_order():
    pacer, acks = PushPacer(2, lead_bytes=MB, hold_s=1.0), Acks()
    for name in ("a1", "a2", "a3", "a4"):
        acks.run(pacer.arrived(WORKER0, MB, acks(name), now=0.0))
    assert acks.sent == ["a1"] and pacer.held() == 3            # a2..a4 lead by 2-4 MB
    acks.run(pacer.arrived(WORKER1, MB, acks("b1"), now=0.0))   # floor 1 MB: a2 within 1 MB
    assert acks.sent == ["a1", "a2", "b1"]
    acks.run(pacer.arrived(WORKER1, 2 * MB, acks("b2"), now=0.0))   # floor 3 MB
    assert acks.sent == ["a1", "a2", "b1", "a3", "a4", "b2"]
    assert pacer.held() == 0 and pacer.held_total == 3 and pacer.expired_total == 0


def test_the_worker_furthest_behind_is_never_held_and_level_workers_hold_nothing():
    workers = (WORKER0, WORKER1, 13)
    pacer, acks = PushPacer(3, lead_bytes=1000, hold_s=1.0), Acks()
    delivered = dict.fromkeys(workers, 0)
    rng = np.random.default_rng(5)
    slowest_pushes = 0
    for step in range(300):          # three workers pushing 1000-byte partitions, random order
        sender = workers[int(rng.integers(3))]
        slowest = delivered[sender] == min(delivered.values())
        nothing_held = not any(name[0] == sender for name in pending(acks))
        delivered[sender] += 1000
        acks.run(pacer.arrived(sender, 1000, acks((sender, step)), now=0.0))
        if slowest and nothing_held:
            slowest_pushes += 1
            assert (sender, step) in acks.sent, "the slowest worker's push was held"
        assert pacer.held() == len(pending(acks))
    assert slowest_pushes > 50 and pacer.held_total > 0
    top = max(delivered.values())
    for worker in workers:           # the others catch up: everything is acknowledged
        while delivered[worker] < top:
            delivered[worker] += 1000
            acks.run(pacer.arrived(worker, 1000, acks((worker, delivered[worker])), now=0.0))
    assert pacer.held() == 0
    assert len(acks.sent) == len(set(acks.sent)) and set(acks.sent) == set(acks.created)


def pending(acks):
    """Names created so far but not sent (the test's own bookkeeping)."""
    return [name for name in acks.created if name not in acks.sent]


def test_nothing_is_held_before_every_worker_pushed_only_past_the_lead():
    pacer, acks = PushPacer(2, lead_bytes=MB, hold_s=1.0), Acks()
    acks.run(pacer.arrived(WORKER0, MB, acks("a1"), now=0.0))
    acks.run(pacer.arrived(WORKER0, MB, acks("a2"), now=0.0))    # worker 1 counts as 0 bytes
    assert acks.sent == ["a1"] and pacer.floor == 0


def test_the_hold_limit_releases_an_ack_in_order():
    pacer, acks = PushPacer(2, lead_bytes=0, hold_s=0.5), Acks()
    acks.run(pacer.arrived(WORKER1, 10, acks("b1"), now=0.0))
    acks.run(pacer.arrived(WORKER0, 100, acks("a1"), now=1.0))
    acks.run(pacer.arrived(WORKER0, 100, acks("a2"), now=1.2))
    assert acks.sent == ["b1"]
    acks.run(pacer.expired(now=1.4))
    assert acks.sent == ["b1"]
    acks.run(pacer.expired(now=1.5))
    assert acks.sent == ["b1", "a1"] and pacer.expired_total == 1
    acks.run(pacer.expired(now=2.0))
    assert acks.sent == ["b1", "a1", "a2"] and pacer.held() == 0


def test_hold_expiry_thread_sends_what_waited_too_long():
    pacer, acks = PushPacer(2, lead_bytes=0, hold_s=0.05), Acks()
    expiry = HoldExpiry(pacer, acks.run)
    try:
        acks.run(pacer.arrived(WORKER0, 100, acks("a1"), now=time.monotonic()))
        assert acks.sent == []
        deadline = time.monotonic() + 5.0
        while not acks.sent and time.monotonic() < deadline:
            time.sleep(0.01)
        assert acks.sent == ["a1"] and pacer.expired_total == 1
    finally:
        expiry.close()


def test_bad_settings_are_refused():
    with pytest.raises(ValueError):
        PushPacer(0, 1, 1.0)
    with pytest.raises(ValueError):
        PushPacer(2, -1, 1.0)
    with pytest.raises(ValueError):
        PushPacer(2, 1, 0.0)


# --------------------------------------------------------------------------- in the server
def bpush(sender, key, nbytes):
    return push(sender, key, np.ones(nbytes // 4, np.float32), rtype=RequestType.BYTEPS)


def bpull(sender, key):
    return pull(sender, key, np.float32, rtype=RequestType.BYTEPS)


def test_server_holds_a_leading_workers_ack_but_sums_its_push_at_once():
    with BytePSServer(2, summing_threads=1, pacing_lead_bytes=4096,
                      pacing_hold_s=30.0) as srv:
        fake = FakeServer()
        for key in (1, 2, 3):
            srv.handle_request(bpush(WORKER0, key, 4096), fake)           # initialisation
        a = [bpush(WORKER0, key, 4096) for key in (1, 2, 3)]
        for req in a:
            srv.handle_request(req, fake)
        fake.wait_for(a[0])
        assert not fake.answered(a[1]) and not fake.answered(a[2])     # 8 and 12 KB ahead
        b1 = bpush(WORKER1, 1, 4096)
        srv.handle_request(b1, fake)
        fake.wait_for(b1)
        fake.wait_for(a[1])                                             # now 4 KB ahead
        assert not fake.answered(a[2])
        p = bpull(WORKER1, 1)                       # key 1's sum is there: pacing held no data
        srv.handle_request(p, fake)
        assert list(np.unique(fake.wait_for(p).values())) == [2.0]
        srv.handle_request(bpush(WORKER1, 2, 4096), fake)
        fake.wait_for(a[2])
        assert srv.acks.pacer.held() == 0


def test_pacing_is_opt_in_and_never_in_async_mode():
    with BytePSServer.from_config(Config.from_env({}), 2) as srv:
        assert srv.acks.pacer is None
    on = {"BYTEPS_SERVER_PACING_BYTES": "1024000", "BYTEPS_SERVER_PACING_HOLD_MS": "50"}
    with BytePSServer.from_config(Config.from_env(on), 2) as srv:
        assert srv.acks.pacer.lead_bytes == 1024000 and srv.acks.pacer.hold_s == 0.05
    with BytePSServer.from_config(Config.from_env(dict(on, BYTEPS_ENABLE_ASYNC="1")), 2) as srv:
        assert srv.acks.pacer is None
