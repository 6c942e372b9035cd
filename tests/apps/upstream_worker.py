"""An unmodified MXNet dist_sync worker: push (rank+1)*ones, pull, check the sum over workers."""
import sys
import time

import mxnet as mx
import numpy as np

keys = [int(k) for k in (sys.argv[1] if len(sys.argv) > 1 else "3").split(",")]
elems = int(sys.argv[2]) if len(sys.argv) > 2 else 100
pause = float(sys.argv[3]) if len(sys.argv) > 3 else 0.0
kv = mx.kv.create("dist_sync")
rank, nw = kv.rank, kv.num_workers
kv.init(keys, [mx.nd.zeros((elems,)) for _ in keys])
expected = sum(r + 1 for r in range(nw))
for round_index in range(3):
    kv.push(keys, [mx.nd.ones((elems,)) * (rank + 1) for _ in keys])
    outs = [mx.nd.zeros((elems,)) for _ in keys]
    kv.pull(keys, out=outs)
    for key, out in zip(keys, outs):
        if not np.all(out.asnumpy() == expected):
            print("WRONG rank %d round %d key %d: %s" % (rank, round_index, key, out.asnumpy()[:4]))
            sys.exit(1)
    print("rank %d round %d ok sum %s" % (rank, round_index, expected), flush=True)
    time.sleep(pause)
