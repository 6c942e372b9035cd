"""Config: parsing, defaults and errors that quote the variable and the value."""
import dataclasses

import pytest

from kvstore_byteps.config import (Config, Role, ServerKind, VanType,
                                   default_server_summing_threads, usable_cores)
from kvstore_byteps.errors import ConfigError


def test_defaults_match_upstream_and_byteps():
    cfg = Config.from_env({})
    assert cfg.role is Role.WORKER          # MXNet treats a missing DMLC_ROLE as worker
    # ZeroMQ with every peer (MXNet's wire), byteps_tcp between our nodes
    assert cfg.van_type is VanType.AUTO and cfg.kvstore_server is ServerKind.MXNET
    assert Config.from_env({"DMLC_PS_VAN_TYPE": "zmq"}).van_type is VanType.ZMQ
    assert cfg.partition_bytes == 4096000
    assert cfg.server_summing_threads == default_server_summing_threads(usable_cores())
    assert cfg.bigarray_bound == 1000000


def test_with_an_auth_key_the_default_van_stays_on_encrypted_zeromq():
    key = {"BYTEPS_AUTH_KEY": "k" * 32}
    assert Config.from_env(key).van_type is VanType.ZMQ
    assert Config.from_env(dict(key, DMLC_PS_VAN_TYPE="auto")).van_type is VanType.AUTO


def test_partitions_are_sized_by_the_link_unless_their_size_is_set():
    assert Config.from_env({}).size_partitions_by_link
    for text in ("4096000", "768000"):
        cfg = Config.from_env({"BYTEPS_PARTITION_BYTES": text})
        assert not cfg.size_partitions_by_link and cfg.partition_bytes == int(text)


def test_summing_threads_take_at_most_half_the_cores_and_four():
    assert [default_server_summing_threads(n) for n in (1, 2, 3, 4, 6, 8, 64)] == \
        [1, 1, 1, 2, 3, 4, 4]
    assert Config.from_env({"BYTEPS_SERVER_ENGINE_THREAD": "7"}).server_summing_threads == 7


def test_parses_cluster_environment():
    cfg = Config.from_env({"DMLC_ROLE": "Server", "DMLC_NUM_WORKER": "8", "DMLC_NUM_SERVER": "4",
                           "DMLC_PS_ROOT_URI": "10.0.0.1", "DMLC_PS_ROOT_PORT": "9091",
                           "PS_HEARTBEAT_INTERVAL": "2.5", "MXNET_KVSTORE_SERVER": "BytePS",
                           "DMLC_PS_VAN_TYPE": "byteps_tcp", "BYTEPS_ENABLE_ASYNC": "1"})
    assert (cfg.role, cfg.num_workers, cfg.num_servers) == (Role.SERVER, 8, 4)
    assert (cfg.root_uri, cfg.root_port, cfg.heartbeat_interval) == ("10.0.0.1", 9091, 2.5)
    assert cfg.kvstore_server is ServerKind.BYTEPS and cfg.van_type is VanType.BYTEPS_TCP
    assert cfg.enable_async and cfg.role is Role.SERVER


def test_enable_rdma_selects_rdma_van_unless_van_type_given():
    assert Config.from_env({"DMLC_ENABLE_RDMA": "1"}).van_type is VanType.BYTEPS_RDMA
    assert Config.from_env({"DMLC_ENABLE_RDMA": "1",
                            "DMLC_PS_VAN_TYPE": "zmq"}).van_type is VanType.ZMQ


def test_pulls_ride_with_pushes_unless_turned_off():
    assert Config.from_env({}).pull_with_push
    assert not Config.from_env({"BYTEPS_PULL_WITH_PUSH": "0"}).pull_with_push


@pytest.mark.parametrize("name,value", [
    ("DMLC_ROLE", "boss"), ("DMLC_NUM_WORKER", "0"), ("DMLC_NUM_SERVER", "two"),
    ("DMLC_PS_ROOT_PORT", "70000"), ("PS_HEARTBEAT_INTERVAL", "-1"), ("PS_RESEND", "maybe"),
    ("MXNET_KVSTORE_SERVER", "ps-lite"), ("DMLC_PS_VAN_TYPE", "ibverbs"),
    ("BYTEPS_PARTITION_BYTES", "0"), ("BYTEPS_KEY_HASH_FN", "md5"), ("PS_DROP_MSG", "101"),
    ("BYTEPS_PULL_WITH_PUSH", "often"),
])
def test_bad_values_name_variable_and_value(name, value):
    with pytest.raises(ConfigError) as info:
        Config.from_env({name: value})
    assert name in str(info.value) and repr(value) in str(info.value)


def test_config_is_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        Config.from_env({}).num_workers = 3


def test_log_level_is_read_in_any_case():
    assert Config.from_env({"BYTEPS_LOG_LEVEL": "info"}).log_level == "INFO"
    assert Config.from_env({"BYTEPS_LOG_LEVEL": "Debug"}).log_level == "DEBUG"


def test_the_young_generation_threshold_defaults_to_10000_and_0_leaves_it_alone():
    assert Config.from_env({}).gc_young_threshold == 10000
    assert Config.from_env({"BYTEPS_GC_YOUNG_THRESHOLD": "0"}).gc_young_threshold == 0
    with pytest.raises(ConfigError, match="BYTEPS_GC_YOUNG_THRESHOLD"):
        Config.from_env({"BYTEPS_GC_YOUNG_THRESHOLD": "-5"})


def test_a_trace_that_ends_before_it_starts_is_refused_naming_both_steps():
    env = {"BYTEPS_TRACE_ON": "1", "BYTEPS_TRACE_START_STEP": "30", "BYTEPS_TRACE_END_STEP": "20"}
    with pytest.raises(ConfigError) as info:
        Config.from_env(env)
    assert "BYTEPS_TRACE_START_STEP=30" in str(info.value)
    assert "BYTEPS_TRACE_END_STEP=20" in str(info.value)
    assert Config.from_env(dict(env, BYTEPS_TRACE_ON="0")).trace_start_step == 30


@pytest.fixture
def own_defaults(monkeypatch):
    """An empty set of this process's defaults, restored afterwards."""
    import kvstore_byteps.config.environment as environment
    monkeypatch.setattr(environment, "_process_defaults", {})
    return environment


def test_a_process_default_fills_what_the_environment_leaves_unset(own_defaults, monkeypatch):
    monkeypatch.delenv("BYTEPS_KEY_HASH_FN", raising=False)
    own_defaults.set_default("BYTEPS_KEY_HASH_FN", "djb2")
    assert Config.from_env().key_hash_fn == "djb2"
    assert "BYTEPS_KEY_HASH_FN" not in __import__("os").environ     # never written there
    monkeypatch.setenv("BYTEPS_KEY_HASH_FN", "")                     # empty reads as unset
    assert Config.from_env().key_hash_fn == "djb2"
    monkeypatch.setenv("BYTEPS_KEY_HASH_FN", "sdbm")                 # the user's choice wins
    assert Config.from_env().key_hash_fn == "sdbm"
    # a given mapping is read alone; a default is validated as every value is
    assert Config.from_env({}).key_hash_fn == "balanced"
    own_defaults.set_default("BYTEPS_KEY_HASH_FN", "md5")
    monkeypatch.delenv("BYTEPS_KEY_HASH_FN")
    with pytest.raises(ConfigError, match="BYTEPS_KEY_HASH_FN='md5'"):
        Config.from_env()


def test_only_reads_just_the_named_variables():
    env = {"DMLC_ROLE": "server", "MXNET_KVSTORE_SERVER": "byteps", "PS_DROP_MSG": "101"}
    with pytest.raises(ConfigError, match="PS_DROP_MSG"):
        Config.from_env(env)
    config = Config.from_env(env, only=("DMLC_ROLE",))
    assert config.role is Role.SERVER and config.kvstore_server is ServerKind.MXNET


def test_env_int_reads_one_integer_as_config_does():
    from kvstore_byteps.config import env_int
    assert env_int({"DMLC_NUM_WORKER": " 3 "}, "DMLC_NUM_WORKER", minimum=1) == 3
    assert env_int({}, "DMLC_NUM_WORKER", 1, minimum=1) == 1
    assert env_int({"DMLC_WORKER_ID": ""}, "DMLC_WORKER_ID") is None
    assert env_int({"DMLC_WORKER_ID": "0"}, "DMLC_WORKER_ID") == 0
    with pytest.raises(ConfigError, match="DMLC_NUM_WORKER='0' is invalid"):
        env_int({"DMLC_NUM_WORKER": "0"}, "DMLC_NUM_WORKER", minimum=1)
    with pytest.raises(ConfigError, match="DMLC_WORKER_ID='x' is invalid: expected an integer"):
        env_int({"DMLC_WORKER_ID": "x"}, "DMLC_WORKER_ID")


def test_the_global_rank_a_process_asks_for():
    assert Config.from_env({}).global_rank is None
    assert Config.from_env({"BYTEPS_GLOBAL_RANK": "3"}).global_rank == 3
    with pytest.raises(ConfigError, match="BYTEPS_GLOBAL_RANK='-1'"):
        Config.from_env({"BYTEPS_GLOBAL_RANK": "-1"})


def test_backup_wait_is_a_percentage_the_servers_read_beside_backup_workers():
    env = {"DMLC_NUM_WORKER": "4", "BYTEPS_BACKUP_WORKERS": "1"}
    mode = Config.from_env(env).training_mode
    assert mode.backup_wait == 25 and mode.name == "sync with 1 backup worker"
    waits = Config.from_env(dict(env, BYTEPS_BACKUP_WAIT="0")).training_mode
    assert waits.backup_wait == 0 and waits == mode    # not part of the mode workers compare
    with pytest.raises(ConfigError, match="BYTEPS_BACKUP_WAIT"):
        Config.from_env(dict(env, BYTEPS_BACKUP_WAIT="150"))
