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
        as_keys([3, 3])
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
