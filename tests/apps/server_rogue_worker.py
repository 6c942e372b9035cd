"""A worker on our KV layer that trains correctly beside MXNet workers and also sends bad input.

It must run as the last rank of a one-server dist_sync cluster whose other workers run
``upstream_worker.py KEYS ELEMS``: every round it pushes (rank + 1) to each key and checks the
pulled sum, like them. Between rounds it sends one malformed request of each kind and checks
that each gets an error answer naming the problem. Prints ROGUE OK and exits 0 on success.

    python server_rogue_worker.py KEYS ELEMS MARKER_FILE
"""
import os
import pickle
import sys

import numpy as np

from kvstore_byteps.config import Config
from kvstore_byteps.errors import PeerError
from kvstore_byteps.van.kv.worker import KVWorker
from kvstore_byteps.van.wire.message import WORKER_GROUP
from kvstore_byteps.van.runtime.postoffice import Postoffice

ROUNDS = 3


class _Evil:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, ("touch %s" % self.marker,))


def bad_requests(worker, key, elems, marker):
    """(description, request, words expected in the error) for each kind of bad input."""
    nbytes = elems * 4
    f32 = np.ones(elems, np.float32)
    return [
        ("pull of an unknown key", lambda: worker.pull([999]), "never initialised"),
        ("push of the wrong size", lambda: worker.push([key], f32[:10], [40]),
         "holds %d values, push has 10" % elems),
        ("vals not a whole number of float32",
         lambda: worker.push([key], np.zeros(nbytes + 2, np.uint8), [nbytes + 2]),
         "not a whole number of float32"),
        ("unsupported dtype int32", lambda: worker.push([key], f32, [nbytes], cmd=14),
         "unsupported dtype int32"),
        ("row_sparse lens[0] not 0",
         lambda: worker.push([key, key + 1], f32[:3], [4, 8], cmd=1), "lens[0] must be 0"),
        ("compressed push without compression",
         lambda: worker.push([key, key + 1], np.zeros(28, np.uint8), [0, 28], cmd=3),
         "before kSetGradientCompression"),
        ("unknown command", lambda: worker.command(42), "unknown server command 42"),
        ("malicious optimizer pickle",
         lambda: worker.command(0, pickle.dumps(_Evil(marker), 0)), "refusing to unpickle"),
    ]


def main():
    keys = [int(k) for k in sys.argv[1].split(",")]
    elems, marker = int(sys.argv[2]), sys.argv[3]
    po = Postoffice(Config.from_env())
    po.start()
    po.barrier(7)
    worker = KVWorker(po)
    rank, nw = po.my_rank, po.num_workers
    begin = po.server_key_ranges()[0].begin
    ps_keys = [begin + k for k in keys]
    po.barrier(WORKER_GROUP)            # rank 0 (an MXNet worker) has initialised the keys
    expected = sum(r + 1 for r in range(nw))
    for round_index in range(ROUNDS):
        for key in ps_keys:
            worker.wait(worker.push([key], np.full(elems, rank + 1, np.float32), [elems * 4]))
            got = np.frombuffer(worker.wait(worker.pull([key])).vals, np.float32)
            if not np.all(got == expected):
                print("WRONG rank %d round %d key %d: %s" % (rank, round_index, key, got[:4]))
                return 1
        if round_index == 0:
            for what, send, words in bad_requests(worker, ps_keys[0], elems, marker):
                try:
                    worker.wait(send())
                except PeerError as exc:
                    if words not in str(exc):
                        print("WRONG error for %s: %s" % (what, exc))
                        return 1
                    print("refused as expected: %s" % what, flush=True)
                else:
                    print("WRONG: %s was accepted" % what)
                    return 1
        print("rank %d round %d ok sum %s" % (rank, round_index, expected), flush=True)
    po.barrier(WORKER_GROUP)
    po.finalize()
    print("ROGUE OK", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
