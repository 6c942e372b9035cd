"""Batching of small partitions: the worker's grouping (pure) and the server's batch path."""
import types

import numpy as np
import pytest

from kvstore_byteps.engine.layout import group_small
from kvstore_byteps.engine.routes import split_answer
from kvstore_byteps.serving.byteps import BytePSServer
from kvstore_byteps.mxproto import RequestType, encode_cmd
from kvstore_byteps.van.kv import KVPairs
from tests.support.server_fakes import WORKER0, WORKER1, FakeServer, push, request

BP = encode_cmd(RequestType.BYTEPS, np.float32)


def item(ps_key, nbytes):
    return types.SimpleNamespace(partition=types.SimpleNamespace(ps_key=ps_key, nbytes=nbytes))


def test_small_items_of_one_server_share_a_request_big_ones_go_alone():
    items = [item(5, 100), item(1000, 100), item(3, 100), item(7, 10 ** 6), item(1001, 100)]
    groups = group_small(items, lambda it: it.partition.ps_key // 1000, 4096, 10 ** 7)
    assert [[it.partition.ps_key for it in g] for g in groups] == [[3, 5], [1000, 1001], [7]]


def test_groups_are_capped_in_bytes():
    items = [item(k, 40) for k in range(5)]
    groups = group_small(items, lambda it: 0, 64, 100)
    assert [len(g) for g in groups] == [2, 2, 1]


def test_split_answer_by_lens():
    result = KVPairs(np.array([1, 2], np.uint64), memoryview(b"abcdef"), np.array([2, 4], np.int32))
    assert [bytes(v) for v in split_answer(result, 2)] == [b"ab", b"cdef"]


def batch_push(sender, keys, values):
    vals = np.concatenate(values).astype(np.float32)
    return request(sender, keys, vals, [v.nbytes for v in values], push=True, head=BP)


def batch_pull(sender, keys):
    return request(sender, keys, pull=True, head=BP)


@pytest.fixture
def server():
    with BytePSServer(2, summing_threads=2) as srv:
        yield srv, FakeServer()


def test_batch_push_acked_once_and_batch_pull_answered_once_with_every_sum(server):
    srv, fake = server
    keys = [10, 11, 12]
    for key, size in zip(keys, (2, 3, 1)):          # rank 0 initialises with default pushes
        srv.handle_request(push(WORKER0, key, np.zeros(size, np.float32)), fake)
    values = [np.full(s, 1.0, np.float32) for s in (2, 3, 1)]
    pushes = [batch_push(w, keys, [v * (i + 1) for v in values])
              for i, w in enumerate((WORKER0, WORKER1))]
    pulls = [batch_pull(w, keys) for w in (WORKER0, WORKER1)]
    srv.handle_request(pushes[0], fake)
    srv.handle_request(pulls[0], fake)
    assert fake.wait_for(pushes[0]).error is None
    assert not fake.answered(pulls[0])             # round incomplete: worker 1 not in yet
    srv.handle_request(pushes[1], fake)
    srv.handle_request(pulls[1], fake)
    for req in pulls:
        answer = fake.wait_for(req)
        assert answer.error is None and list(answer.lens) == [8, 12, 4]
        assert list(answer.values()) == [3.0] * 6
    assert sum(a.req in pulls for a in fake.answers) == 2


def test_batch_with_bad_lens_or_unknown_key_is_refused_whole(server):
    srv, fake = server
    srv.handle_request(push(WORKER0, 10, np.zeros(2, np.float32)), fake)
    bad_lens = request(WORKER0, [10, 99], np.ones(2, np.float32), [8], push=True, head=BP)
    unknown = batch_push(WORKER0, [10, 99], [np.ones(2, np.float32), np.ones(1, np.float32)])
    for req in (bad_lens, unknown):
        srv.handle_request(req, fake)
        assert fake.wait_for(req).error
    good = batch_push(WORKER0, [10], [np.ones(2, np.float32)])   # key 10 untouched by them
    srv.handle_request(good, fake)
    assert fake.wait_for(good).error is None


def test_async_batch_push_is_acked_once_after_every_key_has_its_change():
    with BytePSServer(2, summing_threads=2, enable_async=True) as srv:
        fake = FakeServer()
        keys = [20, 21, 22]
        for key, size in zip(keys, (2, 3, 1)):
            srv.handle_request(push(WORKER0, key, np.full(size, 5.0, np.float32)), fake)
        changes = [np.full(s, 1.0, np.float32) for s in (2, 3, 1)]
        for sender in (WORKER0, WORKER1):
            req = batch_push(sender, keys, changes)
            srv.handle_request(req, fake)
            assert fake.wait_for(req).error is None
            read = batch_pull(sender, keys)       # after the ack: every change is in
            srv.handle_request(read, fake)
            want = 6.0 if sender == WORKER0 else 7.0
            assert list(fake.wait_for(read).values()) == [want] * 6
        acks = [a for a in fake.answers if a.req.meta.push and a.req.meta.head == BP]
        assert len(acks) == 2                      # one per batch, not one per key
