"""Gradient buckets' plan and rounds (kvstore_byteps/engine/buckets.py): pure, no sockets."""
import numpy as np
import pytest

from kvstore_byteps.engine.buckets import BucketPlan

pytestmark = pytest.mark.unit

F32, F16 = np.dtype("float32"), np.dtype("float16")


def declare_all(plan, keys):
    """Declare ``(key, nbytes, dtype)`` in order; the buckets sealed meanwhile."""
    return [b for b in (plan.declare(*k) for k in keys) if b is not None]


def members(bucket):
    return [m.key for m in bucket.members]


def learn(bucket, keys=None):
    """The first round of calls: ``keys`` (default: every member), then the first again."""
    keys = [m.key for m in bucket.members] if keys is None else keys
    assert not any(bucket.learn(k) for k in keys)
    assert bucket.learn(keys[0])
    bucket.form()
    return bucket


def test_consecutive_small_keys_of_one_dtype_share_a_bucket_up_to_the_capacity():
    plan = BucketPlan(1000)
    sealed = declare_all(plan, [(0, 400, F32), (1, 400, F32), (2, 400, F32), (3, 100, F32)])
    assert [members(b) for b in sealed] == [[0, 1]]        # key 2 did not fit: sealed
    assert [(m.offset, m.nbytes) for m in sealed[0].members] == [(0, 400), (400, 400)]
    assert plan.bucket_of(0) is None and sealed[0].learning     # sealed, then a round learnt
    learn(sealed[0])
    assert plan.bucket_of(0) is sealed[0] and plan.bucket_of(1) is sealed[0]
    assert plan.bucket_of(2) is None          # still open: not usable yet
    assert members(plan.use(3)) == [2, 3]     # first use seals it
    assert learn(plan.sealed_of(3)).nbytes == 500 and plan.bucket_of(3).nbytes == 500


def test_a_dtype_change_a_big_key_or_a_zero_byte_key_ends_the_bucket_and_goes_alone():
    plan = BucketPlan(1000)
    sealed = declare_all(plan, [(0, 8, F32), (1, 8, F32), (2, 8, F16), (3, 8, F16),
                                (4, 1000, F32), (5, 8, F32), (6, 0, F32), (7, 8, F32)])
    assert [members(b) for b in sealed] == [[0, 1], [2, 3], [5]]
    for bucket in sealed[:2]:
        learn(bucket)
    assert plan.bucket_of(4) is None and plan.bucket_of(6) is None
    assert plan.bucket_of(5) is None           # a bucket of one is that key alone
    assert [members(b) for b in plan.fused()] == [[0, 1], [2, 3]]


def test_declaring_using_then_declaring_the_next_fuses_nothing():
    plan = BucketPlan(1 << 20)
    for key in range(5):                  # BytePS's and Horovod's per-tensor pattern
        assert plan.declare(key, 64, F32) is None
        sealed = plan.use(key)
        assert members(sealed) == [key] and not sealed.fused and not sealed.learning
    assert plan.fused() == []
    assert plan.use(3) is None                 # using a key of a sealed bucket seals nothing


def test_a_key_declared_again_keeps_its_place_and_no_capacity_means_no_buckets():
    plan = BucketPlan(100)
    declare_all(plan, [(0, 8, F32), (1, 8, F32)])
    assert plan.declare(0, 8, F32) is None
    assert members(plan.use(0)) == [0, 1]
    off = BucketPlan(0)
    assert declare_all(off, [(0, 8, F32), (1, 8, F32)]) == [] and off.use(0) is None


def test_the_digest_tells_different_layouts_apart():
    def digest(keys):
        plan = BucketPlan(1000)
        declare_all(plan, keys)
        return learn(plan.use(keys[0][0])).digest()
    same = digest([(0, 8, F32), (1, 16, F32)])
    assert same == digest([(0, 8, F32), (1, 16, F32)])
    for other in ([(1, 16, F32), (0, 8, F32)], [(0, 16, F32), (1, 8, F32)],
                  [(0, 8, F16), (1, 16, F16)], [(0, 8, F32), (1, 16, F32), (2, 4, F32)]):
        assert digest(other) != same, other


def sealed_bucket(sizes, capacity=1 << 20):
    plan = BucketPlan(capacity)
    declare_all(plan, [(k, n, F32) for k, n in enumerate(sizes)])
    return learn(plan.use(0))


def test_a_round_completes_when_its_last_member_arrives_with_the_highest_priority():
    bucket = sealed_bucket([4, 8, 4])
    sent = []
    for key, priority in ((2, -2), (0, 0), (1, -1)):
        bucket_round, ready = bucket.arrive(key, 0, ("out%d" % key, None), priority, now=0.0)
        sent.append(ready)
    assert sent == [[], [], [bucket_round]]
    assert bucket_round.priority == 0
    assert bucket_round.arrivals == [("out0", None), ("out1", None), ("out2", None)]
    assert not bucket.has_open_rounds()


def test_a_member_that_comes_back_before_the_others_joins_its_own_round_and_rounds_leave_in_order():
    bucket = sealed_bucket([4, 4])
    first, _ = bucket.arrive(0, 0, ("a0", None), 0, now=0.0)
    second, ready = bucket.arrive(0, 1, ("b0", None), 0, now=0.0)   # round 2 of key 0
    assert second is not first and ready == []
    # round 1 complete before round 0 (a member's operations ran out of order): held back,
    # the servers pair a key's pushes by their order
    done, ready = bucket.arrive(1, 1, ("b1", None), 0, now=0.0)
    assert done is second and ready == []
    done, ready = bucket.arrive(1, 0, ("a1", None), 0, now=0.0)
    assert done is first and ready == [first, second]
    assert [a[0] for a in second.arrivals] == ["b0", "b1"]


def test_buffers_are_reused_across_rounds():
    bucket = sealed_bucket([4, 4])
    slots = set()
    for index in range(5):
        bucket.arrive(0, index, ("x", None), 0, now=0.0)
        bucket_round, _ = bucket.arrive(1, index, ("y", None), 0, now=0.0)
        slots.add(id(bucket_round.slot))
        assert bucket_round.slot.send.nbytes == bucket_round.slot.answer.nbytes == 8
        bucket.give_back(bucket_round.slot)
    assert len(slots) == 1


def test_a_round_missing_a_member_past_the_deadline_leaves_naming_the_missing_keys():
    bucket = sealed_bucket([4, 4, 4])
    assert bucket.called(1) == 0
    bucket.arrive(1, 0, ("x", None), 0, now=10.0)
    assert bucket.overdue(now=14.0, timeout=5.0) == []
    [late] = bucket.overdue(now=15.5, timeout=5.0)
    assert bucket.missing_keys(late) == [0, 2]
    assert bucket.uncalled_keys(late) == [0, 2]     # their pushpull was never called
    assert not bucket.has_open_rounds()
    for key in (0, 2):
        bucket.called(key)           # the round of calls is complete: its members were called
    assert bucket.uncalled_keys(late) == []


def test_rounds_of_calls_are_counted_in_the_programs_order_and_a_member_called_again_dissolves():
    bucket = sealed_bucket([4, 4, 4])
    assert [bucket.called(k) for k in (0, 1, 2, 2, 0, 1)] == [0, 0, 0, 1, 1, 1]  # any order
    assert bucket.called(1) == 2
    assert bucket.called(1) is None     # key 1 again before keys 0 and 2: a test of sums
    assert bucket.calls_round == 2      # the round of calls it happened in


def test_dissolving_from_a_round_of_calls_keeps_the_earlier_rounds_in_the_bucket():
    plan = BucketPlan(1 << 20)
    declare_all(plan, [(0, 4, F32), (1, 4, F32)])
    bucket = learn(plan.use(0))
    bucket.arrive(0, 0, ("r0", None, 0), 0, now=0.0)       # round 0: key 1's gradient is late
    bucket.arrive(0, 1, ("r1", None, 0), 0, now=0.0)
    [leaving] = bucket.dissolve(from_round=1)
    assert leaving.index == 1 and leaving.arrivals[0] == ("r1", None, 0)
    assert not bucket.goes_alone(0) and bucket.goes_alone(1) and bucket.goes_alone(2)
    earlier, ready = bucket.arrive(1, 0, ("late", None, 0), 0, now=0.0)
    assert ready == [earlier]            # round 0 still travels in the bucket, as elsewhere
    assert plan.bucket_of(0) is None and plan.fused_into(0) is bucket
    assert not bucket.has_open_rounds()


def test_a_program_that_reads_a_member_before_calling_the_next_is_told_apart_while_learning():
    def formed(events):
        plan = BucketPlan(1 << 20)
        declare_all(plan, [(k, 4, F32) for k in range(3)])
        bucket = plan.use(0)
        for kind, key in events:
            if kind == "call":
                assert not bucket.learn(key)
            else:
                bucket.read(key)
        assert bucket.learn(0)
        bucket.form()
        return bucket.reads_between
    # a test of sums: each key's result read before the next key is pushed
    assert formed([("call", 0), ("read", 0), ("call", 1), ("read", 1), ("call", 2)])
    # gluon: every key called in one loop, then the step's results read (loss.asnumpy())
    assert not formed([("call", 0), ("call", 1), ("call", 2), ("read", 2)])
    # a result that came while the program waited for another array, after the next call
    assert not formed([("call", 0), ("call", 1), ("read", 0), ("call", 2)])


def test_the_digest_carries_rank_0s_decision():
    bucket = sealed_bucket([4, 4])
    assert bucket.digest(True) != bucket.digest(False)
    assert bucket.digest() == bucket.digest(True)


def test_keys_declared_but_never_pushed_are_left_out_when_the_bucket_is_formed():
    # gluon declares BatchNorm's running statistics too, and pushes only parameters with
    # gradients: the first round of calls decides the members
    plan = BucketPlan(1 << 20)
    declare_all(plan, [(0, 8, F32), (1, 4, F32), (2, 4, F32), (3, 16, F32), (4, 4, F32)])
    bucket = plan.use(3)
    assert bucket.learning and plan.bucket_of(3) is None and plan.sealed_of(3) is bucket
    learn(bucket, [3, 0])
    assert members(bucket) == [0, 3] and bucket.nbytes == 24
    assert [(m.offset, m.nbytes) for m in bucket.members] == [(0, 8), (8, 16)]
    assert plan.bucket_of(0) is bucket and plan.bucket_of(3) is bucket
    assert plan.bucket_of(1) is None and plan.sealed_of(2) is None   # left out: alone
    one = BucketPlan(1 << 20)
    declare_all(one, [(0, 8, F32), (1, 4, F32)])
    assert not learn(one.use(0), [0]).fused          # one key pushed: it goes alone


def test_the_round_of_calls_that_formed_the_bucket_goes_alone_and_the_next_travels_in_it():
    # the engine forms a bucket with fused_from=1: its server key is set up meanwhile
    plan = BucketPlan(1 << 20)
    declare_all(plan, [(0, 4, F32), (1, 4, F32)])
    bucket = plan.use(0)
    assert not bucket.learn(0) and not bucket.learn(1) and bucket.learn(0)
    bucket.form(fused_from=1)
    assert [bucket.called(k) for k in (0, 1, 1, 0)] == [0, 0, 1, 1]
    assert bucket.goes_alone(0) and not bucket.goes_alone(1)
    bucket.arrive(1, 1, ("b", None, 0), 0, now=0.0)
    first, ready = bucket.arrive(0, 1, ("a", None, 0), 0, now=0.0)
    assert ready == [first] and first.index == 1      # sent: no round 0 to wait for
