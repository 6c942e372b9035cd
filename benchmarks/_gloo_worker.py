"""One rank of the all-reduce anchor of ``bench_pushpull.py``: torch.distributed gloo.

    python benchmarks/_gloo_worker.py --master 127.0.0.1:29500 --rank 0 --world 2 \
        --shapes shapes.json --iters 10 --warmup 2

Every rank fills one tensor per shape with ``rank + 1`` and times iterations of "``all_reduce``
every tensor, in order" (gloo's ring all-reduce on CPU tensors, synchronous), the same work as
one push/pull iteration of the benchmark. One more iteration checks that every element holds
``W * (W + 1) / 2``. Prints ``GLOO_RESULT {json}``; exits 3 on a wrong sum.
"""
import argparse
import json
import sys
import time

RESULT_TAG = "GLOO_RESULT "
EXIT_WRONG_SUM = 3


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--master", required=True, help="host:port of rank 0")
    p.add_argument("--rank", type=int, required=True)
    p.add_argument("--world", type=int, required=True)
    p.add_argument("--shapes", required=True)
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--warmup", type=int, default=2)
    args = p.parse_args(argv)
    import torch
    import torch.distributed as dist
    dist.init_process_group("gloo", init_method="tcp://" + args.master, rank=args.rank,
                            world_size=args.world)
    with open(args.shapes) as f:
        shapes = [tuple(s) for s in json.load(f)]
    tensors = [torch.empty(shape, dtype=torch.float32) for shape in shapes]

    def iteration() -> float:
        for t in tensors:
            t.fill_(args.rank + 1)
        dist.barrier()
        started = time.perf_counter()
        for t in tensors:
            dist.all_reduce(t)
        return time.perf_counter() - started

    for _ in range(args.warmup):
        iteration()
    times = [iteration() for _ in range(args.iters)]
    iteration()
    expected = args.world * (args.world + 1) / 2
    wrong = sum(1 for t in tensors if not bool(torch.all(t == expected)))
    print(RESULT_TAG + json.dumps({"rank": args.rank, "times_s": times,
                                   "wrong_tensors": wrong, "expected": expected}), flush=True)
    dist.destroy_process_group()
    return EXIT_WRONG_SUM if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
