"""Asynchronous training (BYTEPS_ENABLE_ASYNC=1) is refused, before anything joins a job, where
it has no meaning: Horovod's API (an allreduce is a sum over every process), several BytePS
processes per host, a broadcast from another rank than 0, float16 multi-precision weights in
BytePS's DistributedOptimizer."""
import mxnet as mx
import pytest

from mxnet_patch.collective import Collective


@pytest.fixture
def asynchronous(monkeypatch):
    monkeypatch.setenv("BYTEPS_ENABLE_ASYNC", "1")


def test_horovod_init_refuses_async(asynchronous):
    import kvstore_byteps.horovod as hvd
    with pytest.raises(NotImplementedError, match="BYTEPS_ENABLE_ASYNC"):
        hvd.init()


def test_several_processes_per_host_refuse_async(asynchronous, monkeypatch):
    monkeypatch.setenv("BYTEPS_LOCAL_SIZE", "2")
    monkeypatch.setenv("BYTEPS_LOCAL_RANK", "1")
    with pytest.raises(ValueError, match="one process per host"):
        Collective().start()


def test_trainer_broadcast_from_another_rank_is_refused(asynchronous):
    import kvstore_byteps.mxnet as bps
    net = mx.gluon.nn.Dense(2, in_units=2)
    net.initialize()
    with pytest.raises(ValueError, match="root_rank=1"):
        bps.DistributedTrainer(net.collect_params(), "sgd", root_rank=1)


def test_optimizer_refuses_float16_multi_precision(asynchronous):
    import kvstore_byteps.mxnet as bps
    optimizer = bps.DistributedOptimizer(mx.optimizer.SGD(multi_precision=True))
    weight = mx.nd.ones((2,), dtype="float16")
    state = optimizer.create_state_multi_precision(0, weight)
    with pytest.raises(NotImplementedError, match="multi_precision"):
        optimizer.update_multi_precision(0, weight, mx.nd.ones((2,), dtype="float16"), state)
