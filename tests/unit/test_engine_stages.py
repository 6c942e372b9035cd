"""Tests of the one-loop-per-stage pipeline with fake stage functions (threads, no network)."""
import gc
import sys
import threading
import time
import weakref

import pytest

from kvstore_byteps.engine.stage_specs import Stage, StageSpec
from kvstore_byteps.engine.stages import Pipeline, PipelineClosedError, Task
from kvstore_byteps.engine.trace import Tracer
from kvstore_byteps.errors import DeadlineError

pytestmark = pytest.mark.timeout(30)
WAIT_S = 10.0


def recorder(stage, log):
    def fn(item):
        log.append((stage, item.key, item.index))
    return fn


def test_every_partition_passes_every_stage_in_order():
    log = []
    stages = [StageSpec(stage, recorder(stage, log)) for stage in Stage]
    with Pipeline(stages, credit=2) as pipeline:
        task = Task(7, ["p0", "p1", "p2"], context="what the stages need")
        assert pipeline.submit(task).result(WAIT_S) is None
        assert pipeline.pending() == 0
    for index in range(3):
        assert [entry[0] for entry in log if entry[2] == index] == list(Stage)
    assert len(log) == 3 * len(Stage)


def test_asynchronous_stage_completes_from_another_thread():
    timers = []

    def push_later(item, done):
        timer = threading.Timer(0.01, done)
        timers.append(timer)
        timer.start()

    stages = [StageSpec(Stage.PUSH, push_later, asynchronous=True),
              StageSpec(Stage.PULL, lambda item: None)]
    with Pipeline(stages, credit=1) as pipeline:
        futures = [pipeline.submit(Task(key, [0, 1])) for key in range(3)]
        for future in futures:
            future.result(WAIT_S)
    for timer in timers:
        timer.join(WAIT_S)


def failing_at(stage, bad_key, bad_index):
    def fn(item):
        if (item.key, item.index) == (bad_key, bad_index):
            raise ValueError("fake %s failure" % stage.name)
    return fn


def test_stage_error_reaches_the_future_and_other_tasks_go_on():
    stages = [StageSpec(Stage.PUSH, failing_at(Stage.PUSH, 5, 1)),
              StageSpec(Stage.PULL, lambda item: None)]
    with Pipeline(stages, credit=1) as pipeline:
        bad = pipeline.submit(Task(5, range(4)))
        good = [pipeline.submit(Task(key, range(3))) for key in (6, 7)]
        error = bad.exception(WAIT_S)
        assert isinstance(error, ValueError) and "fake PUSH failure" in str(error)
        if sys.version_info >= (3, 11):
            assert "stage PUSH (key 5 partition 1)" in "".join(error.__notes__)
        for future in good:   # credit of the failed partition was given back
            future.result(WAIT_S)


def test_error_passed_to_done_reaches_the_future():
    def pull(item, done):
        threading.Thread(target=done, args=(ConnectionError("server 8 lost"),)).start()

    stages = [StageSpec(Stage.PUSH, lambda item: None),
              StageSpec(Stage.PULL, pull, asynchronous=True)]
    with Pipeline(stages, credit=2) as pipeline:
        error = pipeline.submit(Task(1, [0, 1, 2])).exception(WAIT_S)
    assert isinstance(error, ConnectionError) and "server 8 lost" in str(error)


def test_higher_priority_task_overtakes_under_credit_contention():
    entered, gate = threading.Event(), threading.Event()

    def push(item):
        if (item.key, item.index) == (9, 0):
            entered.set()
            assert gate.wait(WAIT_S), "test gate never opened"

    tracer = Tracer(enabled=True)
    stages = [StageSpec(Stage.PUSH, push), StageSpec(Stage.PULL, lambda item: None)]
    with Pipeline(stages, credit=1, tracer=tracer) as pipeline:
        back = pipeline.submit(Task(9, range(3), priority=-9))       # back layer first
        assert entered.wait(WAIT_S)
        front = pipeline.submit(Task(0, range(2), priority=0))       # front layer later
        gate.set()
        back.result(WAIT_S), front.result(WAIT_S)
    pushes = sorted((e for e in tracer.events() if e.stage is Stage.PUSH),
                    key=lambda e: e.start_ns)
    assert [(e.key, e.part) for e in pushes] == [(9, 0), (0, 0), (0, 1), (9, 1), (9, 2)]


def test_credit_bounds_partitions_between_push_and_pull():
    lock, state = threading.Lock(), {"inside": 0, "most": 0}
    timers = []

    def push(item, done):
        with lock:
            state["inside"] += 1
            state["most"] = max(state["most"], state["inside"])
        timer = threading.Timer(0.005, done)
        timers.append(timer)
        timer.start()

    def pull(item):
        with lock:
            state["inside"] -= 1

    stages = [StageSpec(Stage.PUSH, push, asynchronous=True), StageSpec(Stage.PULL, pull)]
    with Pipeline(stages, credit=2) as pipeline:
        for future in [pipeline.submit(Task(key, range(5))) for key in range(4)]:
            future.result(WAIT_S)
    for timer in timers:
        timer.join(WAIT_S)
    assert state["most"] == 2


def test_batch_stage_gets_all_ready_items():
    entered, gate, batches = threading.Event(), threading.Event(), []

    def push(items):
        batches.append([(item.key, item.index) for item in items])
        entered.set()
        assert gate.wait(WAIT_S), "test gate never opened"

    stages = [StageSpec(Stage.PUSH, push, batch=True)]
    with Pipeline(stages) as pipeline:
        first = pipeline.submit(Task(1, [0]))
        assert entered.wait(WAIT_S)
        rest = [pipeline.submit(Task(key, [0, 1])) for key in (2, 3)]
        gate.set()
        for future in [first] + rest:
            future.result(WAIT_S)
    assert batches == [[(1, 0)], [(2, 0), (2, 1), (3, 0), (3, 1)]]


def test_async_batch_items_finished_one_by_one_return_their_credit_at_once():
    # credit 2: a batch of two pushes goes out; finishing only the first lets the next
    # partition in while the second is still outstanding (no waiting for the whole batch)
    batches, held, lock = [], [], threading.Lock()
    second_batch = threading.Event()

    def push(items, done):
        with lock:
            batches.append([item.index for item in items])
            if len(batches) == 2:
                second_batch.set()
        if len(batches) == 1:
            done(None, items[:1])          # the first answer; items[1] stays in flight
            held.append((items[1:], done))
        else:
            done()

    stages = [StageSpec(Stage.PUSH, push, asynchronous=True, batch=True),
              StageSpec(Stage.PULL, lambda item: None)]
    with Pipeline(stages, credit=2) as pipeline:
        future = pipeline.submit(Task(1, [0, 1, 2]))
        assert second_batch.wait(WAIT_S), "the freed credit did not let partition 2 in"
        assert batches == [[0, 1], [2]] and not future.done()
        rest, done = held[0]
        assert done(None, rest) and not done(None, rest)   # each item finishes once
        future.result(WAIT_S)


def test_close_fails_unfinished_tasks_and_refuses_new_ones():
    stages = [StageSpec(Stage.PUSH, lambda item, done: None, asynchronous=True)]
    pipeline = Pipeline(stages)
    stuck = pipeline.submit(Task(3, [0]))
    pipeline.close(timeout=0.2)
    assert isinstance(stuck.exception(WAIT_S), PipelineClosedError)
    with pytest.raises(PipelineClosedError):
        pipeline.submit(Task(4, [0]))
    pipeline.close(timeout=0.1)   # idempotent


def test_close_names_a_stage_thread_that_does_not_stop():
    release = threading.Event()
    stages = [StageSpec(Stage.PUSH, lambda item: release.wait(WAIT_S))]
    pipeline = Pipeline(stages)
    pipeline.submit(Task(1, [0]))
    try:
        with pytest.raises(DeadlineError, match="PUSH"):
            pipeline.close(timeout=0.2)
    finally:
        release.set()
    pipeline.close(timeout=WAIT_S)


def test_task_runs_once_and_stages_must_be_ordered():
    with Pipeline([StageSpec(Stage.PUSH, lambda item: None)]) as pipeline:
        task = Task(1, [0])
        pipeline.submit(task).result(WAIT_S)
        with pytest.raises(ValueError, match="once"):
            pipeline.submit(task)
    with pytest.raises(ValueError, match="order"):
        Pipeline([StageSpec(Stage.PULL, print), StageSpec(Stage.PUSH, print)])
    with pytest.raises(ValueError, match="credit span"):
        Pipeline([StageSpec(Stage.PUSH, print)], credit=1)
    with pytest.raises(ValueError, match="no partitions"):
        Task(1, [])


def test_async_stage_raising_after_done_is_logged_not_lost(caplog):
    def push(item, done):
        done()
        raise RuntimeError("bug after done")

    with Pipeline([StageSpec(Stage.PUSH, push, asynchronous=True)]) as pipeline:
        assert pipeline.submit(Task(1, [0])).result(WAIT_S) is None
    assert "raised after calling done()" in caplog.text


def test_async_stage_raising_the_error_it_already_reported_logs_nothing(caplog):
    # A push whose send fails: the request's callback finishes the items with the error, then
    # the send raises that same error. The task fails once, with no second traceback.
    def push(item, done):
        error = ConnectionError("van stopped")
        done(error)
        raise error

    with Pipeline([StageSpec(Stage.PUSH, push, asynchronous=True)]) as pipeline:
        with pytest.raises(ConnectionError, match="van stopped"):
            pipeline.submit(Task(1, [0])).result(WAIT_S)
    assert "raised after calling done()" not in caplog.text


def test_a_finished_task_is_freed_by_reference_counting_alone():
    """No reference cycle through a task (its future once held it as the result): with 1000
    small keys a round, the garbage collector's passes over them cost ~15% of a worker's CPU."""
    gc.disable()
    try:
        with Pipeline([StageSpec(Stage.PUSH, lambda item: None),
                       StageSpec(Stage.PULL, lambda items, done: done(), asynchronous=True,
                                 batch=True)]) as pipeline:
            task = Task(1, [0, 1], context=["what the stages need"])
            finished = weakref.ref(task)
            pipeline.submit(task).result(WAIT_S)
            del task
            deadline = time.monotonic() + WAIT_S
            while finished() is not None and time.monotonic() < deadline:
                time.sleep(0.01)    # the stage threads drop their last batch
            assert finished() is None
    finally:
        gc.enable()


def test_inline_items_run_the_stage_on_the_thread_that_finished_the_previous_one():
    """The worker's riding pulls: PULL runs where PUSH's answer finished them, the others
    through PULL's own thread; every item still passes both stages once."""
    timers, seen = [], []

    def push_later(items, done):       # answers come on another thread, as from a van
        timer = threading.Timer(0.01, done)
        timers.append(timer)
        timer.start()

    def pull(items, done):
        seen.extend((item.key, item.index, threading.current_thread().name) for item in items)
        done()

    stages = [StageSpec(Stage.PUSH, push_later, asynchronous=True, batch=True),
              StageSpec(Stage.PULL, pull, asynchronous=True, batch=True,
                        inline=lambda item: item.index % 2 == 0)]
    with Pipeline(stages, credit=4, credit_span=(Stage.PUSH, Stage.PUSH),
                  name="p") as pipeline:
        futures = [pipeline.submit(Task(key, [0, 1, 2])) for key in range(4)]
        for future in futures:
            assert future.result(WAIT_S) is None
    for timer in timers:
        timer.join(WAIT_S)
    assert sorted((key, index) for key, index, _ in seen) == [
        (key, index) for key in range(4) for index in range(3)]
    for key, index, thread in seen:    # inline: on the timer's thread that answered PUSH
        assert (thread == "p-PULL") == (index % 2 == 1), seen


def test_an_inline_stage_failure_fails_its_task_and_other_tasks_go_on():
    def pull(items, done):
        if any(item.key == 1 for item in items):
            raise ValueError("fake inline failure")
        done()

    stages = [StageSpec(Stage.PUSH, lambda items: None, batch=True),
              StageSpec(Stage.PULL, pull, asynchronous=True, batch=True,
                        inline=lambda item: True)]
    with Pipeline(stages, credit=None) as pipeline:
        with pytest.raises(ValueError, match="fake inline failure"):
            pipeline.submit(Task(1, [0])).result(WAIT_S)
        assert pipeline.submit(Task(2, [0])).result(WAIT_S) is None


def test_queued_stages_cannot_run_inline():
    push = StageSpec(Stage.PUSH, lambda item: None, inline=lambda item: True)
    with pytest.raises(ValueError, match="PUSH is queued"):
        Pipeline([push, StageSpec(Stage.PULL, lambda item: None)], credit=1)


def test_returned_credit_runs_the_next_items_on_the_thread_that_returned_it():
    # PUSH with runs_where_credit_returns: a new task wakes the stage's thread; the thread
    # that finishes a push (returning its credit, e.g. the van's receive loop) runs the next
    # ones itself, in priority order, instead of waking the stage's thread for each.
    ran, pending = [], []

    def push(items, done):
        ran.extend((item.key, threading.current_thread().name) for item in items)
        pending.append(done)

    stages = [StageSpec(Stage.PUSH, push, asynchronous=True, batch=True,
                        runs_where_credit_returns=True),
              StageSpec(Stage.PULL, lambda item: None)]
    with Pipeline(stages, credit=1, credit_span=(Stage.PUSH, Stage.PUSH),
                  name="credit") as pipeline:
        futures = [pipeline.submit(Task(1, [0], priority=1))]
        deadline = time.monotonic() + WAIT_S
        while not ran and time.monotonic() < deadline:
            time.sleep(0.001)
        futures += [pipeline.submit(Task(key, [0], priority=key)) for key in (2, 3)]

        def answer():                   # e.g. the van's receive loop
            while (len(ran) < 3 or pending) and time.monotonic() < deadline:
                if pending:
                    pending.pop(0)()
        thread = threading.Thread(target=answer, name="answers")
        thread.start()
        thread.join(WAIT_S)
        for future in futures:
            future.result(WAIT_S)
    assert ran == [(1, "credit-PUSH"), (3, "answers"), (2, "answers")]


def test_a_stage_run_where_credit_returns_does_not_recurse():
    # done() called inside the stage function (a send that failed, or finished, at once)
    # returns credit on the thread running the stage: that thread's loop takes the next
    # items; no nested run, however many wait.
    depth, deepest = [0], [0]

    def push(items, done):
        depth[0] += 1
        deepest[0] = max(deepest[0], depth[0])
        done()
        depth[0] -= 1

    stages = [StageSpec(Stage.PUSH, push, asynchronous=True, batch=True,
                        runs_where_credit_returns=True),
              StageSpec(Stage.PULL, lambda item: None)]
    with Pipeline(stages, credit=1, credit_span=(Stage.PUSH, Stage.PUSH)) as pipeline:
        # 2000 partitions queued at once, credit for one at a time
        pipeline.submit(Task(7, list(range(2000)))).result(WAIT_S)
    assert deepest[0] == 1
