"""The byteps_tcp van's compact meta: the same Meta as the PBMeta path, or no compact form."""
import random

import pytest

from kvstore_byteps.errors import ProtocolError
from kvstore_byteps.van.tcp import compact
from kvstore_byteps.van.wire.codec import decode_meta, encode_meta
from kvstore_byteps.van.wire.message import K_EMPTY, Control, ControlCommand, DataType, Meta, Node
from kvstore_byteps.config import Role


def _via_pbmeta(meta: Meta) -> Meta:
    return decode_meta(encode_meta(meta), sender=9, recver=8)


def _random_data_meta(rng: random.Random) -> Meta:
    extra = rng.choice([None, {"pull_timestamp": rng.randrange(0, 1 << 31)}])
    return Meta(head=rng.choice([0, 3, 6, rng.randrange(-(1 << 31), 1 << 31)]),
                app_id=rng.choice([0, K_EMPTY]), customer_id=rng.choice([0, 1]),
                timestamp=rng.choice([K_EMPTY, rng.randrange(0, 1 << 31)]),
                request=rng.random() < 0.5, push=rng.random() < 0.5, pull=rng.random() < 0.5,
                simple_app=rng.random() < 0.2,
                body=rng.choice([b"", b"x", bytes(rng.randrange(256) for _ in range(300))]),
                data_type=rng.choice([[], [DataType.UINT64, DataType.OTHER],
                                      [DataType.UINT64, DataType.OTHER, DataType.INT32]]),
                priority=rng.randrange(-(1 << 31), 1 << 31), extra=extra)


def test_data_metas_decode_as_their_pbmeta_does():
    rng = random.Random(48)
    for _ in range(2000):
        meta = _random_data_meta(rng)
        data = compact.encode(meta)
        assert data is not None and compact.is_compact(data)
        assert compact.decode(data, sender=9, recver=8) == _via_pbmeta(meta)


def test_a_pbmeta_is_never_taken_for_a_compact_meta():
    rng = random.Random(7)
    for _ in range(500):
        assert not compact.is_compact(encode_meta(_random_data_meta(rng)))
    control = Meta(control=Control(ControlCommand.ADD_NODE,
                                   [Node(Role.WORKER, 9, "127.0.0.1", 1234)]))
    assert not compact.is_compact(encode_meta(control))


@pytest.mark.parametrize("meta", [
    Meta(control=Control(ControlCommand.BARRIER, barrier_group=4)),        # control
    Meta(head=1, extra={"round": 3}),                                       # other extension
    Meta(head=1, extra={"pull_timestamp": 2, "epoch": 1}),
    Meta(head=1, extra={"error": "refused"}),
    Meta(head=1 << 31),                                                     # out of int32
    Meta(head=1, priority=-(1 << 31) - 1),
    Meta(head=1, data_type=[256]),
    Meta(head=1, data_type=[1] * 256),
], ids=["control", "round", "two-extensions", "error", "head", "priority", "type", "types"])
def test_what_does_not_fit_goes_as_pbmeta(meta):
    assert compact.encode(meta) is None


@pytest.mark.parametrize("data, message", [
    (b"\x00" + bytes(10), "at least"),
    (compact.encode(Meta(head=1))[:-1], "at least"),
    (compact.encode(Meta(head=1)) + b"x", "holds 0 data types and a 0-byte body"),
    (compact.encode(Meta(head=1, body=b"abc"))[:-1], "a 3-byte body"),
    (b"\x01" + compact.encode(Meta(head=1))[1:], "not a compact meta"),
], ids=["short", "cut", "trailing", "cut-body", "mark"])
def test_malformed_compact_metas_are_refused(data, message):
    with pytest.raises(ProtocolError, match=message):
        compact.decode(data, sender=9, recver=8)


def test_unknown_flags_are_refused():
    data = bytearray(compact.encode(Meta(head=1)))
    data[25] |= 0x80          # the flags byte: after the mark and six int32 fields
    with pytest.raises(ProtocolError, match="unknown flags 0x80"):
        compact.decode(bytes(data), sender=9, recver=8)
