"""The BytePS and Horovod APIs checked from inside a worker: ``dropin_checks.py MODE``.

bps        import kvstore_byteps.mxnet as bps: push_pull of f16/f32/f64 tensors of 1-3
           dimensions (sum and average, every rank different data, names declared in a
           different order on every rank); broadcast_parameters from the last rank;
           DistributedTrainer's first-step broadcast whatever order the layers were added in.
           Prints "BPS OK".
bps-train  bps.DistributedTrainer (parameters different on every rank before its first step)
           equal to one process training on the union of all ranks' batches; prints
           "BPS TRAIN OK" and ends without shutdown() (the exit must still be clean). A mode
           of its own: BytePS names a trainer's tensors by index, so two trainers of one
           process would share names.
hvd        import kvstore_byteps.horovod as hvd: allreduce Average/Sum with pre- and
           post-scaling, in place and not, grouped; broadcast from the last rank;
           broadcast_parameters of a ParameterDict with deferred initialisation; the refused
           operations; DistributedTrainer (after broadcast_parameters) equal to one process on
           the union batch. Prints "HVD OK".
"""
import itertools
import sys

import mxnet as mx
import numpy as np

DTYPES = ["float16", "float32", "float64"]
SHAPES = [(17,), (17, 17), (5, 6, 7)]
TOLERANCE = {"float16": 1e-2, "float32": 1e-5, "float64": 1e-12}


def tensor_of(rank, index, shape, dtype):
    """What ``rank`` contributes to tensor ``index`` (every rank can compute everyone's)."""
    rng = np.random.default_rng([rank, index])
    return rng.uniform(-10, 10, size=shape).astype(dtype)


def cases():
    return list(enumerate(itertools.product(DTYPES, SHAPES)))


def expected_sum(size, index, shape, dtype):
    return sum(tensor_of(r, index, shape, dtype).astype(np.float64) for r in range(size))


def close(got, want, dtype, what):
    np.testing.assert_allclose(got.astype(np.float64), want, rtol=TOLERANCE[dtype],
                               atol=TOLERANCE[dtype] * 10, err_msg=what)


def dataset(size):
    rng = np.random.default_rng(7)
    data = rng.standard_normal((8 * size, 5)).astype(np.float32)
    label = rng.standard_normal((8 * size, 3)).astype(np.float32)
    return data, label


def net_with(seed):
    mx.random.seed(seed)
    net = mx.gluon.nn.Dense(3, in_units=5)
    net.initialize(mx.init.Uniform(1.0))
    return net


def train(net, trainer, data, label, steps=3):
    loss = mx.gluon.loss.L2Loss()
    for _ in range(steps):
        with mx.autograd.record():
            out = loss(net(mx.nd.array(data)), mx.nd.array(label))
        out.backward()
        trainer.step(len(data))
    return [p.data().asnumpy() for p in net.collect_params().values()]


def check_union_batch(make_trainer, rank, size, seed):
    """Distributed training on this rank's share equals one process on the whole batch.
    ``seed``: of this rank's initial weights (rank 0's are the reference's)."""
    data, label = dataset(size)
    share = slice(rank * 8, (rank + 1) * 8)
    net = net_with(seed)
    got = train(net, make_trainer(net.collect_params()), data[share], label[share])
    reference = net_with(seed=100)            # rank 0's initial weights
    want = train(reference, mx.gluon.Trainer(reference.collect_params(), "sgd",
                                             {"learning_rate": 0.1}, kvstore=None),
                 data, label)
    for index, (mine, theirs) in enumerate(zip(got, want)):
        np.testing.assert_allclose(mine, theirs, rtol=1e-5, atol=1e-6,
                                   err_msg="parameter %d after 3 steps" % index)


def check_bps():
    import kvstore_byteps.mxnet as bps
    bps.init()
    rank, size = bps.rank(), bps.size()
    # every push_pull is issued before any result is read: a result needs every rank's
    # push, and the ranks issue them in different orders
    order = cases() if rank % 2 == 0 else list(reversed(cases()))
    issued = []
    for index, (dtype, shape) in order:
        for average in (False, True):
            name = "tensor_%d_%s" % (index, average)
            bps.byteps_declare_tensor(name)
            tensor = mx.nd.array(tensor_of(rank, index, shape, dtype), dtype=dtype)
            bps.byteps_push_pull(tensor, name=name, is_average=average)
            want = expected_sum(size, index, shape, dtype) / (size if average else 1)
            issued.append((tensor, want, dtype, name))
    for tensor, want, dtype, name in issued:
        close(tensor.asnumpy(), want, dtype, name)
    root = size - 1
    params = {"b": mx.nd.ones((4,)) * (rank + 1), "a": mx.nd.ones((2, 3)) * (rank + 5)}
    bps.broadcast_parameters(params, root_rank=root)
    assert np.all(params["b"].asnumpy() == root + 1) and np.all(params["a"].asnumpy() == root + 5)
    # layers added in a different order on every rank: the broadcast still pairs them by name
    net = mx.gluon.nn.Sequential()
    layers = [("ones_", 1), ("zeros_", 0)]
    for prefix, value in (layers if rank % 2 == 0 else layers[::-1]):
        net.add(mx.gluon.nn.Dense(4, in_units=4, use_bias=False, prefix=prefix,
                                  weight_initializer=mx.init.Constant(value + rank)))
    params = net.collect_params()
    net.initialize()
    trainer = bps.DistributedTrainer(params, "sgd")
    trainer._init_params()
    for prefix, value in layers:
        weight = params[prefix + "weight"].data().asnumpy()
        assert np.all(weight == value), (prefix, weight)
    print("BPS OK", flush=True)


def check_bps_training():
    import kvstore_byteps.mxnet as bps
    bps.init()
    # BytePS's trainer broadcasts at its first step, after that step's gradients were
    # computed: equal initial weights (as BytePS scripts seed them), so the sum is exact
    check_union_batch(lambda p: bps.DistributedTrainer(p, "sgd", {"learning_rate": 0.1}),
                      bps.rank(), bps.size(), seed=100)
    print("BPS TRAIN OK", flush=True)


def check_hvd():
    import kvstore_byteps.horovod as hvd
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    assert hvd.is_initialized()
    for index, (dtype, shape) in cases():
        data = tensor_of(rank, index, shape, dtype)
        total = expected_sum(size, index, shape, dtype)
        tensor = mx.nd.array(data, dtype=dtype)
        averaged = hvd.allreduce(tensor, name="avg_%d" % index)
        summed = hvd.allreduce(tensor, op=hvd.Sum, name="sum_%d" % index,
                               prescale_factor=2.0, postscale_factor=0.5)
        close(averaged.asnumpy(), total / size, dtype, "average %d" % index)
        close(summed.asnumpy(), total, dtype, "scaled sum %d" % index)
        close(tensor.asnumpy(), data.astype(np.float64), dtype, "allreduce changed its input")
        hvd.allreduce_(tensor, average=False, name="inplace_%d" % index)
        close(tensor.asnumpy(), total, dtype, "in place %d" % index)
    group = [mx.nd.ones((3,)) * (rank + 1), mx.nd.ones((2, 2)) * (rank + 2)]
    hvd.grouped_allreduce_(group, op=hvd.Sum, name="group")
    assert np.all(group[0].asnumpy() == sum(r + 1 for r in range(size)))
    assert np.all(group[1].asnumpy() == sum(r + 2 for r in range(size)))
    root = size - 1
    sent = mx.nd.ones((5,)) * (rank + 3)
    got = hvd.broadcast(sent, root_rank=root, name="bcast")
    assert np.all(got.asnumpy() == root + 3) and np.all(sent.asnumpy() == rank + 3)
    net = mx.gluon.nn.Dense(3)                   # in_units unknown: initialisation deferred
    net.initialize(mx.init.Constant(rank + 1))
    hvd.broadcast_parameters(net.collect_params(), root_rank=root)
    net(mx.nd.ones((2, 4)))                      # initialises, then broadcasts
    for name, param in net.collect_params().items():     # (biases start at zero anyway)
        want = root + 1 if name.endswith("weight") else 0
        assert np.all(param.data().asnumpy() == want), (name, param.data())
    for refused in (lambda: hvd.allgather(sent), lambda: hvd.allreduce(sent, op=hvd.Max),
                    lambda: hvd.reducescatter(sent)):
        try:
            refused()
        except (NotImplementedError, ValueError) as exc:
            assert "parameter server" in str(exc), exc
        else:
            raise AssertionError("not refused")
    def trainer(params):
        hvd.broadcast_parameters(params, root_rank=0)
        return hvd.DistributedTrainer(params, "sgd", {"learning_rate": 0.1})
    check_union_batch(trainer, rank, size, seed=100 + rank)
    print("HVD OK", flush=True)


if __name__ == "__main__":
    {"bps": check_bps, "bps-train": check_bps_training, "hvd": check_hvd}[sys.argv[1]]()
