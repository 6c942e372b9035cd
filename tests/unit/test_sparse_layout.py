"""The row_sparse request layout (kvstore_byteps/engine/sparse.py), as MXNet 1.9.1's
EncodeRowSparseKey lays it out, and our servers' master keys apart from every dense
partition."""
import numpy as np

from kvstore_byteps.config import Config
from kvstore_byteps.engine.layout import BytePSDialect, MXNetDialect
from kvstore_byteps.engine.partition import ROW_SPARSE_INDEX, encode_ps_key
from kvstore_byteps.engine.sparse import row_ranges, row_request
from kvstore_byteps.engine.upstream import mxnet_server_for_key


def test_a_small_key_goes_to_mxnets_server_for_it_master_then_one_key_per_row():
    masters = [1000, 2000, 3000]
    rows = np.array([0, 3, 5], dtype=np.int64)
    request = row_request(4, rows, unit_len=2, total_rows=6, itemsize=4, masters=masters,
                          bigarray_bound=1000)
    master = masters[mxnet_server_for_key(4, 3)]
    assert request.keys.tolist() == [master, master, master + 3, master + 5]
    assert request.lens.tolist() == [0, 8, 8, 8]
    assert request.rows.tolist() == [0, 3, 5]


def test_a_big_key_is_split_by_mxnets_row_ranges_every_server_named_even_without_rows():
    assert row_ranges(10, 3) == [(0, 3), (3, 7), (7, 10)]     # llround(10/3*i): 0 3 7 10
    masters = [100, 200, 300]
    rows = np.array([1, 7, 9], dtype=np.int64)
    request = row_request(2, rows, unit_len=5, total_rows=10, itemsize=2, masters=masters,
                          bigarray_bound=50)
    # server 0: rows 1 -> 100+1; server 1: no rows, its master alone; server 2: 7, 9 -> 0, 2
    assert request.keys.tolist() == [100, 101, 200, 300, 300, 302]
    assert request.lens.tolist() == [0, 10, 0, 0, 10, 10]
    assert request.rows.tolist() == [1, 7, 9]
    assert np.all(np.diff(request.keys.astype(np.int64)) >= 0)     # ascending, as sent


def test_an_empty_push_names_the_masters_only():
    request = row_request(2, np.zeros(0, dtype=np.int64), 5, 10, 4, [100, 200], 10)
    assert request.keys.tolist() == [100, 200] and request.lens.tolist() == [0, 0]


def test_our_servers_master_keys_meet_no_dense_partition_mxnets_are_its_own():
    config = Config(num_workers=1, num_servers=3)
    ours, theirs = BytePSDialect(config, 3), MXNetDialect(config, 3)
    for key in (0, 1, 5):
        masters = ours.row_masters(key)
        assert masters == [encode_ps_key(key, ROW_SPARSE_INDEX, s, 3) for s in range(3)]
        dense = {encode_ps_key(k, i, s, 3) for k in range(8) for i in range(4) for s in range(3)}
        assert not dense & set(masters)
        assert theirs.row_masters(key)[1] - theirs.row_masters(0)[1] == key


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
