"""BytePSServer round semantics with a recording responder (no sockets)."""
import random
import threading
import time

import numpy as np
import pytest

from kvstore_byteps.errors import ProtocolError
from kvstore_byteps.serving.rounds import KeyRounds
from kvstore_byteps.serving.byteps import BytePSServer
from kvstore_byteps.serving.summing import SumThreads
from kvstore_byteps.mxproto import RequestType, ServerCommand
from tests.support.server_fakes import WORKER0, WORKER1, WORKER2, FakeServer, command, pull, push, \
    request, \
    vector_request

BP = RequestType.BYTEPS


def bpush(sender, key, value, size=4, pull_too=False, dtype=np.float32, extra=None):
    return push(sender, key, np.full(size, value, dtype), pull=pull_too, rtype=BP, extra=extra)


def bpull(sender, key, dtype=np.float32):
    return pull(sender, key, dtype, rtype=BP)


@pytest.fixture
def server():
    with BytePSServer(2, summing_threads=2) as srv:
        yield srv, FakeServer()


def _ok(fake, req):
    answer = fake.wait_for(req)
    assert answer.error is None, answer.error
    return answer


def test_fast_worker_round_k_plus_1_push_never_corrupts_slow_workers_round_k(server):
    srv, fake = server
    srv.handle_request(bpush(WORKER0, 1, 0.0), fake)            # init by rank 0
    a0, b0 = bpush(WORKER0, 1, 1.0), bpush(WORKER1, 1, 2.0)
    srv.handle_request(a0, fake)
    srv.handle_request(b0, fake)
    assert _ok(fake, a0).vals is None and _ok(fake, b0).vals is None   # acked at once
    pa0 = bpull(WORKER0, 1)
    srv.handle_request(pa0, fake)
    assert list(_ok(fake, pa0).values()) == [3.0] * 4
    a1 = bpush(WORKER0, 1, 10.0)                                 # fast worker, next round
    srv.handle_request(a1, fake)
    _ok(fake, a1)
    pa1 = bpull(WORKER0, 1)
    srv.handle_request(pa1, fake)                                # waits for the slow worker
    pb0 = bpull(WORKER1, 1)
    srv.handle_request(pb0, fake)
    assert list(_ok(fake, pb0).values()) == [3.0] * 4           # round 0, untouched
    assert not fake.answered(pa1)
    srv.handle_request(bpush(WORKER1, 1, 20.0), fake)
    assert list(_ok(fake, pa1).values()) == [30.0] * 4
    pb1 = bpull(WORKER1, 1)
    srv.handle_request(pb1, fake)
    assert list(_ok(fake, pb1).values()) == [30.0] * 4
    assert len([a for a in fake.answers if a.req in (pa0, pb0, pa1, pb1)]) == 4   # one each


def test_pushpull_is_a_push_then_a_pull_with_one_answer(server):
    srv, fake = server
    srv.handle_request(bpush(WORKER0, 2, 0.0, size=3), fake)
    for step in range(3):
        a = bpush(WORKER0, 2, step, size=3, pull_too=True)
        b = bpush(WORKER1, 2, 1.0, size=3, pull_too=True)
        srv.handle_request(a, fake)
        srv.handle_request(b, fake)
        for req in (a, b):
            answer = _ok(fake, req)
            assert list(answer.values()) == [step + 1.0] * 3 and list(answer.lens) == [12]
    assert len(fake.answers) == 1 + 6


def test_many_rounds_with_racing_workers_give_exact_sums():
    """Three workers race over 4 keys for 40 rounds; every pull equals that round's sum."""
    keys, rounds, workers = [10, 11, 12, 13], 40, [WORKER0, WORKER1, WORKER2]
    with BytePSServer(3, summing_threads=3) as srv:
        fake = FakeServer()
        for key in keys:
            srv.handle_request(bpush(WORKER0, key, 0.0, size=1000), fake)
        failures = []

        def worker(rank, sender):
            rng = random.Random(rank)
            for r in range(rounds):
                for key in keys:
                    srv.handle_request(bpush(sender, key, (rank + 1) * (r + 1) + key, 1000), fake)
                for key in rng.sample(keys, len(keys)):
                    req = bpull(sender, key)
                    srv.handle_request(req, fake)
                    got = fake.wait_for(req, timeout=10).values()
                    want = sum((i + 1) * (r + 1) + key for i in range(len(workers)))
                    if not (got == want).all():
                        failures.append((sender, key, r, got[0], want))
        threads = [threading.Thread(target=worker, args=(i, s)) for i, s in enumerate(workers)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert not any(t.is_alive() for t in threads)
    assert failures == [] and fake.errors() == []


def test_protocol_violations_are_refused_and_the_round_still_completes(server):
    srv, fake = server
    srv.handle_request(bpush(WORKER0, 3, 0.0), fake)
    early_pull = bpull(WORKER1, 3)
    srv.handle_request(early_pull, fake)
    assert "before pushing it" in fake.wait_for(early_pull).error
    srv.handle_request(bpush(WORKER0, 3, 1.0), fake)
    twice = bpush(WORKER0, 3, 1.0)
    srv.handle_request(twice, fake)
    assert "before its round 0 pull was answered" in fake.wait_for(twice).error
    claimed = bpush(WORKER1, 3, 2.0, extra={"round": 5})
    srv.handle_request(claimed, fake)
    assert "says its push of key 3 is round 5" in fake.wait_for(claimed).error
    wrong_size = bpush(WORKER1, 3, 2.0, size=5)
    srv.handle_request(wrong_size, fake)
    assert "holds 4 x float32, push has 5 x float32" in fake.wait_for(wrong_size).error
    unknown = bpull(WORKER1, 99)
    srv.handle_request(unknown, fake)
    assert "never initialised" in fake.wait_for(unknown).error
    srv.handle_request(bpush(WORKER1, 3, 2.0, extra={"round": 0}), fake)
    for sender in (WORKER0, WORKER1):
        p = bpull(sender, 3)
        srv.handle_request(p, fake)
        assert list(_ok(fake, p).values()) == [3.0] * 4


def test_async_mode_sums_into_the_weights_and_answers_pulls_at_once():
    with BytePSServer(2, summing_threads=2, enable_async=True) as srv:
        fake = FakeServer()
        srv.handle_request(bpush(WORKER0, 4, 1.0), fake)
        pushes = [bpush(s, 4, 0.5) for s in (WORKER0, WORKER1, WORKER0, WORKER1)]
        for req in pushes:
            srv.handle_request(req, fake)
            fake.wait_for(req)                                 # acked once added
        early = bpull(WORKER1, 4)
        srv.handle_request(early, fake)
        assert fake.answered(early)                            # no round to wait for
        assert list(_ok(fake, early).values()) == [3.0] * 4    # every acked push is in
        last = bpush(WORKER0, 4, 0.5, pull_too=True)
        srv.handle_request(last, fake)
        assert list(_ok(fake, last).values()) == [3.5] * 4     # after this push was added
        late = pull(WORKER1, 4)                                # a default pull: the weights
        srv.handle_request(late, fake)
        assert list(_ok(fake, late).values()) == [3.5] * 4


def test_default_pull_of_a_byteps_key_returns_its_initial_value(server):
    srv, fake = server
    srv.handle_request(bpush(WORKER0, 5, 7.0, dtype=np.float16), fake)
    for s, v in ((WORKER0, 1.0), (WORKER1, 2.0)):
        srv.handle_request(bpush(s, 5, v, dtype=np.float16), fake)
    p = pull(WORKER1, 5, np.float16)
    srv.handle_request(p, fake)
    assert list(_ok(fake, p).values(np.float16)) == [7.0] * 4


def test_upstream_requests_through_byteps_server_keep_mxnet_semantics(server):
    srv, fake = server
    srv.handle_command(command(WORKER0, ServerCommand.SYNC_MODE), fake)
    srv.handle_request(vector_request("11_push_init_request", WORKER0), fake)
    srv.handle_request(push(WORKER0, 5, np.ones(100, np.float32)), fake)
    r1 = vector_request("13_push_request_r1", WORKER1)
    srv.handle_request(r1, fake)
    p = vector_request("14_pull_request", WORKER0)
    srv.handle_request(p, fake)
    assert (_ok(fake, p).values() == 3.0).all() and fake.answer_to(r1).error is None
    stop = vector_request("16_cmd_stopserver_request", WORKER0)
    srv.handle_command(stop, fake)
    assert srv.wait_stopped(0)


def test_key_rounds_reuse_a_slot_only_after_every_answer():
    rounds = KeyRounds(7, 2, 2, np.float32)
    for sender in (1, 2):
        assert rounds.begin_push(sender) == 0
    rounds.accumulate(0, np.ones(2, np.float32))
    tokens, total = rounds.accumulate(0, np.ones(2, np.float32))
    assert tokens == [] and list(total) == [2.0, 2.0]
    assert list(rounds.request_pull(1, "a")) == [2.0, 2.0]
    assert rounds.begin_push(1) == 1                    # its pull was answered
    assert rounds.request_pull(1, "b") is None          # round 1 is not complete
    with pytest.raises(ProtocolError, match="round 1 of key 7 before its round 0 pull"):
        rounds.begin_push(2)
    assert rounds.rounds_pushed(2) == 1


def _exactly_rounded_sum(pushes):
    return np.sum([p.astype(np.float64) for p in pushes], axis=0).astype(np.float16)


def test_float16_rounds_are_summed_wide_and_rounded_once():
    rng = np.random.default_rng(3)
    pushes = [rng.standard_normal(1000).astype(np.float16) for _ in range(4)]
    rounds = KeyRounds(7, 4, 1000, np.float16)
    for sender in range(4):
        assert rounds.begin_push(sender) == 0
    for data in pushes[:3]:
        assert rounds.accumulate(0, data) == ([], None)
    tokens, total = rounds.accumulate(0, pushes[3])
    assert total.dtype == np.float16
    assert np.array_equal(total, _exactly_rounded_sum(pushes))   # not float16's running sum


def test_a_single_workers_float16_round_is_its_push():
    rounds = KeyRounds(7, 1, 3, np.float16)
    rounds.begin_push(0)
    data = np.array([1.5, -2.25, 65504], np.float16)
    assert np.array_equal(rounds.accumulate(0, data)[1], data)


def test_a_restored_float16_round_goes_on_summing_wide():
    rng = np.random.default_rng(4)
    pushes = [rng.standard_normal(64).astype(np.float16) for _ in range(3)]
    # workers 0 and 1 pushed round 0 before the crash, worker 2 had not
    states = {0: (1, 0, pushes[0], None), 1: (1, 0, pushes[1], None), 2: (0, 0, None, None)}
    rounds = KeyRounds.restored(7, 3, 64, np.float16, states)
    assert rounds.begin_push(2) == 0
    tokens, total = rounds.accumulate(0, pushes[2])
    assert np.array_equal(total, _exactly_rounded_sum(pushes))


def test_engine_binds_equal_keys_evenly_and_runs_tasks_in_order():
    engine = SumThreads(4)
    try:
        bound = [engine.bind(4096000) for _ in range(8)]
        assert sorted(bound.count(i) for i in range(4)) == [2, 2, 2, 2]
        seen, done = [], threading.Event()
        for i in range(50):
            engine.submit(1, lambda i=i: seen.append(i))
        engine.submit(1, done.set)
        assert done.wait(5) and seen == list(range(50))
    finally:
        engine.close()


def test_a_timed_task_runs_after_its_delay_without_holding_up_the_queue():
    engine = SumThreads(1)
    try:
        seen, done = [], threading.Event()
        started = time.monotonic()
        engine.submit(0, lambda: seen.append(("timed", time.monotonic() - started)), 0.2)
        engine.submit(0, lambda: seen.append(("now", time.monotonic() - started)))
        for i in range(20):      # a busy queue does not keep the timed task waiting
            engine.submit(0, lambda: time.sleep(0.02))
        engine.submit(0, done.set, 0.3)
        assert done.wait(5)
        assert [what for what, _ in seen] == ["now", "timed"]
        assert seen[0][1] < 0.1 and 0.2 <= seen[1][1] < 0.3
    finally:
        engine.close()


def test_probe_tells_byteps_server_from_mxnet_semantics():
    from kvstore_byteps.serving.dist import KVStoreDistServer
    from kvstore_byteps.mxproto import PROBE_ANSWER
    with BytePSServer(1, summing_threads=1) as srv:
        fake = FakeServer()
        probe = command(WORKER0, ServerCommand.BYTEPS_PROBE)
        srv.handle_command(probe, fake)
        assert fake.answer_to(probe).body == PROBE_ANSWER and not fake.answer_to(probe).error
    plain, fake = KVStoreDistServer(1), FakeServer()
    probe = command(WORKER0, ServerCommand.BYTEPS_PROBE)
    plain.handle_command(probe, fake)
    assert fake.answer_to(probe).body == b"" and not fake.answer_to(probe).error


def test_rank_0s_partition_layout_is_kept_for_the_other_workers(server):
    srv, fake = server
    early = command(WORKER1, ServerCommand.BYTEPS_LAYOUT)
    srv.handle_command(early, fake)
    assert "no partition layout" in fake.answer_to(early).error
    from kvstore_byteps.mxproto import encode_cmd
    data = np.zeros(65536, np.uint8)
    test = request(WORKER0, [0], data, [data.size], push=True,
                   head=encode_cmd(RequestType.BYTEPS_LINK_TEST, np.float32))
    srv.handle_request(test, fake)                      # acknowledged, nothing stored
    assert _ok(fake, test).vals is None and 0 not in srv._keys
    left = command(WORKER0, ServerCommand.BYTEPS_LAYOUT, b'{"partition_bytes": 765952}')
    srv.handle_command(left, fake)
    assert not fake.answer_to(left).error
    read = command(WORKER1, ServerCommand.BYTEPS_LAYOUT)
    srv.handle_command(read, fake)
    assert fake.answer_to(read).body == b'{"partition_bytes": 765952}'


def test_our_workers_protocol_default_init_then_byteps_pushpull_rounds(server):
    """Rank 0 initialises with a default push; everyone reads it back with a default pull;
    rounds are BytePS pushpulls; the init value is not taken for a round's push."""
    srv, fake = server
    init = push(WORKER0, 6, np.full(4, 5.0, np.float32))           # cmd 0: the init
    srv.handle_request(init, fake)
    for sender in (WORKER0, WORKER1):
        back = pull(sender, 6)
        srv.handle_request(back, fake)
        assert list(_ok(fake, back).values()) == [5.0] * 4
    for step in range(3):
        a = bpush(WORKER0, 6, 1.0, pull_too=True)
        srv.handle_request(a, fake)
        assert not fake.answered(a)                                 # a round push, not an init
        b = bpush(WORKER1, 6, step, pull_too=True)
        srv.handle_request(b, fake)
        for req in (a, b):
            assert list(_ok(fake, req).values()) == [1.0 + step] * 4
    late = pull(WORKER1, 6)
    srv.handle_request(late, fake)
    assert list(_ok(fake, late).values()) == [5.0] * 4


def test_compressed_requests_are_refused_cleanly_until_the_workers_set_compression(server):
    import json
    from kvstore_byteps.compress.codecs import OneBit
    from kvstore_byteps.mxproto import encode_cmd
    srv, fake = server
    srv.handle_request(push(WORKER0, 7, np.zeros(64, np.float32)), fake)        # the init
    cmd = encode_cmd(RequestType.BYTEPS_COMPRESSED, np.float32)
    code = OneBit(scaling=True)

    def cpush(sender, values, r, data=None):
        data = code.encode(np.asarray(values, np.float32), r) if data is None else data
        return request(sender, [7], data, [data.size], push=True, head=cmd, extra={"round": r})
    early = cpush(WORKER0, np.ones(64), 0)
    srv.handle_request(early, fake)
    assert "no worker set gradient compression" in fake.wait_for(early).error
    for body, error in ((b"{not json", "not JSON"), (b'{"compressor": "twobits"}', "twobits"),
                        (json.dumps({"compressor": "onebit", "scaling": True}).encode(), None)):
        answer = fake.wait_for(srv_command(srv, fake, body))
        assert (answer.error is None) if error is None else (error in answer.error), answer.error
    short = cpush(WORKER0, None, 0, data=np.zeros(3, np.uint8))
    srv.handle_request(short, fake)
    assert "has 3 bytes, expected 12" in fake.wait_for(short).error
    x0, x1 = np.linspace(-1, 1, 64), np.linspace(2, -2, 64)
    for sender, x in ((WORKER0, x0), (WORKER1, x1)):
        srv.handle_request(cpush(sender, x, 0), fake)
    back = request(WORKER1, [7], pull=True, head=cmd, extra={"round": 0})
    srv.handle_request(back, fake)
    got = code.decode(np.frombuffer(_ok(fake, back).vals, np.uint8), 64, 0)
    total = code.decode(code.encode(x0, 0), 64, 0) + code.decode(code.encode(x1, 0), 64, 0)
    np.testing.assert_allclose(got, code.decode(code.encode(total, 0), 64, 0))
    again = request(WORKER0, [7], pull=True, head=cmd, extra={"round": 0})
    srv.handle_request(again, fake)
    assert _ok(fake, again).vals == _ok(fake, back).vals     # one compression per round


def srv_command(srv, fake, body):
    req = command(WORKER0, ServerCommand.BYTEPS_COMPRESSION, body)
    srv.handle_command(req, fake)
    return req


def test_a_pull_riding_on_a_push_is_answered_with_the_rounds_sum_after_the_ack(server):
    srv, fake = server
    srv.handle_request(bpush(WORKER0, 4, 0.0), fake)
    for step in range(3):
        a = bpush(WORKER0, 4, step, extra={"pull_timestamp": 1000 + step})
        srv.handle_request(a, fake)
        assert _ok(fake, a).vals is None                 # the push is acked at once
        assert not any(x.req.meta.timestamp == 1000 + step for x in fake.answers)
        srv.handle_request(bpush(WORKER1, 4, 1.0, extra={"pull_timestamp": 2000 + step}), fake)
        for timestamp in (1000 + step, 2000 + step):
            answer = fake.wait_for_timestamp(timestamp)
            assert answer.error is None
            assert answer.req.meta.pull and not answer.req.meta.push
            assert list(answer.values()) == [step + 1.0] * 4 and list(answer.lens) == [16]
    assert fake.errors() == []


def test_a_pull_riding_on_a_batch_push_gets_every_keys_sum(server):
    srv, fake = server
    for key in (20, 21):
        srv.handle_request(bpush(WORKER0, key, 0.0, size=2), fake)

    def batch(sender, first, timestamp):
        vals = np.array([first, first, first + 1, first + 1], np.float32)
        return request(sender, [20, 21], vals, [8, 8], push=True, head=bpush(0, 0, 0).meta.head,
                       extra={"pull_timestamp": timestamp})
    srv.handle_request(batch(WORKER0, 1.0, 500), fake)
    srv.handle_request(batch(WORKER1, 10.0, 600), fake)
    for timestamp in (500, 600):
        answer = fake.wait_for_timestamp(timestamp)
        assert list(answer.keys) == [20, 21] and list(answer.lens) == [8, 8]
        assert list(answer.values()) == [11.0, 11.0, 13.0, 13.0]
    assert fake.errors() == []


def test_the_initialising_push_answers_its_riding_pull_with_the_initial_value(server):
    srv, fake = server
    first = bpush(WORKER0, 6, 7.0, extra={"pull_timestamp": 42})
    srv.handle_request(first, fake)
    assert _ok(fake, first).vals is None
    assert list(fake.wait_for_timestamp(42).values()) == [7.0] * 4


def test_a_riding_pull_where_none_can_be_answered_is_refused_not_left_waiting():
    with BytePSServer(2, summing_threads=1) as srv, BytePSServer(2, summing_threads=1,
                                                                 enable_async=True) as asrv:
        fake = FakeServer()
        srv.handle_request(bpush(WORKER0, 8, 0.0), fake)
        on_a_pull = request(WORKER0, [8], pull=True, head=bpull(0, 8).meta.head,
                            extra={"pull_timestamp": 3})
        on_default = push(WORKER0, 9, np.ones(2, np.float32), extra={"pull_timestamp": 4})
        srv.handle_request(on_a_pull, fake)
        srv.handle_request(on_default, fake)
        assert "only a push can carry a pull" in fake.wait_for(on_a_pull).error
        assert "only a plain BytePS push" in fake.wait_for(on_default).error
        asrv.handle_request(bpush(WORKER0, 8, 0.0), fake)
        on_async = bpush(WORKER0, 8, 1.0, extra={"pull_timestamp": 5})
        asrv.handle_request(on_async, fake)
        assert "needs synchronous rounds" in fake.wait_for(on_async).error


def test_a_pull_awaiting_init_is_answered_by_the_initialising_push(server):
    """Workers declaring tensors in any order (the BytePS/Horovod APIs) read a key back before
    rank 0's initialising push may have arrived: with ``await_init`` the read waits for it;
    without, it is refused as before."""
    server, fake = server
    early = pull(WORKER1, 7)
    early.meta.extra = {"await_init": True}
    server.handle_request(early, fake)
    plain = pull(WORKER1, 7)
    server.handle_request(plain, fake)
    assert "never initialised" in fake.answer_to(plain).error
    assert early not in [a.req for a in fake.answers]           # held
    server.handle_request(push(WORKER0, 7, np.arange(4, dtype=np.float32)), fake)
    assert list(fake.wait_for(early).values()) == [0, 1, 2, 3]
    late = pull(WORKER0, 7)
    late.meta.extra = {"await_init": True}
    server.handle_request(late, fake)
    assert list(fake.wait_for(late).values()) == [0, 1, 2, 3]   # initialised: answered at once


def test_only_plain_byteps_requests_of_a_path_that_never_waits_are_quick():
    # quick requests may run on the van's receive loop (customer.MixedHandler): never an
    # optimizer, a command or a default-type request, nor while a restarted server holds them
    with BytePSServer(2, summing_threads=1) as sync, \
            BytePSServer(2, summing_threads=1, enable_async=True) as adds, \
            BytePSServer(2, summing_threads=1, backup_workers=1) as backup:
        quick = bpush(WORKER0, 1, 1.0).meta
        for srv in (sync, adds):
            assert srv.handles_quickly(quick) and srv.handles_quickly(bpull(WORKER0, 1).meta)
            assert not srv.handles_quickly(push(WORKER0, 1, np.ones(4, np.float32)).meta)
            assert not srv.handles_quickly(command(WORKER0, ServerCommand.BYTEPS_PROBE).meta)
        assert not backup.handles_quickly(quick)
        sync.begin_recovery(1, deadline=float("inf"))
        assert not sync.handles_quickly(quick)
