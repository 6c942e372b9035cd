"""Socket-free fakes for server tests: requests built like the KV layer's, a recording responder."""
import threading
import time

import numpy as np

from kvstore_byteps.mxproto import RequestType, encode_cmd
from kvstore_byteps.van.kv import KVPairs, KVRequest
from kvstore_byteps.van.wire.message import Gather, Meta

WORKER0, WORKER1, WORKER2 = 9, 11, 13
_timestamps = iter(range(10 ** 9))


def request(sender, keys, vals=None, lens=None, push=False, pull=False, head=0, extra=None):
    """A KVRequest as the KV layer hands it to a handler (keys uint64, vals bytes, lens int32)."""
    meta = Meta(head=head, request=True, push=push, pull=pull, app_id=0, customer_id=0,
                timestamp=next(_timestamps), sender=sender, extra=extra)
    keys = np.asarray(keys, dtype=np.uint64)
    vals = memoryview(b"" if vals is None else bytes(np.ascontiguousarray(vals).tobytes()))
    lens = None if lens is None else np.asarray(lens, dtype=np.int32)
    return KVRequest(meta, KVPairs(keys, vals, lens))


def push(sender, key, values, pull=False, rtype=RequestType.DEFAULT, extra=None):
    """A one-key dense push (or pushpull) of ``values`` as MXNet's worker encodes it."""
    values = np.asarray(values)
    return request(sender, [key], values, [values.nbytes], push=True, pull=pull,
                   head=encode_cmd(rtype, values.dtype), extra=extra)


def pull(sender, key, dtype=np.float32, rtype=RequestType.DEFAULT):
    return request(sender, [key], pull=True, head=encode_cmd(rtype, dtype))


def command(sender, head, body=b""):
    meta = Meta(head=head, body=body, request=True, simple_app=True, app_id=0,
                timestamp=next(_timestamps), sender=sender)
    return KVRequest(meta, KVPairs(np.empty(0, np.uint64), memoryview(b""), None))


class Answer:
    """One recorded respond() call."""

    def __init__(self, req, keys, vals, lens, error, body):
        self.req, self.keys, self.lens, self.error, self.body = req, keys, lens, error, body
        self.vals_ref = vals                            # what the server handed over
        # the bytes as they were when respond() was called
        if isinstance(vals, Gather):                    # a batch answer, in pieces
            self.vals = vals.join()
        else:
            self.vals = None if vals is None else bytes(memoryview(vals).cast("B"))

    def values(self, dtype=np.float32):
        return np.frombuffer(self.vals, dtype=dtype)


class FakeServer:
    """Records respond() calls; thread-safe; ``wait_for`` blocks with a deadline."""

    def __init__(self):
        self.answers = []
        self._cond = threading.Condition()

    def respond(self, req, keys=None, vals=None, lens=None, error=None, body=b""):
        with self._cond:
            self.answers.append(Answer(req, keys, vals, lens, error, body))
            self._cond.notify_all()

    def answer_to(self, req):
        """The one answer to ``req`` (fails if none or several)."""
        return self._only(lambda answer: answer.req is req)

    def _only(self, matches):
        found = [a for a in self.answers if matches(a)]
        if len(found) != 1:
            raise AssertionError("expected one answer to the request, got %d" % len(found))
        return found[0]

    def answered(self, req):
        return any(a.req is req for a in self.answers)

    def wait_for(self, req, timeout=5.0):
        """Wait until ``req`` was answered; return the answer."""
        return self._wait_until(lambda answer: answer.req is req, timeout,
                                "the request with timestamp %d" % req.meta.timestamp)

    def values_of(self, req, timeout=5.0):
        """The values ``req`` was answered with (as a list), asserting it was no error."""
        answer = self.wait_for(req, timeout)
        assert answer.error is None, answer.error
        return list(answer.values())

    def wait_for_timestamp(self, timestamp, timeout=5.0):
        """Wait for the one answer under ``timestamp`` (e.g. to a pull riding on a push,
        which the server answers as a request of its own); return it."""
        return self._wait_until(lambda answer: answer.req.meta.timestamp == timestamp, timeout,
                                "timestamp %d" % timestamp)

    def _wait_until(self, matches, timeout, what):
        deadline = time.monotonic() + timeout
        with self._cond:
            while not any(matches(a) for a in self.answers):
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError("no answer to %s within %.1f s" % (what, timeout))
                self._cond.wait(left)
            return self._only(matches)

    def errors(self):
        return [a.error for a in self.answers if a.error]


def vector_request(name, sender=WORKER0):
    """The golden vector ``name`` (a captured upstream request) as a server handler sees it."""
    import os

    from kvstore_byteps.van.wire.codec import decode_meta
    from kvstore_byteps.van.kv import parse_kv_frames
    from kvstore_byteps.van.wire.message import Message
    from tests.support import vectors

    meta = decode_meta(vectors.read(name + ".meta.bin"), sender=sender)
    frames = []
    for i in range(3):
        path = os.path.join(vectors.VECTOR_DIR, "%s.d%d.bin" % (name, i))
        if os.path.exists(path):
            frames.append(vectors.read("%s.d%d.bin" % (name, i)))
    return KVRequest(meta, parse_kv_frames(Message(meta, frames)))
