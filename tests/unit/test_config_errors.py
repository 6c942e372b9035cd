"""Configuration errors: a server's refusal of a worker's configuration reaches the worker as
ConfigError, the server logs it once, and a worker process ends on one with one line."""
import logging
import sys

import pytest

from kvstore_byteps.errors import ConfigError, PeerError, config_refusal
from kvstore_byteps.logs import config_errors_in_one_line
from kvstore_byteps.mxproto import ServerCommand
from kvstore_byteps.serving.byteps import BytePSServer
from kvstore_byteps.van.kv.requests import _answered_error
from tests.support.server_fakes import WORKER0, WORKER1, FakeServer, command


def test_a_refused_configuration_is_a_config_error_at_the_worker():
    error = _answered_error("the server probe", 8, config_refusal("this server trains sync"))
    assert isinstance(error, ConfigError)
    assert str(error) == "the server probe: server node 8 refused this worker: this server " \
                         "trains sync"
    assert type(_answered_error("a push", 8, "server error: boom")) is PeerError


def test_the_probe_refuses_another_training_mode_logging_it_once(caplog):
    srv, fake = BytePSServer(2, summing_threads=1), FakeServer()
    with srv, caplog.at_level(logging.WARNING):
        requests = [command(worker, ServerCommand.BYTEPS_PROBE, b"async")
                    for worker in (WORKER0, WORKER1, WORKER0)]
        for request in requests:
            srv.handle_command(request, fake)
        errors = [fake.wait_for(request).error for request in requests]
    assert errors == [config_refusal("this server trains sync, the worker async: set "
                                     "BYTEPS_ENABLE_ASYNC and BYTEPS_BACKUP_WORKERS alike on "
                                     "every node")] * 3
    assert len([r for r in caplog.records if "trains sync" in r.getMessage()]) == 1


@pytest.fixture
def hook(monkeypatch):
    seen = []
    monkeypatch.setattr(sys, "excepthook", lambda *info: seen.append(info[1]))
    config_errors_in_one_line()
    config_errors_in_one_line()           # idempotent: not wrapped twice
    return sys.excepthook, seen


def test_an_uncaught_config_error_is_one_line_and_others_reach_the_old_hook(hook, capsys):
    excepthook, seen = hook
    excepthook(ConfigError, ConfigError("BYTEPS_X='y' is invalid"), None)
    assert capsys.readouterr().err == "[kvstore_byteps] configuration error: BYTEPS_X='y' is " \
                                      "invalid\n"
    other = RuntimeError("a bug")
    excepthook(RuntimeError, other, None)
    assert seen == [other] and capsys.readouterr().err == ""


def test_a_cluster_that_did_not_form_is_one_line(hook, capsys):
    from kvstore_byteps.errors import ClusterStartError
    excepthook, seen = hook
    excepthook(ClusterStartError, ClusterStartError("worker: the scheduler at 127.0.0.1:9 did "
                                                    "not answer"), None)
    assert capsys.readouterr().err == ("[kvstore_byteps] the cluster did not form: worker: the "
                                       "scheduler at 127.0.0.1:9 did not answer\n")
    assert seen == []
