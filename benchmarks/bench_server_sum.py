#!/usr/bin/env python3
"""Summation throughput of the BytePS server engine against numpy's add bandwidth, same machine.

    python benchmarks/bench_server_sum.py                          # 2 workers, 16 x 4 MB keys
    python benchmarks/bench_server_sum.py --workers 4 --threads 1,2,4,8 --rounds 20
    python benchmarks/bench_server_sum.py --workers 4 --dtype float16 --partition-bytes 768000

No sockets: requests are built as the KV layer hands them to the server and fed straight to
``BytePSServer.handle_request`` (what the van's receive thread does); a null responder counts
the answers. One round = every worker pushes every key (acked at once, summed by the engine
threads), then pulls it (answered when the round is summed). Throughput = bytes summed per
second = workers x keys x partition bytes / round time.

Baseline, the same arithmetic as a float32 round on the same working set (in ``--dtype``),
without any server around it: for every key, ``np.copyto(acc_k, x_0)`` then
``np.add(acc_k, x_w, out=acc_k)`` for the
other workers' arrays, looping; with T threads each thread owns every T-th key (numpy releases
the GIL while it adds). The in-cache rate of one 4 MB ``np.add`` is printed too, for reference.
"""
import argparse
import os
import sys
import threading
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from kvstore_byteps.serving.byteps import BytePSServer            # noqa: E402
from kvstore_byteps.mxproto import RequestType, encode_cmd   # noqa: E402
from kvstore_byteps.van.kv import KVPairs, KVRequest             # noqa: E402
from kvstore_byteps.van.wire.message import Meta                      # noqa: E402

GB = 1e9


class NullResponder:
    """Counts answers; ``wait(n)`` blocks until n answers arrived (with a deadline)."""

    def __init__(self, expected_sum, dtype):
        self.dtype = dtype
        self.count = 0
        self.errors = []
        self._expected = expected_sum
        self._cond = threading.Condition()

    def respond(self, req, keys=None, vals=None, lens=None, error=None, body=b""):
        if vals is not None and req.meta.pull:   # spot-check the sums (first and last value)
            values = np.frombuffer(vals, self.dtype)
            if values[0] != self._expected or values[-1] != self._expected:
                error = "wrong sum %s, expected %s" % (values[0], self._expected)
        with self._cond:
            self.count += 1
            if error:
                self.errors.append(error)
            self._cond.notify_all()

    def wait(self, n, timeout=120.0):
        deadline = time.monotonic() + timeout
        with self._cond:
            while self.count < n:
                if not self._cond.wait(max(0.0, deadline - time.monotonic())):
                    raise TimeoutError("%d of %d answers after %.0f s" % (self.count, n, timeout))


def make_request(sender, key, vals, push, pull, cmd):
    meta = Meta(head=cmd, request=True, push=push, pull=pull, app_id=0, timestamp=0,
                sender=sender)
    lens = np.array([vals.nbytes], np.int32) if push else None
    data = memoryview(vals).cast("B") if push else memoryview(b"")
    return KVRequest(meta, KVPairs(np.array([key], np.uint64), data, lens))


def numpy_inplace_add_rate(nbytes, seconds=1.0):
    """GB/s of one ``np.add(acc, x, out=acc)`` on two arrays of ``nbytes`` (cache-resident)."""
    acc, x = np.zeros(nbytes // 4, np.float32), np.ones(nbytes // 4, np.float32)
    count, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        np.add(acc, x, out=acc)
        count += 1
    return count * nbytes / (time.perf_counter() - start) / GB


def numpy_add_rate(nbytes, threads, keys=1, workers=2, seconds=1.0, dtype=np.float32):
    """GB/s of input bytes summed by plain numpy in ``dtype`` (a float32 round's arithmetic)
    on the server's working set."""
    elems = nbytes // np.dtype(dtype).itemsize
    done = [0] * threads
    addends = [np.full(elems, 1.0 + w, dtype) for w in range(workers)]

    def loop(i):
        accs = [np.zeros(elems, dtype) for _ in range(i, keys, threads)] or \
            [np.zeros(elems, dtype)]
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            for acc in accs:
                np.copyto(acc, addends[0])
                for x in addends[1:]:
                    np.add(acc, x, out=acc)
                done[i] += workers
    start = time.perf_counter()
    pool = [threading.Thread(target=loop, args=(i,)) for i in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    return sum(done) * nbytes / (time.perf_counter() - start) / GB


def engine_rate(workers, keys, nbytes, threads, rounds, warmup=2, dtype=np.float32):
    """GB/s the BytePS server sums through its summing threads (median round)."""
    cmd = encode_cmd(RequestType.BYTEPS, dtype)
    senders = [9 + 2 * w for w in range(workers)]
    elems = nbytes // np.dtype(dtype).itemsize
    data = {s: np.full(elems, 1.0 + i, dtype) for i, s in enumerate(senders)}
    times = []
    with BytePSServer(workers, summing_threads=threads) as server:
        sink = NullResponder(sum(1.0 + i for i in range(workers)), dtype)
        for k in range(keys):
            server.handle_request(make_request(senders[0], k, data[senders[0]], True, False, cmd),
                                  sink)
        expected = keys
        for r in range(warmup + rounds):
            pushes = [make_request(s, k, data[s], True, False, cmd)
                      for k in range(keys) for s in senders]
            pulls = [make_request(s, k, data[s], False, True, cmd)
                     for k in range(keys) for s in senders]
            start = time.perf_counter()
            for req in pushes:
                server.handle_request(req, sink)
            for req in pulls:
                server.handle_request(req, sink)
            expected += len(pushes) + len(pulls)
            sink.wait(expected)
            if r >= warmup:
                times.append(time.perf_counter() - start)
        if sink.errors:
            raise RuntimeError("server errors: %s" % sink.errors[:3])
    median = sorted(times)[len(times) // 2]
    return workers * keys * nbytes / median / GB


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--keys", type=int, default=16)
    parser.add_argument("--partition-bytes", type=int, default=4096000)
    parser.add_argument("--threads", default="1,2,4")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--dtype", choices=["float32", "float16"], default="float32")
    parser.add_argument("--repeat", type=int, default=3,
                        help="measure each line this many times, interleaved; print the best")
    args = parser.parse_args()
    threads = [int(t) for t in args.threads.split(",")]
    dtype = np.dtype(args.dtype)
    print("machine: %d CPUs; %d workers x %d keys x %.1f MB %s partitions per round"
          % (os.cpu_count(), args.workers, args.keys, args.partition_bytes / 1e6, dtype))
    lines = [("np.add of one partition, in cache", lambda: numpy_inplace_add_rate(
        args.partition_bytes))]
    for t in threads:
        plural = "s" if t > 1 else ""
        lines.append(("numpy, same work, %d thread%s" % (t, plural),
                      lambda t=t: numpy_add_rate(args.partition_bytes, t, args.keys,
                                                 args.workers, dtype=dtype)))
        lines.append(("BytePS server, %d summing thread%s" % (t, plural),
                      lambda t=t: engine_rate(args.workers, args.keys, args.partition_bytes, t,
                                              args.rounds, dtype=dtype)))
    best = [0.0] * len(lines)
    for _ in range(args.repeat):
        for i, (_, measure) in enumerate(lines):
            best[i] = max(best[i], measure())
    print("%-36s %10s" % ("what (best of %d)" % args.repeat, "GB/s"))
    for (label, _), rate in zip(lines, best):
        print("%-36s %10.2f" % (label, rate))
    return 0


if __name__ == "__main__":
    sys.exit(main())
