"""Tests of mxnet_patch.engine_async against MXNet 1.9.1's real dependency engine."""
import threading
import types
import time

import numpy as np
import pytest


mx = pytest.importorskip("mxnet")
from mxnet_patch import engine_async  # noqa: E402  (needs mxnet)
from kvstore_byteps.errors import PeerError  # noqa: E402

pytestmark = pytest.mark.timeout(60)


WAIT_S = 10.0


def write_later(target, value, gate=None, log=None, label=None):
    """An fn for push_async that fills ``target`` from another thread, after ``gate``."""
    def fn(done):
        def work():
            if gate is not None and not gate.wait(WAIT_S):
                done(TimeoutError("test gate never opened"))
                return
            if log is not None:
                log.append(label)
            engine_async.host_view(target)[...] = value
            done()
        threading.Thread(target=work).start()
    return fn


def test_push_returns_at_once_and_reading_waits_for_done():
    out = mx.nd.zeros((4,))
    gate = threading.Event()
    engine_async.push_async(write_later(out, 42.0, gate), mutable_arrays=[out])
    # We got here while the operation cannot finish: push_async did not wait for it.
    dependent = out + 1
    threading.Timer(0.05, gate.set).start()
    np.testing.assert_array_equal(dependent.asnumpy(), np.full(4, 43.0, dtype=np.float32))
    np.testing.assert_array_equal(out.asnumpy(), np.full(4, 42.0, dtype=np.float32))


def test_operations_on_the_same_arrays_run_in_push_order():
    source = mx.nd.ones((3,)) * 3          # produced by an MXNet operator, asynchronously
    out, copy = mx.nd.zeros((3,)), mx.nd.zeros((3,))
    log = []

    def add_one(done):
        def work():
            log.append("reader")
            engine_async.host_view(copy)[...] = engine_async.host_view(out) + 1
            done()
        threading.Thread(target=work).start()

    def slow_write(done):
        def work():
            time.sleep(0.1)
            log.append("writer")
            engine_async.host_view(out)[...] = engine_async.host_view(source) * 2
            done()
        threading.Thread(target=work).start()

    engine_async.push_async(slow_write, const_arrays=[source], mutable_arrays=[out])
    engine_async.push_async(add_one, const_arrays=[out], mutable_arrays=[copy])
    np.testing.assert_array_equal(copy.asnumpy(), np.full(3, 7.0, dtype=np.float32))
    assert log == ["writer", "reader"]


def test_error_passed_to_done_raises_when_the_output_is_read():
    assert engine_async.engine_errors_supported()
    out = mx.nd.zeros((2,))
    engine_async.push_async(lambda done: threading.Thread(
        target=done, args=(ValueError("server 3 refused key 7"),)).start(),
        mutable_arrays=[out])
    with pytest.raises(ValueError, match="server 3 refused key 7"):   # MXNet maps the type
        out.asnumpy()
    out.asnumpy()   # MXNet reports an operator's error once, then the array is usable again


def test_our_error_classes_keep_their_type_and_notes():
    error = PeerError("server 8 lost")
    if hasattr(error, "add_note"):
        error.add_note("in kvstore-byteps stage PULL (key 3 partition 0)")
    out = mx.nd.zeros((2,))
    engine_async.push_async(lambda done: done(error), mutable_arrays=[out])
    with pytest.raises(PeerError, match="server 8 lost") as caught:
        out.wait_to_read()
    if hasattr(error, "add_note"):
        assert "stage PULL (key 3 partition 0)" in str(caught.value)


def test_exception_raised_by_fn_reaches_readers_of_dependents():
    out = mx.nd.zeros((2,))

    def broken(done):
        raise KeyError("no partition plan")

    engine_async.push_async(broken, mutable_arrays=[out], inline=True)
    with pytest.raises(mx.base.MXNetError, match="KeyError: 'no partition plan'"):
        (out * 2).asnumpy()


def test_done_twice_is_ignored_and_many_threads_may_push():
    arrays = [mx.nd.zeros((8,)) for _ in range(40)]

    def twice(target, value):
        def fn(done):
            engine_async.host_view(target)[...] = value
            done()
            done(RuntimeError("second call must be ignored"))
        return fn

    def pusher(offset):
        for index in range(offset, len(arrays), 4):
            engine_async.push_async(twice(arrays[index], index), mutable_arrays=[arrays[index]])

    threads = [threading.Thread(target=pusher, args=(offset,)) for offset in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(WAIT_S)
    for index, array in enumerate(arrays):
        np.testing.assert_array_equal(array.asnumpy(), np.full(8, index, dtype=np.float32))


def test_host_view_rejects_sparse_arrays_and_other_objects():
    with pytest.raises(ValueError, match="dense"):
        engine_async.host_view(mx.nd.sparse.zeros("row_sparse", (2, 2)))
    with pytest.raises(TypeError, match="NDArray"):
        engine_async.push_async(lambda done: done(), mutable_arrays=[np.zeros(2)])


def test_engine_threads_keep_their_python_thread_state_between_operations():
    """An inline fn runs on an MXNet engine thread inside our ctypes callback; its thread
    state (and so a threading.local) must survive from one operation to the next on that
    thread, not be made anew per callback (that cost about 20 us of CPU per operation)."""
    local = threading.local()
    seen = []                       # (native thread id, the local's token) per operation
    tokens_made = iter(range(10**6))

    def fn(done):
        if not hasattr(local, "token"):
            local.token = next(tokens_made)
        seen.append((threading.get_native_id(), local.token))
        done()
    outs = [mx.nd.zeros((2,)) for _ in range(200)]
    for out in outs:
        engine_async.push_async(fn, mutable_arrays=[out], inline=True)
    mx.nd.waitall()
    assert len(seen) == len(outs)
    tokens = {}
    for native_id, token in seen:
        tokens.setdefault(native_id, set()).add(token)
    assert any(len([s for s in seen if s[0] == tid]) > 1 for tid in tokens), \
        "no engine thread ran two operations: the test shows nothing"
    assert all(len(t) == 1 for t in tokens.values()), \
        "an engine thread got a new Python thread state per operation: %s" % {
            tid: len(t) for tid, t in tokens.items()}


def test_pipeline_task_runs_as_an_engine_operation():
    """The shape of dist_byteps' pushpull: an engine op whose work is a pipeline task."""
    from kvstore_byteps.engine import reduce
    from kvstore_byteps.engine.partition import plan_partitions
    from kvstore_byteps.engine.stage_specs import Stage, StageSpec
    from kvstore_byteps.engine.stages import Pipeline, Task

    def reduce_and_push(item):   # local reduce, then "the other worker" pushed the same
        part, ctx = item.partition, item.task.context
        views = [reduce.flat_view(engine_async.host_view(a), part.offset, part.nbytes)
                 for a in ctx.inputs]
        host = reduce.flat_view(ctx.host, part.offset, part.nbytes)
        reduce.cpu_sum(views, host)
        host[...] *= 2

    def pull_and_broadcast(item):
        part, ctx = item.partition, item.task.context
        source = reduce.flat_view(ctx.host, part.offset, part.nbytes)
        for out in ctx.outputs:
            np.copyto(reduce.flat_view(engine_async.host_view(out), part.offset, part.nbytes),
                      source)

    stages = [StageSpec(Stage.PUSH, reduce_and_push), StageSpec(Stage.PULL, pull_and_broadcast)]
    grads = [mx.nd.arange(0, 1000) * (device + 1) for device in range(2)]
    outs = [mx.nd.zeros((1000,)) for _ in range(2)]
    plan = plan_partitions(3, 4000, 4, 2, partition_bytes=1024)
    with Pipeline(stages, credit=2) as pipeline:
        task = Task(3, plan.partitions, priority=-3,
                    context=types.SimpleNamespace(inputs=grads, outputs=outs,
                                                  host=np.empty(1000, dtype=np.float32)))

        def start(done):
            pipeline.submit(task).add_done_callback(lambda future: done(future.exception()))

        engine_async.push_async(start, const_arrays=grads, mutable_arrays=outs, priority=-3)
        expected = np.arange(0, 1000, dtype=np.float32) * 6
        for out in outs:
            np.testing.assert_array_equal(out.asnumpy(), expected)


def test_operands_made_once_order_every_push_on_their_arrays():
    # a key's pushpull pushes the same operands every step: each push still waits for the
    # writer before it and holds back the readers after it
    source, out = mx.nd.zeros((4,)), mx.nd.zeros((4,))
    operands = engine_async.Operands([source], [out], "twice")
    seen = []
    for step in range(1, 4):
        source[:] = step                       # an MXNet write the operation must wait for
        gate = threading.Event()

        def add(done, gate=gate):
            def work():
                if not gate.wait(WAIT_S):
                    done(TimeoutError("test gate never opened"))
                    return
                view = engine_async.host_view(out)
                view += engine_async.host_view(source)
                done()
            threading.Thread(target=work).start()
        engine_async.push_prepared(add, operands)
        threading.Timer(0.02, gate.set).start()
        seen.append(float((out * 1).asnumpy()[0]))     # waits for this step's operation
    assert seen == [1.0, 3.0, 6.0]
    with pytest.raises(TypeError, match="NDArrays"):
        engine_async.Operands([np.zeros(4)], [out])
