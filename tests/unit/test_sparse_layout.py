"""The row_sparse request layout (kvstore_byteps/engine/sparse.py): MXNet 1.9.1's
EncodeRowSparseKey on MXNet's servers; on ours, ranges of about ROW_RANGE_BYTES interleaved over
the servers, their master keys apart from every dense partition and naming their key."""
import numpy as np

from kvstore_byteps.config import Config
from kvstore_byteps.engine.layout import BytePSDialect, MXNetDialect
from kvstore_byteps.engine.partition import encode_ps_key
from kvstore_byteps.engine.sparse import (ROW_RANGE_BYTES, RowRange, chunked_ranges,
                                          mxnet_ranges, row_parts, row_ranges)
from kvstore_byteps.engine.upstream import mxnet_server_for_key
from kvstore_byteps.van.wire.keys import (ROW_RANGES_PER_SERVER, row_sparse_key,
                                          server_key_range, server_of_key)


def _request(rows, ranges, row_bytes, every_range=True):
    parts = row_parts(np.array(rows, dtype=np.int64), ranges, row_bytes, every_range)
    return ([part.range for part in parts], [part.keys.tolist() for part in parts],
            [part.lens.tolist() for part in parts], [(part.lo, part.hi) for part in parts])


def test_a_small_key_goes_to_mxnets_server_for_it_master_then_one_key_per_row():
    masters = [1000, 2000, 3000]
    ranges = mxnet_ranges(4, total_rows=6, unit_len=2, masters=masters, bigarray_bound=1000)
    master = masters[mxnet_server_for_key(4, 3)]
    assert ranges == [RowRange(0, 6, master)]
    assert _request([0, 3, 5], ranges, 8) == (
        [0], [[master, master, master + 3, master + 5]], [[0, 8, 8, 8]], [(0, 3)])


def test_a_big_key_is_split_by_mxnets_row_ranges_every_server_named_on_a_push():
    assert row_ranges(10, 3) == [(0, 3), (3, 7), (7, 10)]     # llround(10/3*i): 0 3 7 10
    ranges = mxnet_ranges(2, total_rows=10, unit_len=5, masters=[100, 200, 300],
                          bigarray_bound=50)
    assert ranges == [RowRange(0, 3, 100), RowRange(3, 7, 200), RowRange(7, 10, 300)]
    # server 0: row 1 -> 100+1; server 1: no rows, its master alone; server 2: 7, 9 -> 0, 2
    assert _request([1, 7, 9], ranges, 10) == (
        [0, 1, 2], [[100, 101], [200], [300, 300, 302]], [[0, 10], [0], [0, 10, 10]],
        [(0, 1), (1, 1), (1, 3)])
    # a pull names only the ranges holding rows it asks for
    assert _request([1, 7, 9], ranges, 10, every_range=False)[0] == [0, 2]


def test_an_empty_push_names_the_masters_only():
    ranges = mxnet_ranges(2, 10, 5, [100, 200], 10)
    assert _request([], ranges, 20)[1] == [[100], [200]]
    assert _request([], ranges, 20, every_range=False)[0] == []


def test_our_servers_cut_a_big_key_into_ranges_of_about_the_range_bytes_interleaved():
    master = lambda server, c: server * 1000 + c             # noqa: E731
    # 100 rows of 40 bytes in ranges of ~1000 bytes: 4 ranges; key 0 starts on server 0
    ranges = chunked_ranges(0, 100, 40, num_servers=2, range_bytes=1000, master=master)
    assert [(r.first, r.end) for r in ranges] == [(0, 25), (25, 50), (50, 75), (75, 100)]
    assert [r.master for r in ranges] == [0, 1000, 1, 1001]
    # at most ROW_RANGES_PER_SERVER a server, at least a row each, one for a small key
    assert len(chunked_ranges(0, 10 ** 6, 40, 2, 1000, master)) == 2 * ROW_RANGES_PER_SERVER
    assert len(chunked_ranges(0, 3, 4000, 2, 1000, master)) == 3
    assert len(chunked_ranges(5, 3, 4, 2, 1000, master)) == 1
    # range bytes 0 (a fast link): a range a server, one for keys under ROW_RANGE_BYTES
    assert [r.master for r in chunked_ranges(0, 30522, 3072, 2, 0, master)] == [0, 1000]
    assert len(chunked_ranges(0, 100, 40, 2, 0, master)) == 1
    assert chunked_ranges(5, 3, 4, 3, 1000, master)[0].master == \
        master(mxnet_server_for_key(5, 3), 0)


def test_our_servers_masters_meet_no_dense_partition_and_name_their_key():
    config = Config(num_workers=1, num_servers=3, row_range_bytes=ROW_RANGE_BYTES)
    ours, theirs = BytePSDialect(config, 3), MXNetDialect(config, 3)
    dense = {encode_ps_key(k, i, s, 3) for k in range(8) for i in range(4) for s in range(3)}
    for key in (0, 1, 5):
        # BERT's 93.8 MB embedding: 23 ranges of ROW_RANGE_BYTES, 7 or 8 a server
        ranges = ours.row_ranges(key, 30522, 768, 4)
        assert len(ranges) == 23 and not dense & {r.master for r in ranges}
        assert len({r.master for r in ranges}) == 23
        for r in ranges:
            server = server_of_key(r.master, 3)
            local = r.master - server_key_range(server, 3).begin
            assert row_sparse_key(local) == key
    assert row_sparse_key(5 << 16 | 3) is None          # a dense partition's local key
    assert theirs.row_ranges(7, 6, 2, 4) == [RowRange(
        0, 6, server_key_range(mxnet_server_for_key(7, 3), 3).begin + 7)]


def test_mxnets_2bit_layout_splits_big_keys_by_packed_words_small_keys_go_whole():
    from kvstore_byteps.engine.upstream import encode_compressed_key
    assert encode_compressed_key(9, 6, 4) == ((mxnet_server_for_key(9, 4), 6, 1),)
    # 1,000 values: 63 words over 2 servers, round(31.5) = 32 words (512 values), the rest
    assert encode_compressed_key(3, 1000, 2, bigarray_bound=100) == ((0, 512, 32),
                                                                    (1, 488, 31))
    config = Config(num_workers=1, num_servers=2, bigarray_bound=100)
    theirs = MXNetDialect(config, 2)
    plain = [p.nbytes for p in theirs.partitions(3, 4000, 4)]
    theirs.compress_twobit()
    packed = theirs.partitions(3, 4000, 4)
    assert plain == [2000, 2000] and [p.nbytes for p in packed] == [2048, 1952]
    assert [p.offset for p in packed] == [0, 2048] and [p.server for p in packed] == [0, 1]
