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


def test_a_trace_that_ends_before_it_starts_is_refused_naming_both_steps():
    env = {"BYTEPS_TRACE_ON": "1", "BYTEPS_TRACE_START_STEP": "30", "BYTEPS_TRACE_END_STEP": "20"}
    with pytest.raises(ConfigError) as info:
        Config.from_env(env)
    assert "BYTEPS_TRACE_START_STEP=30" in str(info.value)
    assert "BYTEPS_TRACE_END_STEP=20" in str(info.value)
    assert Config.from_env(dict(env, BYTEPS_TRACE_ON="0")).trace_start_step == 30
