"""One worker of the sparse embedding benchmark; started by ``bench_sparse.py`` through ``launch.py``.

    python launch.py -n 2 -s 2 --scheduler mxnet --server mxnet \
        python benchmarks/_sparse_worker.py --steps 20
    python launch.py -n 2 -s 2 python benchmarks/_sparse_worker.py --kvstore dist_byteps

An MXNet worker (``--kvstore``: ``dist_sync``, or ``dist_byteps``) as a new user writes one: a ``row_sparse`` embedding of
``--rows`` x ``--dim`` float32 (BERT-base's 30,522 x 768 by default, initialised as BERT does,
normal with sigma 0.02, every row present) on the servers, whose optimizer is SGD with momentum
and lazy updates. Each step pushes a ``row_sparse`` gradient of ``--touched`` random rows
(seeded by rank; ``POOL`` gradients made before the timed steps and used in turn, so making
them costs no step), then ``row_sparse_pull`` of those rows, and waits for the rows. Untimed
warm-up steps, a barrier, then the timed steps; the worker prints one line
``SPARSE_RESULT {json}``: each step's seconds, wall-clock start and end of the timed steps (for
the servers' CPU, sampled by the parent from ``/proc``), its own CPU per step, and a checksum of
the rows it pulled last (the same seeds give the same weights on any server).
``--dense``: the same model sent dense (a dense weight; each step's gradient pushed as a
dense array, every row, and the whole weight pulled), for comparison.
"""
import argparse
import json
import os
import time

import mxnet as mx
import numpy as np

RESULT_TAG = "SPARSE_RESULT "
KEY = 0
POOL = 4


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=30522)
    p.add_argument("--dim", type=int, default=768)
    p.add_argument("--touched", type=int, default=4096, help="rows of each step's gradient")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--kvstore", default="dist_sync")
    p.add_argument("--dense", action="store_true", help="the same model sent dense")
    return p.parse_args(argv)


def gradients(rank: int, rows: int, dim: int, touched: int, dense: bool):
    """``POOL`` (row ids, row_sparse gradient) pairs of this rank, seeded (``dense``: the
    gradients as dense arrays)."""
    rng = np.random.RandomState(1000 + rank)
    out = []
    for _ in range(POOL):
        ids = np.sort(rng.choice(rows, touched, replace=False)).astype(np.int64)
        data = rng.randn(touched, dim).astype(np.float32)
        grad = mx.nd.sparse.row_sparse_array((data, ids), shape=(rows, dim))
        out.append((mx.nd.array(ids, dtype=np.int64),
                    grad.tostype("default") if dense else grad))
    return out


def step(kv, row_ids, grad, out) -> None:
    kv.push(KEY, grad)
    if out.stype == "default":          # --dense: the whole weight
        kv.pull(KEY, out=out)
    else:
        kv.row_sparse_pull(KEY, out=out, row_ids=row_ids)
    out.wait_to_read()


def main(argv=None) -> int:
    args = parse_args(argv)
    kv = mx.kv.create(args.kvstore)
    shape = (args.rows, args.dim)
    weight = np.random.RandomState(7).normal(0, 0.02, shape).astype(np.float32)
    kv.init(KEY, mx.nd.array(weight) if args.dense else mx.nd.array(weight).tostype("row_sparse"))
    kv.set_optimizer(mx.optimizer.SGD(momentum=0.9, lazy_update=True, learning_rate=0.1))
    grads = gradients(kv.rank, args.rows, args.dim, args.touched, args.dense)
    out = mx.nd.zeros(shape) if args.dense else mx.nd.sparse.zeros("row_sparse", shape)
    for i in range(args.warmup):
        step(kv, *grads[i % POOL], out)
    kv._barrier()
    times, cpu0, start = [], os.times(), time.time()
    for i in range(args.steps):
        began = time.perf_counter()
        step(kv, *grads[(args.warmup + i) % POOL], out)
        times.append(time.perf_counter() - began)
    cpu1, end = os.times(), time.time()
    result = {"rank": kv.rank, "times_s": times, "start": start, "end": end,
              "cpu_s": (cpu1.user + cpu1.system - cpu0.user - cpu0.system) / args.steps,
              "checksum": float((out if args.dense else out.data).asnumpy()
                                .astype(np.float64).sum())}
    print(RESULT_TAG + json.dumps(result), flush=True)
    kv._barrier()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
