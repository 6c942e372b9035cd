"""A pushpull's done-callback (engine/rounds.py's _Finished): whatever fails while finishing a
task, the engine operation hears it; it is never left pending (a silent hang)."""
from kvstore_byteps.engine.rounds import _Finished
from kvstore_byteps.future import Future


class Engine:
    def __init__(self, fail):
        self.fail, self.seen = fail, []

    def _task_finished(self, error, on_done):
        if self.fail:
            raise TypeError("broken")
        on_done(error)


def test_the_operation_hears_the_tasks_outcome():
    got, future = [], Future()
    future.add_done_callback(_Finished(Engine(fail=False)._task_finished, got.append))
    future.set_result(None)
    assert got == [None]


def test_a_failure_while_finishing_completes_the_operation_with_it(caplog):
    got, future = [], Future()
    future.add_done_callback(_Finished(Engine(fail=True)._task_finished, got.append))
    future.set_result(None)
    assert len(got) == 1 and isinstance(got[0], TypeError)
    assert "finishing a pushpull failed" in caplog.text
