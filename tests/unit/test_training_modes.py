"""TrainingMode (config/training.py) and engine/modes.py: what each training mode tells the
servers, refuses and sends around a barrier. Pure."""
import pytest

from kvstore_byteps.config import Config, ConfigError, Training, TrainingMode
from kvstore_byteps.engine.modes import tell_presence
from kvstore_byteps.mxproto import Presence, ServerCommand

MISSING = "MXNet's servers lack our extensions"


def mode(**env):
    return Config.from_env(dict({"DMLC_NUM_WORKER": "4"}, **env)).training_mode


def test_each_mode_names_itself_and_what_it_cannot_do():
    sync, asynchronous = mode(), mode(BYTEPS_ENABLE_ASYNC="1")
    backup = mode(BYTEPS_BACKUP_WORKERS="1")
    assert (sync.name, asynchronous.name, backup.name) == (
        "sync", "async", "sync with 1 backup worker")
    assert sync.summed and sync.refusal(MISSING) is None and sync.compression_refusal is None
    assert asynchronous.refusal(MISSING).startswith("BYTEPS_ENABLE_ASYNC needs kvstore-byteps")
    assert backup.refusal(MISSING).startswith("BYTEPS_BACKUP_WORKERS needs kvstore-byteps")
    assert backup.refusal(None) is None                 # our servers
    assert "unset BYTEPS_BACKUP_WORKERS" in backup.compression_refusal
    assert "kept the weights" in backup.unrecoverable and sync.unrecoverable is None


def test_only_backup_workers_tell_the_servers_they_are_away():
    sent = []
    record = lambda head, body, what: sent.append((head, body))    # noqa: E731
    tell_presence(mode(), record, Presence.AWAY)
    tell_presence(mode(BYTEPS_ENABLE_ASYNC="1"), record, Presence.DONE)
    assert sent == []
    backup = mode(BYTEPS_BACKUP_WORKERS="2")
    for presence in (Presence.AWAY, Presence.BACK, Presence.DONE):
        tell_presence(backup, record, presence)
    assert sent == [(ServerCommand.BYTEPS_ABSENT, b"1"), (ServerCommand.BYTEPS_ABSENT, b"0"),
                    (ServerCommand.BYTEPS_ABSENT, b"2")]


@pytest.mark.parametrize("env,words", [
    ({"BYTEPS_BACKUP_WORKERS": "1", "BYTEPS_ENABLE_ASYNC": "1"}, "exclude each other"),
    ({"BYTEPS_BACKUP_WORKERS": "4"}, "needs more workers than that"),
])
def test_impossible_combinations_are_refused_at_start(env, words):
    with pytest.raises(ConfigError, match=words):
        Config.from_env(dict({"DMLC_NUM_WORKER": "4"}, **env))


def test_the_probe_text_names_one_mode():
    for mode in (TrainingMode(), TrainingMode(Training.ASYNC),
                 TrainingMode(Training.BACKUP_WORKERS, 1), TrainingMode(Training.BACKUP_WORKERS, 3)):
        assert TrainingMode.parse(mode.name) == mode
    for text in ("", "Sync", "sync with 0 backup workers", "sync with 2 backup worker",
                 "sync with x backup workers"):
        assert TrainingMode.parse(text) is None
