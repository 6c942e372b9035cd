"""Copies without giving up the GIL (memory.copy_bytes, memory.join_bytes) and a partition's sum
copied into the outputs (routes.broadcast)."""
import types

import numpy as np
import pytest

from kvstore_byteps.engine import routes
from kvstore_byteps.engine.routes import broadcast
from kvstore_byteps.engine.trace import Tracer
from kvstore_byteps.errors import PeerError
from kvstore_byteps.memory import copy_bytes, join_bytes


def test_copy_bytes_fills_a_span_of_a_larger_array_and_nothing_else():
    target = np.zeros(16, np.uint8)
    copy_bytes(target[4:12], memoryview(bytearray(b"abcdefgh")))
    assert bytes(target) == b"\0" * 4 + b"abcdefgh" + b"\0" * 4


def test_copy_bytes_takes_any_buffer_of_the_same_byte_count():
    target = np.zeros(4, np.float32)
    copy_bytes(target, np.arange(4, dtype=np.float32).tobytes())
    assert target.tolist() == [0.0, 1.0, 2.0, 3.0]


def test_copy_bytes_refuses_a_buffer_of_another_size():
    with pytest.raises(ValueError):
        copy_bytes(np.zeros(4, np.uint8), b"abc")


def _item(outputs, offset, nbytes):
    context = types.SimpleNamespace(outputs=outputs,
                                    layout=types.SimpleNamespace(name="key 3"))
    partition = types.SimpleNamespace(offset=offset, nbytes=nbytes, ps_key=3)
    return types.SimpleNamespace(task=types.SimpleNamespace(context=context, step=0),
                                 partition=partition, key=3, index=0, priority=0)


def test_broadcast_copies_the_partition_into_every_output():
    outputs = [np.zeros(12, np.uint8) for _ in range(3)]
    broadcast(_item(outputs, 4, 4), memoryview(b"wxyz"), Tracer())
    for out in outputs:
        assert bytes(out) == b"\0" * 4 + b"wxyz" + b"\0" * 4


def test_broadcast_with_a_landed_answer_fills_only_the_other_outputs(monkeypatch):
    copied = []
    monkeypatch.setattr(routes, "copy_bytes",
                        lambda target, source: copied.append(target) or copy_bytes(target, source))
    landed = np.zeros(8, np.uint8)
    into = landed[2:6]                        # where the van was asked to land it
    into[:] = np.frombuffer(b"sums", np.uint8)
    other = np.zeros(8, np.uint8)
    answer = memoryview(into).cast("B")[0:4]  # the van received it there
    broadcast(_item([landed, other], 2, 4), answer, Tracer(), landed_in=into)
    assert bytes(other[2:6]) == b"sums" and bytes(landed[2:6]) == b"sums"
    assert len(copied) == 1 and copied[0].base is other


def test_broadcast_copies_into_the_landing_output_an_answer_that_came_elsewhere():
    landed, other = np.zeros(8, np.uint8), np.zeros(8, np.uint8)
    broadcast(_item([landed, other], 2, 4), memoryview(bytearray(b"sums")), Tracer(),
              landed_in=landed[2:6])
    assert bytes(landed[2:6]) == b"sums" and bytes(other[2:6]) == b"sums"


def test_broadcast_refuses_an_answer_of_the_wrong_size():
    with pytest.raises(PeerError, match="answered ps key 3 with 3 bytes, expected 4"):
        broadcast(_item([np.zeros(8, np.uint8)], 0, 4), memoryview(b"abc"), Tracer())


def test_join_bytes_puts_the_buffers_one_after_the_other():
    parts = [np.arange(3, dtype=np.float32), np.frombuffer(b"xy", np.uint8), bytearray(b"z")]
    joined = join_bytes(parts)
    assert joined.dtype == np.uint8
    assert joined.tobytes() == parts[0].tobytes() + b"xyz"


def test_join_bytes_of_nothing_is_empty():
    assert join_bytes([]).nbytes == 0


def test_one_frame_keeps_large_pieces_apart_and_joins_small_ones():
    from kvstore_byteps.memory import GATHER_MIN_PIECE_BYTES, one_frame
    from kvstore_byteps.van.wire.message import Gather
    large = [np.zeros(GATHER_MIN_PIECE_BYTES, np.uint8), np.ones(GATHER_MIN_PIECE_BYTES, np.uint8)]
    frame = one_frame(large)
    assert isinstance(frame, Gather) and frame.nbytes == 2 * GATHER_MIN_PIECE_BYTES
    assert frame.join() == bytes(GATHER_MIN_PIECE_BYTES) + b"\x01" * GATHER_MIN_PIECE_BYTES
    small = [np.arange(3, dtype=np.uint8), np.arange(3, 5, dtype=np.uint8)]
    assert one_frame(small).tolist() == [0, 1, 2, 3, 4]
    assert one_frame(small[:1]) is small[0]
