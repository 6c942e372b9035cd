"""A worker profiling the servers, as MXNet's nightly test does it: ``set_config(filename=...,
profile_process='server')``, run, ten rounds of push and pull of a key larger than
MXNET_KVSTORE_BIGARRAY_BOUND, stop. Prints PROFILED.

    server_profiling.py [dist_sync|dist_byteps]

dist_sync (the default): MXNet's own worker, with SGD on the servers. dist_byteps: ours, whose
servers sum (no optimizer there); the profiler's server commands go through it."""
import sys

import mxnet as mx

SHAPE = (1200, 1200)

kvstore = sys.argv[1] if len(sys.argv) > 1 else "dist_sync"
kv = mx.kv.create(kvstore)               # also makes the store the profiler's
mx.profiler.set_config(filename="server_profile.json", profile_all=True,
                       profile_process="server")
mx.profiler.set_state(state="run", profile_process="server")
kv.init("99", mx.nd.ones(SHAPE))
if kvstore == "dist_sync":
    kv.set_optimizer(mx.optimizer.create("sgd"))
for _ in range(10):
    kv.push("99", mx.nd.ones(SHAPE) * (kv.rank + 1))
    out = mx.nd.zeros(SHAPE)
    kv.pull("99", out=out)
    mx.nd.waitall()
mx.profiler.set_state(state="stop", profile_process="server")
print("PROFILED rank %d" % kv.rank, flush=True)
