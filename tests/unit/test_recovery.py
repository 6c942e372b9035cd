"""Recovering a restarted server, without sockets: the report's wire format, the rebuild of a
key's rounds from the workers' reports (checked against an uninterrupted run under random
schedules and crash points), and BytePSServer's gate that holds requests until all reports."""
import random

import numpy as np
import pytest

from kvstore_byteps.engine.recovery import KeptRounds
from kvstore_byteps.errors import ProtocolError
from kvstore_byteps.mxproto import RequestType
from kvstore_byteps.recovery_report import REPORT_CMD, KeyReport, decode_report, encode_report
from kvstore_byteps.serving.byteps import BytePSServer
from kvstore_byteps.serving.recovery import RecoveryGate
from kvstore_byteps.serving.rounds import KeyRounds
from tests.support.server_fakes import WORKER0, WORKER1, FakeServer, pull, push, request

F32 = np.dtype(np.float32)


# ------------------------------------------------------------------ the report
def test_a_report_round_trips_with_zero_one_and_two_segments():
    reports = [KeyReport(3, F32, 8, 0, 0),
               KeyReport(5, F32, 8, 1, 0, np.array([1, 2], F32)),
               KeyReport(7, np.dtype(np.float64), 16, 4, 3, np.array([3, 4.0]), np.array([5, 6.0]))]
    body, keys, vals, lens = encode_report(reports)
    assert list(keys) == [5, 7, 7] and list(lens) == [8, 16, 16]
    back = decode_report(body, keys, memoryview(vals), lens)
    assert [(r.ps_key, r.dtype, r.nbytes, r.pushed, r.answered) for r in back] == \
        [(r.ps_key, r.dtype, r.nbytes, r.pushed, r.answered) for r in reports]
    assert back[0].latest is None and back[0].previous is None
    assert list(back[1].latest) == [1, 2] and back[1].previous is None
    assert list(back[2].latest) == [3, 4] and list(back[2].previous) == [5, 6]


@pytest.mark.parametrize("body,segments,match", [
    (b"not json", [], "not the expected JSON"),
    (b'{"keys": [[5, 0, 8, 1]]}', [], "not the expected JSON"),
    (b'{"keys": [[5, 9, 8, 0, 0]]}', [], "dtype code 9"),
    (b'{"keys": [[5, 0, 8, 3, 1]]}', [], "3 pushes and 1 answered"),
    (b'{"keys": [[5, 0, 8, 1, 0]]}', [], "expected 1 segment"),
    (b'{"keys": [[5, 0, 8, 1, 0]]}', [(5, 4)], "expected 1 segment"),
    (b'{"keys": []}', [(5, 8)], "no entry claims"),
])
def test_malformed_reports_are_refused_with_the_reason(body, segments, match):
    keys = np.array([k for k, _ in segments], np.uint64)
    lens = np.array([n for _, n in segments], np.int32)
    vals = np.zeros(int(lens.sum()), np.uint8)
    with pytest.raises(ProtocolError, match=match):
        decode_report(body, keys, memoryview(vals), lens)


def test_kept_rounds_keep_the_last_two_pushes():
    kept = KeptRounds(5, F32, 8, server=0)
    assert kept.report().latest is None
    for r in range(3):
        kept.record_push(np.array([r, r], F32).view(np.uint8))
    kept.record_answer()
    kept.record_answer()
    report = kept.report()
    assert (report.pushed, report.answered) == (3, 2)
    assert list(report.latest.view(F32)) == [2, 2] and list(report.previous.view(F32)) == [1, 1]


# ------------------------------------------------------------------ rebuilding rounds
class _Sim:
    """W workers driving KeyRounds as the BytePS protocol does, messages queued per worker
    (push = begin_push + accumulate, pull = request_pull) and delivered one at a time, so a
    crash can fall between a worker sending and the server handling."""

    def __init__(self, workers, size, rounds, seed):
        self.rng = random.Random(seed)
        self.workers, self.size, self.rounds = workers, size, rounds
        self.server = KeyRounds(1, workers, size, F32)
        self.kept = {w: KeptRounds(1, F32, size * 4, 0) for w in range(workers)}
        self.queue = {w: [] for w in range(workers)}
        self.waiting = {w: False for w in range(workers)}   # a pull is outstanding
        self.answers = {w: [] for w in range(workers)}

    def data(self, w, r):
        return np.full(self.size, (w + 1) * 10 + r * 100, F32) + np.arange(self.size, dtype=F32)

    def expected(self, r):
        return sum(self.data(w, r) for w in range(self.workers))

    def answer(self, w, value):
        self.answers[w].append(np.array(value))
        self.kept[w].record_answer()
        self.waiting[w] = False

    def deliver(self, w):
        kind = self.queue[w].pop(0)
        if kind[0] == "push":
            r = self.server.begin_push(w)
            tokens, total = self.server.accumulate(r, kind[1])
            for token in tokens:
                self.answer(token, total)
        else:
            value = self.server.request_pull(w, w)
            if value is not None:
                self.answer(w, value)

    def step(self):
        """One random action; False when every worker is done."""
        choices = []
        for w in range(self.workers):
            kept = self.kept[w]
            if self.queue[w]:
                choices.append(("deliver", w))
            if not self.waiting[w] and kept.pushed == kept.answered and kept.pushed < self.rounds:
                choices.append(("push", w))
        if not choices:
            return False
        action, w = self.rng.choice(choices)
        if action == "deliver":
            self.deliver(w)
            return True
        data = self.data(w, self.kept[w].pushed)
        self.kept[w].record_push(data.view(np.uint8))
        self.queue[w] += [("push", data), ("pull",)]
        self.waiting[w] = True
        return True

    def crash_and_recover(self):
        """The server dies with its queues; it is rebuilt from the reports; pulls re-sent."""
        states = {}
        for w, kept in self.kept.items():
            report = kept.report()
            states[w] = (report.pushed, report.answered,
                         None if report.latest is None else report.latest.view(F32),
                         None if report.previous is None else report.previous.view(F32))
        self.server = KeyRounds.restored(1, self.workers, self.size, F32, states)
        for w in range(self.workers):
            self.queue[w] = [("pull",)] if self.waiting[w] else []


@pytest.mark.parametrize("seed", range(40))
def test_rounds_rebuilt_at_any_moment_give_every_worker_the_exact_sums(seed):
    sim = _Sim(workers=random.Random(seed).choice([2, 3, 4]), size=3, rounds=8, seed=seed)
    crash_at = sim.rng.randrange(5, 60)
    for step in range(10000):
        if step == crash_at:
            sim.crash_and_recover()
        if not sim.step():
            break
    for w in range(sim.workers):
        assert len(sim.answers[w]) == sim.rounds, (w, len(sim.answers[w]))
        for r, got in enumerate(sim.answers[w]):
            np.testing.assert_array_equal(got, sim.expected(r), err_msg="worker %d round %d"
                                          % (w, r))


def test_reports_that_cannot_come_from_one_cluster_are_refused():
    ok = (2, 2, np.ones(2, F32), np.ones(2, F32))
    with pytest.raises(ProtocolError, match="others 5 pushes"):
        KeyRounds.restored(1, 2, 2, F32, {0: ok, 1: (5, 5, np.ones(2, F32), np.ones(2, F32))})
    with pytest.raises(ProtocolError, match="reports of 1 workers"):
        KeyRounds.restored(1, 2, 2, F32, {0: ok})
    with pytest.raises(ProtocolError, match="not every worker pushed"):
        KeyRounds.restored(1, 2, 2, F32, {0: (3, 3, np.ones(2, F32), np.ones(2, F32)), 1: ok})


# ------------------------------------------------------------------ the gate
def test_the_gate_fills_in_keys_a_worker_never_pushed_and_names_the_missing():
    gate = RecoveryGate(2, deadline=100.0)
    assert not gate.add(WORKER0, [KeyReport(4, F32, 8, 1, 0, np.ones(2, F32))])
    assert gate.missing() == [WORKER1]
    with pytest.raises(ProtocolError, match="second recovery report"):
        gate.add(WORKER0, [])
    assert gate.add(WORKER1, [])
    assert gate.keys() == {4: (F32, 8, {WORKER0: (1, 0, gate.reports[WORKER0][0].latest, None),
                                        WORKER1: (0, 0, None, None)})}


def test_workers_disagreeing_on_a_keys_size_are_refused():
    gate = RecoveryGate(2, deadline=100.0)
    gate.add(WORKER0, [KeyReport(4, F32, 8, 0, 0)])
    gate.add(WORKER1, [KeyReport(4, F32, 12, 0, 0)])
    with pytest.raises(ProtocolError, match="ps key 4"):
        gate.keys()


def _report(sender, reports, epoch=1):
    body, keys, vals, lens = encode_report(reports)
    req = request(sender, keys, vals, lens, push=True, head=REPORT_CMD, extra={"epoch": epoch})
    req.meta.body = body
    return req


def _byteps(sender, key, values=None, epoch=1):
    if values is None:
        req = pull(sender, key, rtype=RequestType.BYTEPS)
    else:
        req = push(sender, key, np.asarray(values, F32), rtype=RequestType.BYTEPS)
    req.meta.extra = None if epoch is None else {"epoch": epoch}
    return req


def test_a_restarted_server_drops_stale_requests_holds_the_rest_then_serves_exact_sums():
    responder = FakeServer()
    with BytePSServer(2) as server:
        server.begin_recovery(1, deadline=float("inf"))
        # worker 0 pushed rounds 0 and 1 and waits for round 1; worker 1 pushed round 0 only
        # and waits for it: round 0 = 1 + 10, round 1 needs worker 1's push
        stale = _byteps(WORKER0, 6, [7.0, 7.0], epoch=None)
        server.handle_request(stale, responder)
        early_pull = _byteps(WORKER1, 6)
        server.handle_request(early_pull, responder)
        assert (not responder.answers and server.recovery.stale_requests == 1
                and server.recovery.recovering)
        server.handle_request(_report(WORKER0, [KeyReport(
            6, F32, 8, 2, 1, np.array([2, 2], F32), np.array([1, 1], F32))]), responder)
        server.handle_request(_report(WORKER1, [KeyReport(
            6, F32, 8, 1, 0, np.array([10, 10], F32))]), responder)
        assert not server.recovery.recovering
        assert list(responder.wait_for(early_pull).values()) == [11, 11]   # round 0
        pull0 = _byteps(WORKER0, 6)
        server.handle_request(pull0, responder)
        server.handle_request(_byteps(WORKER1, 6, [20, 20]), responder)     # round 1
        pull1 = _byteps(WORKER1, 6)
        server.handle_request(pull1, responder)
        assert list(responder.wait_for(pull0).values()) == [22, 22]
        assert list(responder.wait_for(pull1).values()) == [22, 22]
        unknown = _byteps(WORKER0, 12, [1.0])
        server.handle_request(unknown, responder)
        assert "no worker's recovery report named" in responder.wait_for(unknown).error
        init_pull = pull(WORKER0, 6)
        init_pull.meta.extra = {"epoch": 1}
        server.handle_request(init_pull, responder)
        assert "initial value was lost" in responder.wait_for(init_pull).error
        late = _report(WORKER0, [])
        server.handle_request(late, responder)
        assert "not waiting for one" in responder.wait_for(late).error


def test_a_bad_report_is_refused_and_the_deadline_names_who_did_not_report():
    responder = FakeServer()
    with BytePSServer(2) as server:
        server.begin_recovery(2, deadline=50.0)
        bad = _report(WORKER0, [], epoch=2)
        bad.meta.body = b"{"
        server.handle_request(bad, responder)
        assert "not the expected JSON" in responder.answer_to(bad).error
        assert not server.recovery.overdue(49.0) and server.recovery.overdue(51.0)
        assert "[9, 11]" in server.recovery.describe_wait()
