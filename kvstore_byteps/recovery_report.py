"""The report a ``dist_byteps`` worker sends a restarted server (BYTEPS_SERVER_RECOVERY). Pure.

A server keeps only the sums of the rounds in flight, so what it lost lives on in the workers:
per ps key, how many rounds each worker pushed and how many of its pulls were answered, and the
data of its last two pushes. Why two: worker A may have pulled round r and pushed r+1 while
worker B still waits for round r's sum; only A's copy of its round-r push rebuilds that sum.

On the wire it is one request (cmd = cantor(5, 0), push) to the restarted server:

* body: JSON ``{"keys": [[ps_key, mshadow dtype code, bytes, pushed, answered], ...]}``;
* keys / vals / lens: for each entry in order, the data of its latest push (round pushed-1) if
  it pushed any, then that of the push before (round pushed-2) if there was one; ``keys``
  repeats the entry's ps key for each, ``lens`` are bytes.
"""
import dataclasses
import json
from typing import List, Optional, Tuple

import numpy as np

from .errors import ProtocolError
from .mxproto import SERVER_DTYPES, MShadowType, RequestType, encode_cmd, mshadow_code

__all__ = ["KeyReport", "REPORT_CMD", "encode_report", "decode_report"]

#: the request head of a report
REPORT_CMD = encode_cmd(RequestType.BYTEPS_RECOVERY, MShadowType.FLOAT32)


@dataclasses.dataclass
class KeyReport:
    """One worker's state of one ps key. ``latest`` is round ``pushed - 1``'s data,
    ``previous`` round ``pushed - 2``'s (None where that round does not exist)."""

    ps_key: int
    dtype: np.dtype
    nbytes: int
    pushed: int
    answered: int
    latest: Optional[np.ndarray] = None
    previous: Optional[np.ndarray] = None

    def segments(self) -> List[np.ndarray]:
        return [s for s in (self.latest, self.previous) if s is not None]


def encode_report(reports: List[KeyReport]) -> Tuple[bytes, np.ndarray, np.ndarray, np.ndarray]:
    """(body, keys, vals as uint8, lens) of a report."""
    entries, keys, segments = [], [], []
    for report in reports:
        entries.append([report.ps_key, int(mshadow_code(report.dtype)), report.nbytes,
                        report.pushed, report.answered])
        for segment in report.segments():
            keys.append(report.ps_key)
            segments.append(segment.reshape(-1).view(np.uint8))
    body = json.dumps({"keys": entries}).encode("utf-8")
    vals = np.concatenate(segments) if segments else np.empty(0, np.uint8)
    return (body, np.array(keys, np.uint64), vals,
            np.array([s.nbytes for s in segments], np.int32))


def decode_report(body: bytes, keys, vals, lens) -> List[KeyReport]:
    """The reports of a report request; ProtocolError naming what is wrong."""
    try:
        entries = json.loads(bytes(body).decode("utf-8"))["keys"]
        parsed = [(int(k), int(code), int(n), int(p), int(q)) for k, code, n, p, q in entries]
    except (UnicodeDecodeError, ValueError, KeyError, TypeError) as exc:
        raise ProtocolError("a recovery report whose body is not the expected JSON: %s"
                            % exc) from None
    data = np.frombuffer(vals, np.uint8)
    lens = [] if lens is None else [int(n) for n in lens]
    keys = [int(k) for k in keys]
    if len(lens) != len(keys) or sum(lens) != data.size:
        raise ProtocolError("a recovery report's keys, lens and values disagree (%d keys, %d "
                            "lens, %d bytes)" % (len(keys), len(lens), data.size))
    reports, index, offset = [], 0, 0
    for ps_key, code, nbytes, pushed, answered in parsed:
        dtype = SERVER_DTYPES.get(code)
        if dtype is None or nbytes < 0 or nbytes % dtype.itemsize:
            raise ProtocolError("recovery report of ps key %d: dtype code %d and %d bytes"
                                % (ps_key, code, nbytes))
        if not 0 <= answered <= pushed or answered < pushed - 1:
            raise ProtocolError("recovery report of ps key %d: %d pushes and %d answered pulls "
                                "(a worker pulls each round it pushed before pushing the next)"
                                % (ps_key, pushed, answered))
        report = KeyReport(ps_key, dtype, nbytes, pushed, answered)
        arrays = []
        for _ in range(min(pushed, 2)):
            if index >= len(keys) or keys[index] != ps_key or lens[index] != nbytes:
                raise ProtocolError("recovery report of ps key %d: expected %d segment(s) of "
                                    "%d bytes" % (ps_key, min(pushed, 2), nbytes))
            arrays.append(data[offset:offset + nbytes].view(dtype))
            offset += nbytes
            index += 1
        report.latest = arrays[0] if arrays else None
        report.previous = arrays[1] if len(arrays) > 1 else None
        reports.append(report)
    if index != len(keys):
        raise ProtocolError("a recovery report has %d segment(s) no entry claims"
                            % (len(keys) - index))
    return reports
