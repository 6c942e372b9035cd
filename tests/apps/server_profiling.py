"""MXNet's own dist_sync worker profiling the servers, as MXNet's nightly test does it:
``set_config(filename=..., profile_process='server')``, run, ten rounds of push and pull of a
key larger than MXNET_KVSTORE_BIGARRAY_BOUND with SGD on the servers, stop. Prints PROFILED."""
import mxnet as mx

SHAPE = (1200, 1200)

kv = mx.kv.create("dist_sync")           # also hands the profiler the store's handle
mx.profiler.set_config(filename="server_profile.json", profile_all=True,
                       profile_process="server")
mx.profiler.set_state(state="run", profile_process="server")
kv.init("99", mx.nd.ones(SHAPE))
kv.set_optimizer(mx.optimizer.create("sgd"))
for _ in range(10):
    kv.push("99", mx.nd.ones(SHAPE) * (kv.rank + 1))
    out = mx.nd.zeros(SHAPE)
    kv.pull("99", out=out)
    mx.nd.waitall()
mx.profiler.set_state(state="stop", profile_process="server")
print("PROFILED rank %d" % kv.rank, flush=True)
