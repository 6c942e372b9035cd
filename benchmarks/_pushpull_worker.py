"""One worker of the push/pull benchmark; started by ``bench_pushpull.py`` through ``launch.py``.

    python launch.py -n 2 -s 1 python benchmarks/_pushpull_worker.py \
        --kvstore dist_byteps --shapes shapes.json --iters 10 --warmup 2

Every worker initialises one key per tensor of the shape list, then times iterations of
"pushpull every tensor (priority = -index), then ``mx.nd.waitall()``". The inputs hold
``rank + 1``, so each output must hold ``W * (W + 1) / 2``; one extra iteration after the timed
ones starts from zeroed outputs and checks that sum, so a fast but wrong run is caught. With
``--compression`` rank 0 checks the partitions the store compresses against the same
compression simulated here for every rank and the server over every round (lossy compressors
are not exact even on constant inputs); the other ranks leave the check to it.

Prints one line ``BENCH_RESULT {json}`` (iteration times in seconds, this process's CPU per
timed iteration, the check, what the store talked to); exits 3 if the sums were wrong.
"""
import argparse
import json
import os
import sys
import time

import mxnet as mx
import numpy as np

RESULT_TAG = "BENCH_RESULT "
EXIT_WRONG_SUM = 3


class Mode:
    """How one iteration talks to the store (the choice is the parent's, see bench_pushpull)."""

    PUSHPULL = "pushpull"
    PUSH_PULL = "push+pull"


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--kvstore", required=True, help="dist_sync or dist_byteps")
    p.add_argument("--shapes", required=True, help="JSON file: a list of tensor shapes")
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--mode", choices=[Mode.PUSHPULL, Mode.PUSH_PULL], default=Mode.PUSHPULL)
    p.add_argument("--compression", metavar="JSON", help="set_gradient_compression(JSON)")
    return p.parse_args(argv)


class Inputs(list):
    """The input arrays (``rank + 1`` each) and flat views of them (same memory, same engine
    variable), made once for :meth:`refill`."""

    def __init__(self, shapes, rank: int):
        super().__init__(mx.nd.full(s, rank + 1, dtype=np.float32) for s in shapes)
        self.rank = rank
        self.flat = [array.reshape((-1,)) for array in self]

    def refill(self) -> None:
        """Set the inputs back to ``rank + 1`` (untimed): upstream dist_sync writes the sum
        into the input array too (its single-device reduce buffer is the input itself). One
        engine call per flat view: ``grad[:] = v`` costs ~100 us of Python per array under the
        interpreter lock, which for 1000 small arrays made this refill most of a worker's CPU,
        and MXNet fills an n-d array row by row of its last axis."""
        set_value = mx.nd._internal._set_value
        for flat in self.flat:
            set_value(src=self.rank + 1, out=flat)
        mx.nd.waitall()


def one_iteration(kv, grads, outs, mode: str) -> float:
    """Pushpull every tensor, front tensors first in priority; wait for all. Returns seconds."""
    grads.refill()
    started = time.perf_counter()
    if mode == Mode.PUSHPULL:
        for i, (grad, out) in enumerate(zip(grads, outs)):
            kv.pushpull(i, grad, out=out, priority=-i)
    else:
        for i, grad in enumerate(grads):
            kv.push(i, grad, priority=-i)
        for i, out in enumerate(outs):
            kv.pull(i, out=out, priority=-i)
    mx.nd.waitall()
    return time.perf_counter() - started


def check_sums(kv, grads, outs, mode: str, compression=None, rounds: int = 0) -> dict:
    """One iteration from zeroed outputs; every element must be the sum of (rank + 1), or
    under ``compression`` what :func:`compressed_sums` says after ``rounds`` rounds."""
    for out in outs:
        out[:] = 0
    one_iteration(kv, grads, outs, mode)
    workers = kv.num_workers
    expected = workers * (workers + 1) / 2.0
    if compression is None:
        wrong = [i for i, out in enumerate(outs) if not np.all(out.asnumpy() == expected)]
        first = None if not wrong else float(outs[wrong[0]].asnumpy().reshape(-1)[0])
        return {"expected": expected, "wrong_tensors": len(wrong), "first_wrong_value": first}
    if kv.rank != 0:
        return {"expected": "checked by rank 0", "wrong_tensors": 0, "first_wrong_value": None}
    wrong, first, want = [], None, None
    for i, (out, sim) in enumerate(zip(outs, compressed_sums(kv, outs, compression, rounds))):
        got = out.asnumpy().reshape(-1)
        # the server sums in arrival order: equal up to float rounding
        if not np.allclose(got, sim, rtol=1e-5, atol=1e-5):
            wrong.append(i)
            if first is None:
                at = int(np.flatnonzero(~np.isclose(got, sim, rtol=1e-5, atol=1e-5))[0])
                first, want = float(got[at]), float(sim[at])
    return {"expected": want if wrong else "the simulated compression", "compressed": True,
            "wrong_tensors": len(wrong), "first_wrong_value": first}


def compressed_sums(kv, outs, params, rounds: int):
    """Per tensor, what the last of ``rounds`` rounds must return: each partition the engine
    compresses goes through every rank's compressor (input ``rank + 1`` each round: seeds,
    error feedback and momentum evolve as on the workers) and the server's; the rest is the
    exact sum. Untimed."""
    from kvstore_byteps.compress.params import parse_compression_params
    from kvstore_byteps.compress.state import PartitionCompressor, server_side
    spec = parse_compression_params(params)
    workers = kv.num_workers
    for key, out in enumerate(outs):
        flat = np.full(int(np.prod(out.shape)), workers * (workers + 1) / 2.0, np.float32)
        for slot in kv._engine.layout(key, out.shape, np.float32).partitions:
            if slot.nbytes < spec.min_compress_bytes:
                continue
            n = slot.nbytes // 4
            ranks = [PartitionCompressor(spec, salt=slot.ps_key) for _ in range(workers)]
            server = PartitionCompressor(server_side(spec), salt=slot.ps_key)
            for r in range(rounds):
                total = np.zeros(n, np.float32)
                for rank, part in enumerate(ranks):
                    x = np.full(n, rank + 1, np.float32)
                    total += part.decode(part.encode(x, r), n, r)
                result = server.decode(server.encode(total, r), n, r)
            flat[slot.offset // 4:slot.offset // 4 + n] = result
        yield flat


def store_flavor(kv) -> str:
    """What the store talked to: ``byteps``/``mxnet`` servers for dist_byteps, else its type."""
    engine = getattr(kv, "_engine", None)
    dialect = getattr(engine, "dialect", None)
    return dialect.kind.value if dialect is not None else kv.type


def main(argv=None) -> int:
    args = parse_args(argv)
    with open(args.shapes) as f:
        shapes = [tuple(s) for s in json.load(f)]
    kv = mx.kv.create(args.kvstore)
    if args.compression:
        kv.set_gradient_compression(json.loads(args.compression))
    rank = kv.rank
    grads = Inputs(shapes, rank)
    outs = [mx.nd.zeros(s, dtype=np.float32) for s in shapes]
    started = time.perf_counter()
    for i, out in enumerate(outs):
        kv.init(i, out)
    mx.nd.waitall()
    init_s = time.perf_counter() - started
    for _ in range(args.warmup):
        one_iteration(kv, grads, outs, args.mode)
    kv._barrier()           # every worker starts the timed iterations together
    cpu_before = os.times()
    times = [one_iteration(kv, grads, outs, args.mode) for _ in range(args.iters)]
    cpu_after = os.times()
    compression = json.loads(args.compression) if args.compression else None
    check = check_sums(kv, grads, outs, args.mode, compression, args.warmup + args.iters + 1)
    result = {"rank": rank, "workers": kv.num_workers, "kvstore": args.kvstore,
              "flavor": store_flavor(kv), "mode": args.mode, "init_s": init_s,
              "times_s": times, "check": check,
              # this process's CPU per timed iteration (the untimed refill included): on a
              # machine whose cores are all busy, CPU per step is what sets the speed
              "cpu_user_s": (cpu_after.user - cpu_before.user) / max(args.iters, 1),
              "cpu_system_s": (cpu_after.system - cpu_before.system) / max(args.iters, 1),
              "bytes": int(sum(int(np.prod(s)) for s in shapes) * 4)}
    print(RESULT_TAG + json.dumps(result), flush=True)
    kv._barrier()
    return EXIT_WRONG_SUM if check["wrong_tensors"] else 0


if __name__ == "__main__":
    sys.exit(main())
