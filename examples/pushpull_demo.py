"""Push/pull demo on a local cluster, through kvstore-byteps's KV layer.

    python launch.py -n 2 -s 2 python examples/pushpull_demo.py

Each worker pushes (rank + 1) * ones for a few keys spread over all servers, pulls them back and
prints the sum over workers. Rank 0 talks to the servers exactly as an MXNet dist_sync rank 0
does (kSyncMode, the initialising push, kStopServer), so the servers may be upstream MXNet's.
"""
import sys
import time

import numpy as np

from kvstore_byteps.config import Config
from kvstore_byteps.van.kv import KVWorker
from kvstore_byteps.van.message import ALL_GROUP, WORKER_GROUP
from kvstore_byteps.van.postoffice import Postoffice

K_STOP_SERVER, K_SYNC_MODE = 2, 3
ELEMS, ROUNDS, MXNET_KEYS = 250000, 5, (0, 1, 2, 3)


def main() -> int:
    po = Postoffice(Config.from_env())
    po.start()
    po.barrier(ALL_GROUP)
    worker = KVWorker(po)
    ranges = po.server_key_ranges()
    # MXNet's placement of a small key: server (key * 9973) % S, ps key = range begin + key
    ps_keys = [ranges[(k * 9973) % len(ranges)].begin + k for k in MXNET_KEYS]
    if po.my_rank == 0:
        worker.wait(worker.command(K_SYNC_MODE))
        for key in ps_keys:
            worker.wait(worker.push([key], np.zeros(ELEMS, np.float32), [ELEMS * 4]))
    po.barrier(WORKER_GROUP)
    grads = np.full(ELEMS, po.my_rank + 1, np.float32)
    started = time.perf_counter()
    for round_index in range(ROUNDS):
        pushes = [worker.push([key], grads, [ELEMS * 4]) for key in ps_keys]
        for request in pushes:
            worker.wait(request)
        pulled = [np.frombuffer(worker.wait(worker.pull([key])).vals, np.float32)
                  for key in ps_keys]
        print("worker %d round %d: sums %s" % (po.my_rank, round_index,
                                               [float(p[0]) for p in pulled]), flush=True)
    seconds = time.perf_counter() - started
    megabytes = 2 * ROUNDS * len(ps_keys) * ELEMS * 4 / 1e6
    print("worker %d: %.1f MB pushed+pulled in %.2f s" % (po.my_rank, megabytes, seconds))
    po.barrier(WORKER_GROUP)
    if po.my_rank == 0:
        worker.wait(worker.command(K_STOP_SERVER))
    po.finalize()
    return 0


if __name__ == "__main__":
    sys.exit(main())
