"""Unit tests of the in-memory trace and its Chrome JSON dump."""
import json

from kvstore_byteps.config import Config
from kvstore_byteps.engine.stage_specs import Stage
from kvstore_byteps.engine.trace import Tracer


def test_records_only_steps_inside_the_window():
    tracer = Tracer(enabled=True, start_step=1, end_step=2)
    steps = [tracer.next_step(7) for _ in range(4)]
    assert steps == [0, 1, 2, 3] and tracer.next_step(8) == 0
    for step in steps:
        tracer.record(Stage.PUSH, 7, 0, step, 100, 200)
    assert [event.step for event in tracer.events()] == [1, 2]


def test_disabled_tracer_records_nothing():
    tracer = Tracer.from_config(Config())
    assert not tracer.enabled
    tracer.record(Stage.PULL, 1, 0, 10, 0, 1)
    assert tracer.events() == []


def test_from_config_and_dump_chrome_json(tmp_path):
    config = Config(trace_on=True, trace_start_step=0, trace_end_step=5, trace_dir=str(tmp_path))
    tracer = Tracer.from_config(config, rank=3)
    tracer.record(Stage.PUSH, 4, 1, 0, tracer._origin_ns + 2000, tracer._origin_ns + 5000, -4)
    path = tracer.dump()
    assert path == str(tmp_path / "3" / "comm.json")
    trace = json.loads(open(path, encoding="utf-8").read())
    (event,) = trace["traceEvents"]
    assert event["name"] == "PUSH" and event["ph"] == "X"
    assert event["ts"] == 2.0 and event["dur"] == 3.0
    assert event["args"] == {"key": 4, "part": 1, "step": 0, "priority": -4}
    tracer.clear()
    assert tracer.events() == []
