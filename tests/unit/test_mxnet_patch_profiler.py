"""The bodies of the server profiler commands a dist_byteps worker sends for mx.profiler, in
MXNet's words (what MXNet's C API sends through its own stores; serving/profiler.py reads them)."""
from mxnet_patch.profiler import _body, config_body


def test_set_config_sends_the_parameters_without_profile_process_then_0():
    kwargs = {"filename": "p.json", "profile_all": True, "profile_process": "server"}
    assert config_body(kwargs) == "filename:p.json,profile_all:True"
    assert _body("set_config", {"kwargs": kwargs}) == "filename:p.json,profile_all:True0"


def test_state_pause_and_dump_send_a_digit_then_the_command():
    assert _body("set_state", {"state": "run"}) == "11"
    assert _body("set_state", {"state": "stop"}) == "01"
    assert (_body("pause", {}), _body("resume", {})) == ("12", "02")
    assert (_body("dump", {"finished": True}), _body("dump", {"finished": False})) == ("13", "03")
