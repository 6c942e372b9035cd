"""A row_sparse push, range by range (kvstore_byteps/engine/sparse.py's RowPush): at most
``in_flight`` ranges sent and not answered, the next sent from an answer, in row order; each
range's send and answer reported; the first error raised by ``wait``."""
import numpy as np
import pytest

from kvstore_byteps.engine.sparse import RowPush, RowRange, row_parts
from kvstore_byteps.errors import DeadlineError, KVStoreBytePSError


class FakeKV:
    """Records pushes; ``answer(i, error)`` answers the i-th push sent."""

    def __init__(self):
        self.sent, self._callbacks = [], []

    def push(self, keys, vals, lens, cmd, callback):
        request = type("Request", (), {"timestamp": 100 + len(self.sent), "error": None})()
        self.sent.append((keys.tolist(), bytes(vals)))
        self._callbacks.append((request, callback))
        return request

    def answer(self, i, error=None):
        request, callback = self._callbacks[i]
        request.error = error
        callback(request)


def make_push(in_flight, ranges=5):
    kv, sent, answered = FakeKV(), [], []
    layout = [RowRange(10 * r, 10 * r + 10, 1000 * (r + 1)) for r in range(ranges)]
    rows = np.arange(0, 10 * ranges, 5, dtype=np.int64)              # two rows a range
    data = np.arange(len(rows), dtype=np.float32).view(np.uint8)
    push = RowPush(kv, 7, row_parts(rows, layout, 4, every_range=True), data, 4, in_flight,
                   lambda r, request: answered.append(r),
                   lambda r, timestamp: sent.append((r, timestamp)))
    return kv, push, sent, answered


def test_at_most_in_flight_ranges_the_next_sent_from_an_answer_in_row_order():
    kv, push, sent, answered = make_push(in_flight=2)
    push.start()
    assert sent == [(0, 100), (1, 101)]
    assert kv.sent[0] == ([1000, 1000, 1005], np.arange(2, dtype=np.float32).tobytes())
    kv.answer(1)                     # answers may come in any order: one more goes out
    assert [r for r, _ in sent] == [0, 1, 2] and answered == [1]
    for i in (0, 2, 3, 4):
        kv.answer(i)
    assert [r for r, _ in sent] == [0, 1, 2, 3, 4] and sorted(answered) == [0, 1, 2, 3, 4]
    assert kv.sent[4][0] == [5000, 5000, 5005]
    push.wait(1.0)


def test_no_limit_sends_every_range_at_once_and_wait_raises_the_first_error():
    kv, push, sent, _ = make_push(in_flight=None)
    push.start()
    assert len(sent) == 5
    with pytest.raises(DeadlineError, match="5 of 5 ranges not answered"):
        push.wait(0.01)
    kv.answer(3, error="refused by the server")
    for i in (0, 1, 2, 4):
        kv.answer(i)
    with pytest.raises(KVStoreBytePSError, match="refused by the server"):
        push.wait(1.0)
