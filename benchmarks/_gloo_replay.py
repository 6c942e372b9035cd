"""The replay benchmark's all-reduce anchor: torch.distributed gloo with gradient buckets.

    python launch.py -n 4 -s 1 --scheduler-cmd "python benchmarks/_gloo_replay.py rendezvous" \
        --server-cmd "python benchmarks/_gloo_replay.py idle" \
        python benchmarks/_replay_worker.py --kvstore gloo ...

How data-parallel training on all-reduce moves gradients: they sit in flat buckets in the order
the backward produces them (DDP's ``gradient_as_bucket_view``: a gradient is a view of its
bucket, so nothing is copied), the first bucket small (1 MB) and the others up to
``GLOO_BUCKET_BYTES`` (default 25 MB: DDP's ``bucket_cap_mb``; Horovod fuses up to 64 MB); a
bucket's ring all-reduce starts (asynchronously, in order) as soon as its last gradient is
written, and a layer's forward waits for its bucket only (as Horovod's MXNet binding does
through the engine: its allreduce_ ops run as gradients become ready and the next forward
reads them). The sum lands in place.

The scheduler's place runs torch's TCPStore for the rendezvous (``DMLC_PS_ROOT_URI``/``PORT``);
the launcher's one server waits with it until every worker is done.
"""
import math
import os
import sys
import time
from typing import Dict, List

DEADLINE_S = 300.0
FIRST_BUCKET_BYTES = 1 << 20
DONE = "workers_done"


def _store(master: bool):
    import datetime
    from torch.distributed import TCPStore
    host, port = os.environ["DMLC_PS_ROOT_URI"], int(os.environ["DMLC_PS_ROOT_PORT"])
    timeout = datetime.timedelta(seconds=DEADLINE_S)
    if master:
        return TCPStore(host, port, is_master=True, timeout=timeout, wait_for_workers=False)
    deadline = time.monotonic() + DEADLINE_S
    while True:                 # the master may not be listening yet
        try:
            return TCPStore(host, port, is_master=False, timeout=timeout)
        except (RuntimeError, ConnectionError):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def wait_for_workers(master: bool) -> int:
    """Scheduler and server: hold the rendezvous until every worker has said it is done."""
    store = _store(master)
    workers = int(os.environ["DMLC_NUM_WORKER"])
    deadline = time.monotonic() + 3600
    while store.add(DONE, 0) < workers:
        if time.monotonic() > deadline:
            sys.exit("gloo replay: workers not done after an hour")
        time.sleep(0.2)
    time.sleep(0.5 if master else 0)      # let the others read the count before the store goes
    return 0


class GlooKV:
    """A worker's side: ``grad(key)`` is the gradient's place in its bucket; ``pushpull``
    marks it written; ``wait`` waits for its bucket's sum (which lands in the same place)."""

    def __init__(self, shapes: Dict[int, tuple], dtype: str):
        import torch
        import torch.distributed as dist
        self._dist = dist
        host = os.environ.get("DMLC_NODE_HOST", "127.0.0.1")
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo" if host.startswith("127.") else "eth0")
        self.rank = int(os.environ["DMLC_WORKER_ID"])
        self.num_workers = int(os.environ["DMLC_NUM_WORKER"])
        self._store = _store(master=False)
        dist.init_process_group("gloo", store=self._store, rank=self.rank,
                                world_size=self.num_workers)
        cap = int(os.environ.get("GLOO_BUCKET_BYTES", 25 << 20))
        torch_dtype = getattr(torch, dtype)
        itemsize = torch.tensor([], dtype=torch_dtype).element_size()
        buckets: List[List[int]] = [[]]
        filled = 0
        for key in sorted(shapes, reverse=True):          # backward order
            size = _numel(shapes[key]) * itemsize
            limit = FIRST_BUCKET_BYTES if len(buckets) == 1 else cap
            if buckets[-1] and filled + size > limit:
                buckets.append([])
                filled = 0
            buckets[-1].append(key)
            filled += size
        self._bucket_of: Dict[int, int] = {}
        self._views: Dict[int, object] = {}
        self._buffers = []
        for b, keys in enumerate(buckets):
            buffer = torch.zeros(sum(_numel(shapes[k]) for k in keys), dtype=torch_dtype)
            at = 0
            for k in keys:
                n = _numel(shapes[k])
                self._views[k] = buffer[at:at + n].view(shapes[k])
                self._bucket_of[k] = b
                at += n
            self._buffers.append(buffer)
        self._missing = [len(keys) for keys in buckets]
        self._sizes = list(self._missing)
        self._works = [None] * len(buckets)

    def grad(self, key: int):
        return self._views[key]

    def pushpull(self, key: int) -> None:
        b = self._bucket_of[key]
        self._missing[b] -= 1
        if self._missing[b] == 0:
            self._missing[b] = self._sizes[b]
            self._works[b] = self._dist.all_reduce(self._buffers[b], async_op=True)

    def wait(self, key: int) -> None:
        work = self._works[self._bucket_of[key]]
        if work is not None:
            work.wait()

    def close(self) -> None:
        for work in self._works:
            if work is not None:
                work.wait()
        self._store.add(DONE, 1)
        self._dist.destroy_process_group()


def _numel(shape) -> int:
    return math.prod(int(d) for d in shape)


if __name__ == "__main__":
    role = sys.argv[1] if len(sys.argv) > 1 else ""
    if role not in ("rendezvous", "idle"):
        sys.exit("usage: _gloo_replay.py rendezvous|idle (workers use GlooKV)")
    sys.exit(wait_for_workers(master=role == "rendezvous"))
