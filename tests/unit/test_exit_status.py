"""The exit status a worker's program asks for (mxnet_patch/exit_status.py) and the one line a
job ended by another node leaves (kvstore_byteps/logs.py). Pure: no sockets, no processes."""
import builtins
import sys
import threading

import pytest

from kvstore_byteps.errors import JobAbortedError, exit_status as node_exit_status

pytestmark = pytest.mark.unit


@pytest.fixture
def recorder(monkeypatch):
    monkeypatch.setattr(sys, "exit", sys.exit)
    for name in ("exit", "quit"):
        if hasattr(builtins, name):
            monkeypatch.setattr(builtins, name, getattr(builtins, name))
    from mxnet_patch import exit_status
    monkeypatch.setattr(exit_status, "_requested", None)
    exit_status.install()
    return exit_status


@pytest.mark.parametrize("argument,status", [(3, 3), (None, 0), (0, 0), ("bad input", 1),
                                              (256 + 7, 7)])
def test_the_status_of_sys_exit_is_recorded_as_python_makes_it(recorder, argument, status):
    assert recorder.requested() is None
    with pytest.raises(SystemExit) as raised:
        sys.exit(argument)
    assert raised.value.code == argument           # sys.exit behaves as before
    assert recorder.requested() == status


def test_the_builtin_exit_too_and_not_an_exit_on_another_thread(recorder):
    with pytest.raises(SystemExit):
        builtins.exit(4)
    assert recorder.requested() == 4
    recorder.install()                              # idempotent
    def on_a_thread():
        try:
            sys.exit(9)                             # ends that thread only
        except SystemExit:
            pass
    thread = threading.Thread(target=on_a_thread)
    thread.start()
    thread.join()
    assert recorder.requested() == 4


def test_a_node_stopped_by_a_job_another_ended_exits_with_its_status():
    assert node_exit_status(RuntimeError("x")) == 1
    assert node_exit_status(JobAbortedError("worker rank 1 ended the job", 3)) == 3
    assert JobAbortedError("x", 0).status == 1 and JobAbortedError("x", 300).status == 1
    again = JobAbortedError("x", 5)
    again.elsewhere = True
    copy = again.again()
    assert (str(copy), copy.status, copy.elsewhere) == ("x", 5, True)


def test_a_job_ended_elsewhere_is_one_line_without_the_engines_additions(capsys, monkeypatch):
    from kvstore_byteps import logs
    monkeypatch.setattr(sys, "excepthook", sys.__excepthook__)
    logs.config_errors_in_one_line()
    error = JobAbortedError("JobAbortedError: worker rank 1 ended the job: why\n"
                            "in kvstore-byteps stage PULL (key 0 partition 0)")
    sys.excepthook(JobAbortedError, error, None)
    assert capsys.readouterr().err == ("[kvstore_byteps] the job was ended: worker rank 1 "
                                       "ended the job: why\n")
