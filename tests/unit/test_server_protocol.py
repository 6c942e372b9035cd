"""Server request decoding: cmd pairing, dtypes, frame layouts, 2-bit compression (no sockets)."""
import numpy as np
import pytest

from kvstore_byteps.errors import ProtocolError
from kvstore_byteps.compress.twobit import CompressionType, dequantize_2bit, \
    packed_nbytes_2bit, parse_twobit_params, quantize_2bit
from kvstore_byteps.mxproto import Cmd, RequestType, cantor_pair, cantor_unpair, decode_cmd, \
    encode_cmd
from kvstore_byteps.serving.protocol import CompressedPush, parse_compressed, parse_dense, \
    parse_row_sparse
from tests.support.server_fakes import WORKER0, request, vector_request

F32, F64, F16 = np.dtype(np.float32), np.dtype(np.float64), np.dtype(np.float16)
SERVER1_BEGIN = (2 ** 64 - 1) // 2


@pytest.mark.parametrize("cmd,rtype,dtype", [
    (0, RequestType.DEFAULT, F32), (2, RequestType.DEFAULT, F64), (5, RequestType.DEFAULT, F16),
    (1, RequestType.ROW_SPARSE, F32), (4, RequestType.ROW_SPARSE, F64),
    (8, RequestType.ROW_SPARSE, F16), (3, RequestType.COMPRESSED, F32),
    (6, RequestType.BYTEPS, F32), (11, RequestType.BYTEPS, F64), (17, RequestType.BYTEPS, F16),
])
def test_cmd_table_of_the_spec_and_our_byteps_marker(cmd, rtype, dtype):
    assert decode_cmd(cmd) == Cmd(rtype, dtype)
    assert encode_cmd(rtype, dtype) == cmd


def test_cantor_pairing_round_trips_exactly_for_large_values():
    for a in range(0, 40):
        for b in range(0, 40):
            assert cantor_unpair(cantor_pair(a, b)) == (a, b)
    assert cantor_unpair(cantor_pair(10 ** 9, 3)) == (10 ** 9, 3)


@pytest.mark.parametrize("cmd,words", [
    (cantor_pair(0, 4), "int32"), (cantor_pair(0, 12), "bfloat16"),
    (cantor_pair(0, 13), "mshadow code 13"), (cantor_pair(2, 1), None),
])
def test_unsupported_dtypes_are_refused_by_name(cmd, words):
    if words is None:   # compressed float64 decodes; parse_compressed refuses it
        assert decode_cmd(cmd).request_type is RequestType.COMPRESSED
        return
    with pytest.raises(ProtocolError, match="unsupported dtype .*%s" % words):
        decode_cmd(cmd)


def test_unknown_request_type_and_negative_cmd_are_refused():
    with pytest.raises(ProtocolError, match="unknown request type 7"):
        decode_cmd(cantor_pair(7, 0))      # 4-6 are ours: compressed, recovery, link test
    with pytest.raises(ProtocolError, match="bad cmd"):
        decode_cmd(-1)


def test_golden_pushes_and_pulls_parse():
    init = parse_dense(vector_request("11_push_init_request"), decode_cmd(0))
    assert (init.ps_key, init.push, init.pull) == (5, True, False)
    assert init.values.dtype == F32 and (init.values == 0).all() and init.values.size == 100
    r1 = parse_dense(vector_request("13_push_request_r1"), decode_cmd(0))
    assert (r1.values == 2.0).all()
    pull = parse_dense(vector_request("14_pull_request"), decode_cmd(0))
    assert (pull.ps_key, pull.push, pull.pull, pull.values) == (5, False, True, None)
    fp16 = parse_dense(vector_request("22_pushpull_fp16_request"), decode_cmd(5))
    assert fp16.push and fp16.pull and fp16.values.dtype == F16 and fp16.values.size == 4
    assert fp16.ps_key == SERVER1_BEGIN + 9


def test_golden_row_sparse_layouts_parse():
    init = parse_row_sparse(vector_request("24_rowsparse_init_push"), decode_cmd(1))
    assert init.master_key == SERVER1_BEGIN + 7
    assert list(init.rows) == [0, 1, 2, 3, 4, 5] and init.values.shape == (6, 2)
    pulled = parse_row_sparse(vector_request("25_rowsparse_pull_request"), decode_cmd(1))
    assert list(pulled.rows) == [1, 2] and pulled.values is None and not pulled.push


@pytest.mark.parametrize("keys,vals,lens,match", [
    ([], None, None, "no keys"),
    ([1, 2], np.zeros(2, np.float32), [4, 4], "expected 1 key"),
    ([1], np.zeros(2, np.float32), None, "one lens entry per key"),
    ([1], np.zeros(2, np.float32), [4], "vals frame has 8 bytes, lens say 4"),
    ([1], np.zeros(3, np.uint8), [3], "not a whole number of float32"),
    ([1], np.zeros(1, np.float32), [-4], "negative lens"),
])
def test_malformed_default_pushes_are_refused(keys, vals, lens, match):
    req = request(WORKER0, keys, vals, lens, push=True)
    with pytest.raises(ProtocolError, match=match):
        parse_dense(req, decode_cmd(0))


def test_request_that_neither_pushes_nor_pulls_is_refused():
    with pytest.raises(ProtocolError, match="neither a push nor a pull"):
        parse_dense(request(WORKER0, [1]), decode_cmd(0))


def test_malformed_row_sparse_pushes_are_refused():
    rows = np.ones((2, 3), np.float32)
    with pytest.raises(ProtocolError, match="lens\\[0\\] must be 0"):
        parse_row_sparse(request(WORKER0, [10, 10, 11], rows, [4, 12, 12], push=True),
                         decode_cmd(1))
    with pytest.raises(ProtocolError, match="same non-zero byte length"):
        parse_row_sparse(request(WORKER0, [10, 10, 11], rows, [0, 12, 8], push=True), decode_cmd(1))
    with pytest.raises(ProtocolError, match="below the master key"):
        parse_row_sparse(request(WORKER0, [10, 9], rows[:1], [0, 12], push=True), decode_cmd(1))


def test_golden_compressed_push_decodes_to_88_positive_thresholds():
    parsed = parse_compressed(vector_request("32_push_compressed"), decode_cmd(3), SERVER1_BEGIN,
                              packed_nbytes_2bit)
    assert isinstance(parsed, CompressedPush)
    assert (parsed.ps_key, parsed.original_size) == (SERVER1_BEGIN + 1, 88)
    values = dequantize_2bit(parsed.packed, parsed.original_size, 0.5)
    # 22 bytes of 0xff (88 codes "11" = +threshold) then 2 bytes of unused zero codes
    assert values.dtype == F32 and values.size == 88 and (values == 0.5).all()


def test_compressed_push_with_wrong_size_or_dtype_is_refused():
    req = request(WORKER0, [SERVER1_BEGIN + 88, SERVER1_BEGIN + 1], np.zeros(20, np.uint8),
                  [0, 20], push=True, head=3)
    with pytest.raises(ProtocolError, match="must carry 24 bytes"):
        parse_compressed(req, decode_cmd(3), SERVER1_BEGIN, packed_nbytes_2bit)
    with pytest.raises(ProtocolError, match="must be float32"):
        parse_compressed(req, Cmd(RequestType.COMPRESSED, F64), SERVER1_BEGIN, packed_nbytes_2bit)


def test_two_bit_layout_is_msb_first_within_bytes():
    # values 0..3 of a word live in byte 0, first value in bits 7-6; 11 = +t, 10 = -t, else 0
    packed = bytes([0b11_10_00_01, 0b00_00_00_11, 0, 0])
    out = dequantize_2bit(packed, 6, 0.25)
    assert list(out) == [0.25, -0.25, 0.0, 0.0, 0.0, 0.0]
    assert list(dequantize_2bit(packed, 8, 0.25))[7] == 0.25


def test_two_bit_quantize_matches_mxnet_rules_and_round_trips():
    grad = np.array([0.6, -0.6, 0.2, -0.49, 0.5, -0.5, 1.7] + [0.0] * 10, np.float32)
    packed, residual = quantize_2bit(grad, 0.5)
    assert len(packed) == packed_nbytes_2bit(grad.size) == 8
    out = dequantize_2bit(packed, grad.size, 0.5)
    assert list(out[:7]) == [0.5, -0.5, 0.0, 0.0, 0.5, -0.5, 0.5]
    np.testing.assert_allclose(out + residual, grad, rtol=0, atol=1e-6)
    packed2, _ = quantize_2bit(np.zeros_like(grad), 0.5, residual)   # residual carries over
    assert dequantize_2bit(packed2, grad.size, 0.5)[6] == 0.5


def test_compression_parameters_as_mxnet_sends_them():
    params = parse_twobit_params(vector_request("31_cmd_gradient_compression").meta.body)
    assert params.type is CompressionType.TWO_BIT and params.threshold == 0.5 and params.enabled
    assert not parse_twobit_params(b"0").enabled
    for bad in (b"", b"x,1", b"7,0.5", b"1,-2", b"1,0.5,3"):
        with pytest.raises(ProtocolError, match="gradient compression"):
            parse_twobit_params(bad)
