"""Gradient compressors, their parameters and per-partition state (kvstore_byteps.compress)."""
import numpy as np
import pytest

from kvstore_byteps.compress.codecs import Dithering, OneBit, RandomK, TopK, TwoBit, k_of
from kvstore_byteps.compress.params import CompressionSpec, parse_compression_params
from kvstore_byteps.compress.state import PartitionCompressor
from kvstore_byteps.errors import ConfigError


RNG = np.random.default_rng(7)


X = RNG.standard_normal(1001).astype(np.float32)


def round_trip(codec, x=X, step=3):
    data = codec.encode(x, step)
    assert data.dtype == np.uint8 and data.size == codec.wire_bytes(x.size)
    return data, codec.decode(data, x.size, step)


def test_onebit_sends_signs_and_the_mean_magnitude():
    data, got = round_trip(OneBit(scaling=True))
    assert data.size == 4 + 126                               # 1001 bits -> 126 bytes
    scale = np.float32(np.mean(np.abs(X)))
    np.testing.assert_array_equal(got, np.where(X < 0, -scale, scale))
    _, unscaled = round_trip(OneBit())
    np.testing.assert_array_equal(unscaled, np.where(X < 0, -1, 1))
    assert OneBit().wire_bytes(4096000 // 4) * 32 <= 4096000 + 32 * 4   # ~1/32 of fp32


def test_topk_keeps_exactly_the_largest_magnitudes():
    data, got = round_trip(TopK(10))
    assert data.size == 80
    largest = np.argsort(-np.abs(X))[:10]
    np.testing.assert_array_equal(np.nonzero(got)[0], np.sort(largest))
    np.testing.assert_array_equal(got[largest], X[largest])
    assert TopK(0.01).wire_bytes(1001) == 8 * 11 and k_of(0.01, 1001) == 11


def test_randomk_draws_the_same_indices_everywhere_for_a_round_and_sends_only_values():
    worker_a, worker_b = RandomK(50, seed=3, salt=9), RandomK(50, seed=3, salt=9)
    data, got = round_trip(worker_a, step=5)
    assert data.size == 200
    np.testing.assert_array_equal(worker_a.indices(1001, 5), worker_b.indices(1001, 5))
    assert not np.array_equal(worker_a.indices(1001, 5), worker_a.indices(1001, 6))
    assert not np.array_equal(worker_a.indices(1001, 5), RandomK(50, 3, salt=10).indices(1001, 5))
    kept = worker_a.indices(1001, 5)
    np.testing.assert_array_equal(got[kept], X[kept])
    assert np.count_nonzero(got) == 50


@pytest.mark.parametrize("partition", ["linear", "natural"])
@pytest.mark.parametrize("normalize", ["max", "l2"])
def test_dithering_is_unbiased_and_within_one_level(partition, normalize):
    codec = Dithering(4, partition, normalize, seed=1, salt=2)
    data, got = round_trip(codec)
    assert data.size == 4 + 1001
    norm = np.max(np.abs(X)) if normalize == "max" else np.linalg.norm(X)
    levels = codec._levels() * norm
    gap = np.max(np.diff(levels))
    assert np.all(np.abs(got - X) <= gap + 1e-5)                  # never more than one level
    assert np.all(np.isin(np.round(np.abs(got), 4), np.round(levels, 4)))
    mean = np.mean([codec.decode(codec.encode(X, s), X.size, s) for s in range(400)], axis=0)
    assert np.max(np.abs(mean - X)) < 0.2 * norm * (1 if normalize == "max" else 0.1)


def test_twobit_is_mxnets_threshold_quantisation():
    x = np.array([0.7, -0.6, 0.1, -0.49, 0.5, 0, -0.5], np.float32)
    data, got = round_trip(TwoBit(0.5), x)
    assert data.size == 2
    np.testing.assert_array_equal(got, [0.5, -0.5, 0, 0, 0.5, 0, -0.5])


def test_an_all_zero_partition_round_trips_to_zeros():
    zeros = np.zeros(33, np.float32)
    for codec in (OneBit(True), TopK(3), RandomK(3), Dithering(4), TwoBit(0.5)):
        assert not np.any(round_trip(codec, zeros)[1]), codec


def test_error_feedback_delays_and_never_loses():
    spec = parse_compression_params({"compressor": "onebit", "ef": "vanilla", "scaling": True})
    part = PartitionCompressor(spec, salt=1)
    grads = [RNG.standard_normal(257).astype(np.float32) for _ in range(30)]
    sent = sum(part.decode(part.encode(g, step), 257, step) for step, g in enumerate(grads))
    np.testing.assert_allclose(sent + part.residual, sum(grads), rtol=1e-4, atol=1e-4)


def test_nesterov_momentum_is_applied_before_compression():
    spec = parse_compression_params({"compressor": "topk", "k": 2, "momentum": "nesterov",
                                     "momentum_mu": 0.5})
    part = PartitionCompressor(spec)
    g = np.array([1.0, -2.0], np.float32)
    first = part.decode(part.encode(g, 0), 2, 0)      # m = g; g + 0.5 m = 1.5 g
    np.testing.assert_allclose(first, 1.5 * g)
    second = part.decode(part.encode(g, 1), 2, 1)     # m = 0.5 g + g; g + 0.5 m = 1.75 g
    np.testing.assert_allclose(second, 1.75 * g)


def test_byteps_and_mxnet_forms_are_accepted():
    spec = parse_compression_params({"compressor": "onebit", "ef": "vanilla",
                                     "momentum": "nesterov", "scaling": True})
    assert spec == CompressionSpec("onebit", ef="vanilla", momentum="nesterov", scaling=True)
    assert parse_compression_params({"type": "2bit", "threshold": 0.25}) == CompressionSpec(
        "twobit", ef="vanilla", threshold=0.25, min_compress_bytes=0)
    dither = parse_compression_params({"compressor": "dithering", "k": 8,
                                       "partition": "natural", "normalize": "l2", "seed": 4})
    assert dither.codec(salt=3) == Dithering(8, "natural", "l2", 4, 3)
    assert parse_compression_params({"compressor": "randomk", "k": 0.01}).codec(5) == \
        RandomK(0.01, 0, 5)


@pytest.mark.parametrize("params,named", [
    ({"compressor": "twobits"}, "compressor='twobits'; accepted: 'onebit', 'topk'"),
    ({"compressor": "onebit", "ef": "fancy"}, "ef='fancy'; accepted: 'vanilla'"),
    ({"compressor": "onebit", "scaling": "yes"}, "scaling='yes'"),
    ({"compressor": "topk"}, "topk needs 'k'"),
    ({"compressor": "topk", "k": 0}, "k=0"),
    ({"compressor": "dithering", "k": 300}, "k=300"),
    ({"compressor": "dithering", "partition": "log"}, "partition='log'"),
    ({"compressor": "onebit", "momentum_mu": 1.5}, "momentum_mu=1.5"),
    ({"compressor": "onebit", "fp16": True}, "unknown key 'fp16'"),
    ({"ef": "vanilla"}, "'compressor' is required"),
    ({"type": "1bit"}, "type='1bit'; accepted: '2bit'"),
    ({"type": "2bit", "threshold": -1}, "threshold=-1"),
    ({"type": "2bit", "compressor": "onebit"}, "'compressor' is not an MXNet compression key"),
    ("onebit", "expected a dict"),
])
def test_bad_parameters_get_one_error_naming_the_key(params, named):
    with pytest.raises(ConfigError) as error:
        parse_compression_params(params)
    assert named in str(error.value)
