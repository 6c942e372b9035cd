"""row_sparse keys on KVStoreDistServer without whole-array copies: a round's rows summed without a
zeroed table. Same bits as before."""
import numpy as np
import pytest

from kvstore_byteps.serving.store import sum_rows

SHAPE = (40, 3)


def old_sum(pushes, shape, dtype):
    """The round's sum as the server took it before: np.add.at into a zeroed table."""
    merged, touched = np.zeros(shape, dtype), np.zeros(shape[0], bool)
    for rows, values in pushes:
        np.add.at(merged, rows, values.astype(dtype))
        touched[rows] = True
    indices = np.flatnonzero(touched)
    return indices, merged[indices]


def same_bits(got, want):
    assert got.dtype == want.dtype and got.shape == want.shape
    assert got.tobytes() == want.tobytes()


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.float64])
def test_sums_equal_np_add_at_with_repeats_within_and_across_pushes(dtype):
    rng = np.random.RandomState(3)
    for _ in range(20):
        pushes = [(rng.randint(0, SHAPE[0], rng.randint(1, 30)).astype(np.int64),
                   rng.randn(0, 3).astype(dtype)) for _ in range(rng.randint(1, 5))]
        pushes = [(rows, rng.randn(len(rows), 3).astype(dtype)) for rows, _ in pushes]
        grad = sum_rows(pushes, SHAPE, np.dtype(dtype))
        indices, data = old_sum(pushes, SHAPE, dtype)
        same_bits(grad.indices, indices)
        same_bits(grad.data, data)
        assert grad.shape == SHAPE


def test_a_negative_zero_sums_to_zero_as_from_a_zeroed_table():
    pushes = [(np.array([1, 2]), np.array([[-0.0] * 3, [-0.0] * 3], np.float32)),
              (np.array([2]), np.array([[-0.0, 1.0, -0.0]], np.float32))]
    same_bits(sum_rows(pushes, SHAPE, np.dtype(np.float32)).data,
              old_sum(pushes, SHAPE, np.float32)[1])


def test_no_pushes_with_rows_sum_to_no_rows():
    grad = sum_rows([], SHAPE, np.dtype(np.float16))
    indices, data = old_sum([], SHAPE, np.float16)
    same_bits(grad.indices, indices)
    same_bits(grad.data, data)
