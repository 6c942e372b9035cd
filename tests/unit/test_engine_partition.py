"""Unit tests of partitioning, key placement hashes and upstream's key/cmd encoding. Pure."""
import collections
import struct
from pathlib import Path

import pytest

from kvstore_byteps.config import Config
from kvstore_byteps import mxproto
from kvstore_byteps.engine import keyhash, partition, upstream
from kvstore_byteps.engine.keyhash import KeyHash
from kvstore_byteps.engine.partition import KeyLayoutError
from kvstore_byteps.errors import ConfigError
from kvstore_byteps.van.wire.keys import server_key_range, server_of_key
from tests.support.vectors import VECTOR_DIR
from tests.support.paths import DATA

VECTORS = Path(VECTOR_DIR)


# --- hash functions -----------------------------------------------------------------------

def test_djb2_and_sdbm_hash_the_decimal_text():
    assert keyhash.djb2(0) == 5381 * 33 + ord("0")
    assert keyhash.djb2(42) == (5381 * 33 + ord("4")) * 33 + ord("2")
    assert keyhash.sdbm(7) == ord("7")
    assert keyhash.sdbm(12) == ord("2") + ord("1") * 65599


def test_hashes_wrap_at_64_bits():
    big = 2 ** 64 - 1
    for function in (keyhash.djb2, keyhash.sdbm, keyhash.builtin_hash):
        assert 0 <= function(big) < 2 ** 64
    with pytest.raises(ValueError):
        keyhash.djb2(2 ** 64)


# Reference values printed by g++ 12 / libstdc++: std::hash<std::string>{}(std::to_string(k)).
@pytest.mark.parametrize("key,expected", [
    (0, 2297668033614959926), (1, 10159970873491820195), (42, 12271353895611140273),
    (65536, 243660463169716517), (123456789, 12315982496267331008),
    (2 ** 64 - 1, 8097035269031846835),
])
def test_builtin_hash_matches_libstdcxx(key, expected):
    assert keyhash.builtin_hash(key) == expected


def test_key_hash_parse_names_the_variable():
    assert KeyHash.parse("sdbm") is KeyHash.SDBM
    with pytest.raises(ConfigError, match="BYTEPS_KEY_HASH_FN='naive'"):
        KeyHash.parse("naive")


@pytest.mark.parametrize("key_hash", [KeyHash.DJB2, KeyHash.SDBM, KeyHash.BUILT_IN])
def test_placement_balances_partitions(key_hash):
    counts = collections.Counter(
        keyhash.server_for_key((key << 16) | index, 4, key_hash)
        for key in range(200) for index in range(4))
    assert set(counts) == {0, 1, 2, 3}
    assert max(counts.values()) < 1.5 * min(counts.values())


RESNET50_SHAPES = Path(DATA) / "resnet50_v1_shapes.json"


def _busiest_share(key_hash, servers):
    """Bytes on the busiest server / the mean, over ResNet-50's 193 gradient tensors."""
    import json
    import numpy as np
    load = [0] * servers
    partitioner = partition.Partitioner(Config(key_hash_fn=key_hash.value, num_servers=servers,
                                               num_workers=4))
    for key, shape in enumerate(json.loads(RESNET50_SHAPES.read_text())):
        for part in partitioner.plan(key, int(np.prod(shape)) * 4, 4).partitions:
            load[part.server] += part.nbytes
    return max(load) / (sum(load) / servers)


def test_balanced_placement_evens_out_resnet50_where_hashes_do_not():
    # the busiest server's link bounds a step: djb2 leaves it 26% over its fair share
    assert _busiest_share(KeyHash.DJB2, 4) == pytest.approx(1.26, abs=0.005)
    assert _busiest_share(KeyHash.SDBM, 4) == pytest.approx(1.10, abs=0.005)
    assert _busiest_share(KeyHash.BALANCED, 4) < 1.05
    assert _busiest_share(KeyHash.BALANCED, 2) < 1.04


def test_balanced_placement_follows_the_running_totals_across_keys():
    partitioner = partition.Partitioner(Config(key_hash_fn="balanced", num_servers=3,
                                               partition_bytes=100))
    servers = lambda key, nbytes: [p.server for p in partitioner.plan(key, nbytes, 4).partitions]
    assert servers(0, 240) == [0, 1, 2]      # 100, 100, 40: ties go to the lowest rank
    assert servers(1, 40) == [2]             # server 2 holds the fewest bytes (40)
    assert servers(2, 0) == [2]              # an empty tensor still gets a partition (80)
    assert servers(3, 100) == [2]            # 80 < 100
    assert servers(0, 240) == [0, 1, 2]      # a known key keeps its plan; totals unchanged
    assert servers(5, 8) == [0]              # 100, 100, 180
    plan = partitioner.plan(4, 20, 4)
    assert partition.decode_ps_key(plan.partitions[0].ps_key, 3) == (plan.partitions[0].server,
                                                                     4, 0)


def test_balanced_placement_spreads_a_large_tensor_over_every_server():
    sizes = lambda plan: [p.nbytes for p in plan.partitions]
    servers = lambda plan: sorted(p.server for p in plan.partitions)
    big = partition.plan_partitions(0, 4 * 300_000, 4, 4, key_hash=KeyHash.BALANCED,
                                    spread_bytes=262144)
    assert sizes(big) == [300_000] * 4 and servers(big) == [0, 1, 2, 3]
    assert [p.offset for p in big.partitions] == [0, 300_000, 600_000, 900_000]
    small = partition.plan_partitions(0, 4 * 200_000, 4, 4, key_hash=KeyHash.BALANCED,
                                      spread_bytes=262144)
    assert sizes(small) == [800_000]                      # under 4 x 256 KB: one partition
    off = partition.plan_partitions(0, 4 * 300_000, 4, 4, key_hash=KeyHash.BALANCED)
    assert sizes(off) == [1_200_000]                      # spread_bytes=0 turns it off
    hashed = partition.plan_partitions(0, 4 * 300_000, 4, 4, spread_bytes=262144)
    assert sizes(hashed) == [1_200_000]                   # BytePS's hashes keep BytePS's cut
    odd = partition.plan_partitions(0, 5 * 8, 8, 4, key_hash=KeyHash.BALANCED, spread_bytes=8)
    assert sizes(odd) == [16, 16, 8] and len(set(servers(odd))) == 3   # no empty part


def test_partitions_of_one_tensor_go_to_different_servers_while_there_are_some():
    server_bytes = [0, 0, 0]
    partition.plan_partitions(0, 400, 4, 3, partition_bytes=400, key_hash=KeyHash.BALANCED,
                              server_bytes=server_bytes)          # server 0 now holds 400
    plan = partition.plan_partitions(1, 1600, 4, 3, partition_bytes=400,
                                     key_hash=KeyHash.BALANCED, server_bytes=server_bytes)
    assert [p.server for p in plan.partitions] == [1, 2, 0, 1]


def test_balanced_is_the_default_and_not_a_hash():
    assert Config().key_hash_fn == "balanced"
    with pytest.raises(ValueError, match="balanced placement"):
        keyhash.server_for_key(1, 2, KeyHash.BALANCED)


def test_mixed_mode_gives_dedicated_servers_the_larger_share():
    counts = collections.Counter(
        keyhash.server_for_key((key << 16) | index, 6, KeyHash.MIXED, num_workers=4)
        for key in range(500) for index in range(3))
    assert set(counts) == set(range(6))
    dedicated = (counts[0] + counts[1]) / 2
    colocated = sum(counts[i] for i in range(2, 6)) / 4
    assert dedicated > 2 * colocated


def test_mixed_mode_refuses_fewer_servers_than_workers():
    with pytest.raises(ConfigError, match="mixed"):
        keyhash.server_for_key(1, 2, KeyHash.MIXED, num_workers=3)


def test_mixed_mode_with_only_colocated_servers():
    servers = {keyhash.server_for_key(k, 3, KeyHash.MIXED, num_workers=3) for k in range(100)}
    assert servers == {0, 1, 2}


# --- our partition layout -----------------------------------------------------------------

def test_plan_splits_at_aligned_bound():
    plan = partition.plan_partitions(3, 10 * 4, 4, 2, partition_bytes=14)
    assert [(p.offset, p.nbytes) for p in plan.partitions] == [(0, 12), (12, 12), (24, 12),
                                                                (36, 4)]
    assert [p.index for p in plan.partitions] == [0, 1, 2, 3]
    assert plan.partitions[-1].end == 40


def test_partition_bound_keeps_at_least_one_item():
    assert partition.partition_bound(3, 8) == 8
    assert partition.partition_bound(4096000, 8) == 4096000
    assert partition.partition_bound(4096001, 2) == 4096000


def test_small_tensor_is_one_partition_and_empty_tensor_gets_one_empty_partition():
    assert len(partition.plan_partitions(1, 400, 4, 3)) == 1
    empty = partition.plan_partitions(1, 0, 4, 3)
    assert [(p.offset, p.nbytes) for p in empty.partitions] == [(0, 0)]


def test_ps_keys_fall_in_their_servers_range_and_round_trip():
    for servers in (1, 2, 3, 7):
        plan = partition.plan_partitions(2 ** 31 - 1, 64, 4, servers, partition_bytes=4)
        for part in plan.partitions:
            begin, end = server_key_range(part.server, servers)
            assert begin <= part.ps_key < end
            assert partition.decode_ps_key(part.ps_key, servers) == (
                part.server, 2 ** 31 - 1, part.index)


def test_ps_keys_are_unique_across_keys_and_partitions():
    seen = set()
    for key in (0, 1, 2, 65535, 65536, 2 ** 31 - 1):
        for part in partition.plan_partitions(key, 40, 4, 3, partition_bytes=4).partitions:
            assert part.ps_key not in seen
            seen.add(part.ps_key)
    edge = {partition.encode_ps_key(k, i, 0, 1) for k in (0, 1) for i in (0, 65535)}
    assert len(edge) == 4


def test_encoding_limits_are_errors():
    with pytest.raises(KeyLayoutError):
        partition.encode_ps_key(2 ** 31, 0, 0, 1)
    with pytest.raises(KeyLayoutError):
        partition.encode_ps_key(-1, 0, 0, 1)
    with pytest.raises(KeyLayoutError):
        partition.encode_ps_key(0, 65536, 0, 1)
    with pytest.raises(KeyLayoutError, match="131072"):
        partition.encode_ps_key(0, 0, 0, 131072)
    with pytest.raises(KeyLayoutError, match="partitions"):
        partition.plan_partitions(0, 4 * 65537, 4, 1, partition_bytes=4)
    with pytest.raises(KeyLayoutError, match="whole number"):
        partition.plan_partitions(0, 6, 4, 1)


def test_server_key_range_is_ps_lite_split():
    assert server_key_range(0, 2) == (0, 9223372036854775807)
    assert server_key_range(1, 2) == (9223372036854775807, 18446744073709551614)
    assert [server_of_key(k, 2) for k in (0, 9223372036854775806, 9223372036854775807,
                                          2 ** 64 - 1)] == [0, 0, 1, 1]


def test_by_server_groups_in_byte_order():
    plan = partition.plan_partitions(5, 4 * 50, 4, 3, partition_bytes=8)
    groups = plan.by_server()
    assert sorted(p.index for parts in groups.values() for p in parts) == list(range(25))
    for server, parts in groups.items():
        assert all(p.server == server for p in parts)
        assert [p.offset for p in parts] == sorted(p.offset for p in parts)


def test_partitioner_uses_config_and_rejects_size_change():
    config = Config(num_servers=2, num_workers=2, partition_bytes=8, key_hash_fn="sdbm")
    partitioner = partition.Partitioner(config)
    plan = partitioner.plan(9, 32, 4)
    assert len(plan) == 4
    assert partitioner.plan(9, 32, 4) is plan
    expected = [keyhash.server_for_key((9 << 16) | i, 2, KeyHash.SDBM) for i in range(4)]
    assert [p.server for p in plan.partitions] == expected
    with pytest.raises(KeyLayoutError, match="key 9"):
        partitioner.plan(9, 64, 4)


# --- upstream MXNet encoding --------------------------------------------------------------

def test_cmd_cantor_pairing_table():
    table = {(0, 0): 0, (0, 1): 2, (0, 2): 5, (1, 0): 1, (1, 1): 4, (1, 2): 8, (2, 0): 3}
    for (request, dtype), cmd in table.items():
        request_type, mshadow = mxproto.RequestType(request), mxproto.MShadowType(dtype)
        assert mxproto.encode_cmd(request_type, mshadow) == cmd
        assert mxproto.decode_cmd(cmd) == mxproto.Cmd(request_type,
                                                      mxproto.SERVER_DTYPES[mshadow])


def test_dtype_codes():
    np = pytest.importorskip("numpy")
    assert upstream.dtype_code(np.float16) == mxproto.MShadowType.FLOAT16
    assert upstream.dtype_code(np.dtype("float64")) == mxproto.MShadowType.FLOAT64
    with pytest.raises(KeyLayoutError):
        upstream.dtype_code(np.complex64)


def test_small_array_server_uses_int32_arithmetic():
    assert upstream.mxnet_server_for_key(9, 2) == 1           # vector 22: (9*9973) % 2
    assert upstream.mxnet_server_for_key(215329, 2) == 1      # 2147476117, no overflow yet
    assert upstream.mxnet_server_for_key(215330, 2) == 0      # wraps to -2147481206; C: -0
    assert upstream.mxnet_server_for_key(215331, 1) == 0      # negative, but % 1 is 0
    assert upstream.mxnet_server_for_key(430660, 3) == 4884 % 3  # wrapped back to positive


def test_overflow_to_negative_remainder_is_refused():
    # 215331 * 9973 wraps to -2147471233, whose C remainder by 2 is -1.
    with pytest.raises(KeyLayoutError, match="server -1.*overflows int32"):
        upstream.mxnet_server_for_key(215331, 2)
    with pytest.raises(KeyLayoutError):
        upstream.encode_default_key(215331, 4, 4, 2)


def test_small_array_pskv():
    pskv = upstream.encode_default_key(9, 10, 2, 2)
    assert pskv.keys == (9223372036854775807 + 9,)
    assert pskv.lens == (20,) and pskv.size == 20


def test_big_array_split_matches_vector_21():
    pskv = upstream.encode_default_key(4, 200, 4, 2, bigarray_bound=100)
    assert pskv.lens == (400, 400)
    raw = (VECTORS / "21_push_bigarray_server1.d0.bin").read_bytes()
    lens = (VECTORS / "21_push_bigarray_server1.d2.bin").read_bytes()
    assert pskv.keys[1] == struct.unpack("<Q", raw)[0]
    assert pskv.lens[1] == struct.unpack("<i", lens)[0]


def test_big_array_split_rounds_half_away_from_zero():
    # 5 elements over 2 servers: round(2.5) = 3, so server 0 gets 3 and server 1 gets 2.
    assert upstream.encode_default_key(0, 5, 4, 2, bigarray_bound=1).lens == (12, 8)
    # 1 element over 3 servers: round(1/3)=0, round(2/3)=1, round(1)=1 -> parts 0, 1, 0.
    assert upstream.encode_default_key(0, 1, 4, 3, bigarray_bound=1).lens == (0, 4, 0)
    assert upstream.round_half_away(0.5) == 1 and upstream.round_half_away(0.49999) == 0
