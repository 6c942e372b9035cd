"""PBMeta codec against the golden vectors captured from MXNet 1.9.1."""
import pytest

from kvstore_byteps.config import Role
from kvstore_byteps.errors import ProtocolError
from kvstore_byteps.van.wire.codec import EXTENSION_FIELDS, decode_meta, encode_meta
from kvstore_byteps.van.runtime.membership import (VanClock, barrier_request, control_message,
                                           terminate_message)
from kvstore_byteps.van.wire.message import (K_EMPTY, ControlCommand, DataType, Meta, Node)
from kvstore_byteps.van.wire.pbmeta import PBMeta
from tests.support import vectors

MESSAGE_VECTORS = vectors.message_vectors()


def test_all_message_vectors_present():
    assert len(MESSAGE_VECTORS) == 28


@pytest.mark.parametrize("name", MESSAGE_VECTORS)
def test_decode_then_encode_is_byte_identical(name):
    raw = vectors.read(name + ".meta.bin")
    assert encode_meta(decode_meta(raw)) == raw


@pytest.mark.parametrize("name", MESSAGE_VECTORS)
def test_decoded_fields_match_index(name):
    entry = next(v for v in vectors.load_index() if v["name"] == name)
    expected = entry["meta_decoded"]
    meta = decode_meta(vectors.read(name + ".meta.bin"))
    assert meta.head == expected.get("head", 0)
    assert meta.request == expected["request"] and meta.push == expected["push"]
    assert meta.pull == expected["pull"]
    assert meta.timestamp == expected.get("timestamp", K_EMPTY)
    assert meta.app_id == expected.get("app_id", K_EMPTY)
    assert meta.customer_id == expected["customer_id"]
    assert meta.data_type == [int(t.split("(")[0]) for t in expected.get("data_type", [])]
    if "control" in expected:
        assert meta.control.cmd == int(expected["control"]["cmd"].split("(")[0])
        assert [n.port for n in meta.control.nodes] == [
            n["port"] for n in expected["control"].get("node", [])]


def _node(role, port, node_id=K_EMPTY, customer_id=0):
    return Node(role=role, id=node_id, hostname="127.0.0.1", port=port, customer_id=customer_id)


def test_add_node_request_built_from_scratch():
    msg = control_message(ControlCommand.ADD_NODE, 1, timestamp=0, nodes=[_node(Role.WORKER, 39431)])
    assert encode_meta(msg.meta) == vectors.read("04_add_node_request_worker.meta.bin")


def test_add_node_reply_built_from_scratch():
    nodes = [_node(Role.WORKER, 39431, 9), _node(Role.SERVER, 43905, 8),
             _node(Role.WORKER, 58517, 11), _node(Role.SCHEDULER, 9091, 1, -1340796848)]
    msg = control_message(ControlCommand.ADD_NODE, 9, timestamp=0, nodes=nodes)
    assert encode_meta(msg.meta) == vectors.read("05_add_node_reply.meta.bin")


def test_barrier_request_and_terminate_built_from_scratch():
    clock = VanClock()
    clock.tick()                      # ADD_NODE took timestamp 0
    assert encode_meta(barrier_request(7, 0, clock).meta) == vectors.read(
        "06_barrier_request_g7.meta.bin")
    assert encode_meta(terminate_message(9).meta) == vectors.read("17_terminate_self.meta.bin")


def test_heartbeat_built_from_scratch():
    msg = control_message(ControlCommand.HEARTBEAT, 1, timestamp=3, nodes=[_node(Role.WORKER, 9102, 11)])
    assert encode_meta(msg.meta) == vectors.read("40_heartbeat_from_worker.meta.bin")


def test_kv_push_and_pull_metas_built_from_scratch():
    kv_types = [DataType.UINT64, DataType.OTHER, DataType.INT32]
    push = Meta(head=0, request=True, push=True, app_id=0, timestamp=1, customer_id=0,
                data_type=kv_types)
    assert encode_meta(push) == vectors.read("11_push_init_request.meta.bin")
    pull = Meta(head=0, request=True, pull=True, app_id=0, timestamp=3, customer_id=0,
                data_type=kv_types[:2])
    assert encode_meta(pull) == vectors.read("14_pull_request.meta.bin")
    command = Meta(head=3, request=True, simple_app=True, app_id=0, timestamp=0, customer_id=0)
    assert encode_meta(command) == vectors.read("09_cmd_syncmode_request.meta.bin")


def test_garbage_negative_varints_survive():
    meta = decode_meta(vectors.read("07_barrier_response.meta.bin"))
    assert meta.control.barrier_group == -1948267904
    assert decode_meta(vectors.read("05_add_node_reply.meta.bin")).control.nodes[-1].customer_id < 0


def test_rank_hint_rides_on_the_node_and_is_optional():
    asked = Node(Role.WORKER, hostname="198.18.0.3", port=4000, rank_hint=3)
    msg = control_message(ControlCommand.ADD_NODE, 1, nodes=[asked, Node(Role.SERVER, port=1)])
    decoded = decode_meta(encode_meta(msg.meta)).control.nodes
    assert decoded[0].rank_hint == 3 and decoded[1].rank_hint is None
    plain = control_message(ControlCommand.ADD_NODE, 1, nodes=[Node(Role.SERVER, port=1)])
    assert b"\xa0\x06" not in encode_meta(plain.meta)  # field 100 absent unless asked


def test_the_tcp_port_rides_on_the_node_and_is_optional():
    ours = Node(Role.SERVER, 8, "10.0.0.1", 4000, tcp_port=4001)
    msg = control_message(ControlCommand.ADD_NODE, 1, nodes=[ours, Node(Role.SERVER, port=1)])
    decoded = decode_meta(encode_meta(msg.meta)).control.nodes
    assert decoded[0].tcp_port == 4001 and decoded[1].tcp_port is None
    plain = control_message(ControlCommand.ADD_NODE, 1, nodes=[Node(Role.SERVER, port=1)])
    assert b"\xb0\x06" not in encode_meta(plain.meta)  # field 102 absent unless announced
    bad = control_message(ControlCommand.ADD_NODE, 1, nodes=[Node(Role.SERVER, tcp_port=70000)])
    with pytest.raises(ProtocolError, match="tcp_port 70000 is out of range"):
        decode_meta(encode_meta(bad.meta))


def test_extension_fields_round_trip_and_are_optional():
    extra = {"error": "bad key", "round": 5, "pull_timestamp": 77}
    meta = Meta(head=0, app_id=0, timestamp=2, extra=extra)
    decoded = decode_meta(encode_meta(meta))
    assert decoded.extra == extra
    assert decode_meta(encode_meta(Meta(head=0))).extra is None


@pytest.mark.parametrize("raw", [b"\xff\xff\xff", b"\x1a\x02\x08", b"\x1a\x00", b"\x0a\x05ab"])
def test_malformed_meta_raises_protocol_error(raw):
    with pytest.raises(ProtocolError):
        decode_meta(raw)


def test_a_node_whose_hostname_is_not_utf8_is_a_protocol_error():
    from kvstore_byteps.van.wire.message import ControlCommand, Control, Node, Role
    meta = Meta(control=Control(cmd=ControlCommand.ADD_NODE,
                                nodes=[Node(Role.WORKER, hostname="AAAA", port=5)]))
    raw = encode_meta(meta).replace(b"AAAA", b"\xff\xfe\xfd\xfc")
    with pytest.raises(ProtocolError, match="not UTF-8"):
        decode_meta(raw)


@pytest.mark.parametrize("name", EXTENSION_FIELDS)
def test_every_extension_field_is_found_whatever_its_value(name):
    # decode_meta skips the extension fields when the bytes cannot hold one: that shortcut
    # must never miss a field that is there
    kind = PBMeta.DESCRIPTOR.fields_by_name[name].type
    values = {9: ["", "x", "y" * 300], 8: [True, False]}.get(kind, [0, 1, 127, 128, 2 ** 31 - 1])
    for value in values:
        for timestamp in (0, 6, 134, 2 ** 31 - 1):
            data = encode_meta(Meta(head=6, timestamp=timestamp, priority=-3,
                                    extra={name: value}))
            assert decode_meta(data).extra == {name: value}


def test_an_extension_tag_written_overlong_is_found():
    # field 106 (pull_timestamp), varint 7, its tag 848 written in three bytes instead of two
    data = encode_meta(Meta(head=6, timestamp=5)) + bytes([0xD0, 0x86, 0x00, 7])
    assert decode_meta(data).extra == {"pull_timestamp": 7}
    # field 112 (worker_left), true: its tag 896 is the first whose second byte is 0x07
    data = encode_meta(Meta(head=6, timestamp=5)) + bytes([0x80, 0x87, 0x00, 1])
    assert decode_meta(data).extra == {"worker_left": True}
    # field 113 (worker_joined), true: tag 904, first byte 0x88
    data = encode_meta(Meta(head=6, timestamp=5)) + bytes([0x88, 0x87, 0x00, 1])
    assert decode_meta(data).extra == {"worker_joined": True}
    # field 114 (job_finished), true: tag 912, first byte 0x90 (beyond 0x8F)
    data = encode_meta(Meta(head=6, timestamp=5)) + bytes([0x90, 0x87, 0x00, 1])
    assert decode_meta(data).extra == {"job_finished": True}


def test_a_data_meta_without_extensions_decodes_without_them():
    data = encode_meta(Meta(head=6, app_id=0, customer_id=0, timestamp=1000, pull=True,
                            data_type=[8, 1, 5], priority=-3))
    assert decode_meta(data).extra is None
