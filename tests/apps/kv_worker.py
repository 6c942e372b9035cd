"""A worker built on our KV layer that behaves like an MXNet 1.9.1 dist_sync worker.

Rank 0 sends kSyncMode, initialises every key and, at the end, sends kStopServer; every rank
pushes (rank + 1) * ones per round, waits for the ack, pulls and checks the sum over workers.
``--multi`` sends all keys in one request (sliced over the servers) instead of one per key.
"""
import argparse
import sys

import numpy as np

from kvstore_byteps.config import Config
from kvstore_byteps.van.kv.worker import KVWorker
from kvstore_byteps.van.wire.message import WORKER_GROUP
from kvstore_byteps.van.runtime.postoffice import Postoffice

K_STOP_SERVER, K_SYNC_MODE = 2, 3


def mxnet_ps_key(key, ranges):
    server = (key * 9973) % (2 ** 31) % len(ranges)   # fine for small keys
    return ranges[server].begin + key


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--keys", default="3")
    parser.add_argument("--elems", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--multi", action="store_true")
    args = parser.parse_args()
    config = Config.from_env()
    po = Postoffice(config)
    po.start()
    po.barrier(7)
    worker = KVWorker(po)
    rank, nw = po.my_rank, po.num_workers
    ranges = po.server_key_ranges()
    keys = sorted(mxnet_ps_key(int(k), ranges) for k in args.keys.split(","))
    nbytes = args.elems * 4
    groups = [keys] if args.multi else [[k] for k in keys]
    if rank == 0:
        worker.wait(worker.command(K_SYNC_MODE))
        for group in groups:
            zeros = np.zeros(args.elems * len(group), np.float32)
            worker.wait(worker.push(group, zeros, [nbytes] * len(group)))
    po.barrier(WORKER_GROUP)
    expected = sum(r + 1 for r in range(nw))
    for round_index in range(args.rounds):
        for group in groups:
            vals = np.full(args.elems * len(group), rank + 1, np.float32)
            worker.wait(worker.push(group, vals, [nbytes] * len(group)))
            got = worker.wait(worker.pull(group))
            result = np.frombuffer(got.vals, np.float32)
            if result.size != vals.size or not np.all(result == expected):
                print("WRONG rank %d round %d keys %s: %s" % (rank, round_index, group,
                                                             result[:4]), flush=True)
                return 1
            if list(got.lens) != [nbytes] * len(group):
                print("WRONG lens %s" % list(got.lens), flush=True)
                return 1
        print("rank %d round %d ok sum %s" % (rank, round_index, expected), flush=True)
    po.barrier(WORKER_GROUP)
    if rank == 0:
        worker.wait(worker.command(K_STOP_SERVER))
    po.finalize()
    print("rank %d done" % rank, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
