"""Key ranges and request slicing of the KV layer (pure)."""
import numpy as np
import pytest

from kvstore_byteps.van.wire.keys import key_range_of, server_key_ranges
from kvstore_byteps.van.kv.slicing import as_keys, slice_request


def test_ranges_match_upstream_for_two_servers():
    assert list(server_key_ranges(2)) == [(0, 9223372036854775807),
                                          (9223372036854775807, 18446744073709551614)]


def test_slice_by_lens_and_skip_empty_servers():
    ranges = server_key_ranges(3)
    keys = as_keys([1, 2, ranges[2].begin + 5])
    vals = np.arange(6, dtype=np.float32)
    parts = slice_request(keys, vals, np.array([8, 4, 12], np.int32), ranges)
    assert [p.server_rank for p in parts] == [0, 2]
    assert list(parts[0].keys) == [1, 2] and parts[0].vals.nbytes == 12
    assert np.array_equal(np.frombuffer(parts[1].vals, np.float32), [3, 4, 5])


def test_slice_evenly_without_lens():
    ranges = server_key_ranges(2)
    parts = slice_request(as_keys([0, ranges[1].begin]), np.arange(4, dtype=np.int32), None,
                          ranges)
    assert [np.frombuffer(p.vals, np.int32).tolist() for p in parts] == [[0, 1], [2, 3]]


@pytest.mark.parametrize("keys,vals,lens,match", [
    ([1, 2], b"abc", None, "evenly"), ([1, 2], b"abcd", [1, 2], "sum to 3"),
    ([1, 2], b"ab", [2], "1 entries for 2 keys")])
def test_bad_slices(keys, vals, lens, match):
    with pytest.raises(ValueError, match=match):
        slice_request(as_keys(keys), vals, None if lens is None else np.array(lens, np.int32),
                      server_key_ranges(1))


def test_keys_must_be_sorted_and_range_lookup():
    with pytest.raises(ValueError):
        as_keys([4, 3])
    # a key may repeat, as in ps-lite: a row_sparse request's first row is its master's key
    assert as_keys([3, 3, 5]).tolist() == [3, 3, 5]
    ranges = server_key_ranges(4)
    assert key_range_of(ranges[3].begin, ranges)[0] == 3


def test_a_request_for_one_server_is_one_slice_and_still_checked():
    ranges = server_key_ranges(2)
    keys = as_keys([ranges[1].begin, ranges[1].begin + 3])
    vals = np.arange(6, dtype=np.float32)
    (part,) = slice_request(keys, vals, np.array([8, 16], np.int32), ranges)
    assert part.server_rank == 1 and part.vals.nbytes == 24 and list(part.lens) == [8, 16]
    with pytest.raises(ValueError, match="lens sum to 20"):
        slice_request(keys, vals, np.array([8, 12], np.int32), ranges)
    with pytest.raises(ValueError, match="cannot be split evenly"):
        slice_request(keys, np.arange(5, dtype=np.uint8), None, ranges)


def test_a_gathered_vals_frame_stays_in_pieces_for_one_server_and_is_joined_across_two():
    from kvstore_byteps.van.wire.message import Gather
    ranges = server_key_ranges(2)
    pieces = Gather([np.arange(2, dtype=np.float32), np.arange(2, 5, dtype=np.float32)])
    parts = slice_request(as_keys([1, 2]), pieces, np.array([8, 12], np.int32), ranges)
    assert len(parts) == 1 and parts[0].vals is pieces        # no copy
    with pytest.raises(ValueError, match="sum to 16"):
        slice_request(as_keys([1, 2]), pieces, np.array([8, 8], np.int32), ranges)
    parts = slice_request(as_keys([1, ranges[1].begin]), pieces, np.array([8, 12], np.int32),
                          ranges)
    assert [np.frombuffer(p.vals, np.float32).tolist() for p in parts] == [[0, 1], [2, 3, 4]]


def test_a_gather_counts_and_joins_its_pieces():
    from kvstore_byteps.van.wire.message import Gather, Message, Meta, contiguous
    frame = Gather([b"ab", np.array([1], np.int32), memoryview(b"c")])
    message = Message(Meta(), [np.zeros(1, np.uint64), frame])
    assert message.data_bytes() == 8 + 7 and frame.nbytes == 7
    assert contiguous(message.data)[1] == b"ab\x01\x00\x00\x00c"
    with pytest.raises(TypeError):
        memoryview(frame)                    # a van that forgot it fails, never sends it wrong
