"""The transport registry (van/registry.py): the node runtime asks it for its van by name; a
transport's module is imported only when a node chooses it."""
import sys

import pytest

from kvstore_byteps.config import Config, VanType
from kvstore_byteps.errors import ConfigError
from kvstore_byteps.van import registry


class FakeVan:
    def __init__(self, config):
        self.config = config


def test_every_van_type_is_registered_as_module_and_class():
    assert set(registry._TRANSPORTS) == set(VanType)
    for target in registry._TRANSPORTS.values():
        module, _, name = target.partition(":")
        assert module.startswith("kvstore_byteps.van.") and name, target


def test_a_van_is_built_from_the_module_registered_for_its_name(monkeypatch):
    monkeypatch.setattr(registry, "_TRANSPORTS", {})
    registry.register(VanType.P3, __name__ + ":FakeVan")
    config = Config.from_env({"DMLC_PS_VAN_TYPE": "p3"})
    van = registry.make_van(config)
    assert isinstance(van, FakeVan) and van.config is config


def test_a_transport_is_not_imported_until_chosen(monkeypatch):
    monkeypatch.setattr(registry, "_TRANSPORTS", {})
    registry.register(VanType.ZMQ, "tests.unit._never_imported:Van")
    registry.register(VanType.P3, __name__ + ":FakeVan")
    registry.make_van(Config.from_env({"DMLC_PS_VAN_TYPE": "p3"}))
    assert "tests.unit._never_imported" not in sys.modules


def test_an_unregistered_transport_is_a_config_error(monkeypatch):
    monkeypatch.setattr(registry, "_TRANSPORTS", {})
    with pytest.raises(ConfigError, match="DMLC_PS_VAN_TYPE=zmq is not available"):
        registry.make_van(Config.from_env({"DMLC_PS_VAN_TYPE": "zmq"}))


@pytest.mark.parametrize("target", ["kvstore_byteps.van.tcp.van", ":TcpVan", ""])
def test_a_registration_names_module_and_class(target):
    with pytest.raises(ValueError, match="module:Class"):
        registry.register(VanType.BYTEPS_TCP, target)
