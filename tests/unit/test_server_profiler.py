"""MXNet's server profiling command (kSetProfilerParams) on our server: serving/profiler.py."""
import json

import pytest

from kvstore_byteps.errors import ProtocolError
from kvstore_byteps.serving.profiler import ServerProfiler


def profiler(tmp_path, rank=1):
    p = ServerProfiler(str(tmp_path))
    p.rank = rank
    return p


def test_config_run_stages_stop_writes_rank_prefixed_chrome_trace(tmp_path):
    p = profiler(tmp_path)
    # MXNet's body: its kwargs but profile_process (here last, leaving a comma), then "0"
    p.command(b"filename:prof.json,profile_all:True,0")
    p.record("early", "request", 0, 10)          # not running yet: not recorded
    p.command(b"11")                             # state: run
    timed = p.timed("request", lambda a, b: a + b, lambda a, b: ("push", {"keys": [a]}))
    assert timed(2, 3) == 5
    p.command(b"12")                             # pause
    timed(4, 5)
    p.command(b"02")                             # resume
    timed(6, 7)
    p.command(b"01")                             # state: stop writes the file
    trace = json.loads((tmp_path / "rank1_prof.json").read_text())
    stages = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert [e["args"]["keys"] for e in stages] == [[2], [6]]
    assert all(e["pid"] == "server rank 1" and e["dur"] >= 0 for e in stages)


def test_a_new_config_starts_over_and_exit_writes_what_is_left(tmp_path):
    p = profiler(tmp_path, rank=0)
    (tmp_path / "rank0_p.json").write_text("old")
    p.command(b"filename:p.json0")
    assert not (tmp_path / "rank0_p.json").exists()      # removed, as MXNet's profiler does
    p.command(b"11")
    p.record("pull", "request", 1000, 3000)
    p.close()                                            # the server exits
    events = json.loads((tmp_path / "rank0_p.json").read_text())["traceEvents"]
    assert [e["name"] for e in events if e["ph"] == "X"] == ["pull"]
    p.command(b"13")                                     # dump, finished
    assert not p.recording


@pytest.mark.parametrize("body", [b"", b"x", b"filename0:", b"name-without-value0",
                                  b"filename:x/../../../y.json0", b"x1", b"5"])
def test_bad_commands_are_refused_with_a_reason(tmp_path, body):
    with pytest.raises(ProtocolError):
        profiler(tmp_path).command(body)


def test_state_before_config_is_refused(tmp_path):
    with pytest.raises(ProtocolError, match="set_config"):
        profiler(tmp_path).command(b"11")
