"""What a worker hands over to one that takes a departed worker's place in an elastic job
where the workers update (the servers only sum): its parameters and its optimizer's state
(kvstore_byteps/elastic.py; through server rank 0, serving/joins.py).

The bytes are ``MAGIC``, an 8-byte little-endian header length, a JSON header (the arrays'
names, dtypes and shapes, and the caller's JSON ``meta``) and the arrays' bytes in that order.
No pickle: they come off the network; :func:`decode` checks every dtype and size.
:func:`of_trainer` and :func:`to_trainer` take them from and put them in a gluon Trainer
(MXNet is imported by the Trainer's objects only).
"""
import json
import struct
from typing import Dict, Tuple

import numpy as np

__all__ = ["decode", "encode", "of_trainer", "to_trainer"]

MAGIC = b"KBHO1"
#: the dtypes parameters and optimizer states come in
DTYPES = ("float16", "float32", "float64", "int8", "uint8", "int32", "int64")


def encode(arrays: Dict[str, np.ndarray], meta: dict) -> bytes:
    """``arrays`` and JSON ``meta`` as bytes (see the module)."""
    names = sorted(arrays)
    header = json.dumps({"meta": meta, "arrays": [
        [name, str(arrays[name].dtype), list(arrays[name].shape)] for name in names]}).encode()
    body = b"".join(np.ascontiguousarray(arrays[name]).tobytes() for name in names)
    return MAGIC + struct.pack("<Q", len(header)) + header + body


def decode(data: bytes) -> Tuple[dict, Dict[str, np.ndarray]]:
    """``(meta, arrays)`` from :func:`encode`'s bytes; ValueError naming what is wrong."""
    data = memoryview(bytes(data))
    start = len(MAGIC) + 8
    if len(data) < start or bytes(data[:len(MAGIC)]) != MAGIC:
        raise ValueError("a hand-over of %d bytes that does not start as one" % len(data))
    size = struct.unpack("<Q", data[len(MAGIC):start])[0]
    try:
        header = json.loads(bytes(data[start:start + size]))
        entries, meta = header["arrays"], header["meta"]
    except (ValueError, KeyError, TypeError) as exc:
        raise ValueError("a hand-over whose header is unreadable: %s" % exc) from None
    arrays, offset = {}, start + size
    for name, dtype, shape in entries:
        if dtype not in DTYPES or not all(isinstance(n, int) and n >= 0 for n in shape):
            raise ValueError("a hand-over array %r of dtype %r, shape %r" % (name, dtype, shape))
        nbytes = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
        if offset + nbytes > len(data):
            raise ValueError("a hand-over cut short in array %r" % name)
        arrays[name] = np.frombuffer(data[offset:offset + nbytes], dtype).reshape(shape).copy()
        offset += nbytes
    if offset != len(data):
        raise ValueError("a hand-over with %d bytes past its arrays" % (len(data) - offset))
    return meta, arrays


def _flatten(state, prefix: str, arrays: dict):
    """An updater's state (None, an NDArray, or tuples/lists of them) as JSON structure,
    its NDArrays into ``arrays``."""
    if state is None:
        return None
    if isinstance(state, (tuple, list)):
        return [_flatten(part, "%s.%d" % (prefix, i), arrays) for i, part in enumerate(state)]
    arrays[prefix] = state.asnumpy()
    return prefix


def _build(structure, arrays: dict):
    import mxnet as mx
    if structure is None:
        return None
    if isinstance(structure, list):
        return tuple(_build(part, arrays) for part in structure)
    value = arrays[structure]
    return mx.nd.array(value, dtype=value.dtype)


def of_trainer(trainer) -> bytes:
    """A gluon Trainer's parameters (its first device's copy) and optimizer state."""
    arrays: Dict[str, np.ndarray] = {}
    for i, param in enumerate(trainer._params):
        arrays["param/%d" % i] = param.data(param.list_ctx()[0]).asnumpy()
    states = [{str(index): _flatten(state, "state/%d/%d" % (u, index), arrays)
               for index, state in updater.states.items()}
              for u, updater in enumerate(trainer._updaters)]
    optimizer = trainer._optimizer
    meta = {"states": states, "num_update": optimizer.num_update,
            "index_update_count": {str(k): v for k, v
                                   in optimizer._index_update_count.items()}}
    return encode(arrays, meta)


def to_trainer(trainer, data: bytes) -> None:
    """Put :func:`of_trainer`'s bytes in a gluon Trainer whose parameters are initialised;
    ValueError where they do not fit it."""
    import mxnet as mx
    meta, arrays = decode(data)
    for i, param in enumerate(trainer._params):
        value = arrays.get("param/%d" % i)
        if value is None or tuple(value.shape) != tuple(param.shape):
            raise ValueError("the hand-over's parameter %d (%s) does not fit %s %s"
                             % (i, None if value is None else value.shape, param.name,
                                param.shape))
        param.set_data(mx.nd.array(value, dtype=value.dtype))
    states = meta.get("states") or [{}]
    for u, updater in enumerate(trainer._updaters):
        for index, structure in states[min(u, len(states) - 1)].items():
            updater.states[int(index)] = _build(structure, arrays)
            updater.states_synced[int(index)] = False     # moved to the weight's device
    optimizer = trainer._optimizer
    optimizer.num_update = int(meta.get("num_update", optimizer.num_update))
    optimizer._index_update_count.update(
        {int(k): int(v) for k, v in (meta.get("index_update_count") or {}).items()})
