"""Partition size from the link the job runs on: the default when BYTEPS_PARTITION_BYTES is unset.

Smaller partitions pipeline a round better over worker -> server -> worker (a partition's sum
comes back while later ones are still being pushed, and the servers' loads even out); every
message costs CPU on both ends. On a slow link the first wins, on a fast one the second:
replayed ResNet-50 steps, 4 workers x 4 servers, 500 Mbit/s links: 768 KB partitions beat
BytePS's 4 MB default by 16% (2.73 against 3.24 s); on loopback they cost 15-65%
(docs/design.md, Partition size). So a partition is sized to take about :data:`WIRE_SECONDS`
on the measured link: of :data:`SIZES` the nearest (by ratio) to that, BytePS's default
wherever the link is fast. Few, far apart sizes: a measurement a little off (a busy machine)
does not change the choice.

How the workers agree (every worker must cut its keys alike): at start rank 0 times pushes of
two sizes to every server at once (its own link's rate, the round trip taken out; the servers
acknowledge and drop them), picks the size and leaves it with the servers (``BYTEPS_LAYOUT``);
after a barrier of the workers, every other worker reads it back from them. Only with our
servers; MXNet's lay keys out their own way.
"""
import json
import math
import time
from typing import Callable, Optional

from ..config import Config
from ..errors import KVStoreBytePSError
from ..mxproto import ServerCommand
from .sparse import ROW_RANGE_BYTES

#: a partition should take about this long on the link (see the module docstring)
WIRE_SECONDS = 0.0128
#: the sizes chosen from: the largest is BytePS's default, the smallest bounds the CPU spent
#: per byte on messages
SIZES = (384000, 768000, 1536000, Config.partition_bytes)
#: the link test: bodies of these sizes to every server at once, best of ``TRIES``
SMALL_BODY, LARGE_BODY, TRIES = 65536, 1048576, 2


def agree_on_layout(rank: Optional[int], servers: int, command: Callable,
                    link_test: Callable[[bytes], None], barrier: Callable[[], None],
                    partition_bytes: Optional[int], fusion_bytes: int) -> dict:
    """The workers' agreement at start: rank 0 leaves its layout with the servers, the others
    read it back after ``barrier()`` of the workers: ``partition_bytes`` (None: sized from rank
    0's link to the ``servers`` servers, ``link_test(body)`` sending ``body`` to every one and
    waiting; ``rate`` is what it measured), ``row_range_bytes`` (from the partition size) and
    ``fusion_bytes`` (every worker must fuse as rank
    0 does: the caller compares). ``command(head, body, what)`` sends a command to every
    server and returns the answered request. Returns the layout's dict. ``rank`` None: a
    late worker of an elastic job, which reads the layout without a barrier."""
    if rank is None:
        return decode_layout(_read_layout(command))
    if rank == 0:
        rate = measure_rate(link_test, servers) if partition_bytes is None else None
        chosen = partition_bytes or partition_bytes_for(rate)
        body = encode_layout(chosen, rate, fusion_bytes, row_range_bytes_for(chosen))
        command(ServerCommand.BYTEPS_LAYOUT, body, "leaving the partition layout")
    barrier()
    if rank != 0:
        body = _read_layout(command)
    return decode_layout(body)


def _read_layout(command: Callable) -> bytes:
    """Rank 0's layout as the servers hold it; every server must hold the same."""
    answers = command(ServerCommand.BYTEPS_LAYOUT, b"",
                      "reading rank 0's partition layout").bodies.values()
    bodies = set(map(bytes, answers))
    if len(bodies) != 1:
        raise KVStoreBytePSError("the servers hold different partition layouts of "
                                 "rank 0: %s" % sorted(bodies))
    return bodies.pop()


def partition_bytes_for(rate: float) -> int:
    """Partition bytes for a link moving ``rate`` bytes a second. Pure."""
    wanted = max(rate * WIRE_SECONDS, 1.0)
    return min(SIZES, key=lambda size: abs(math.log(size / wanted)))


def row_range_bytes_for(partition_bytes: int) -> int:
    """A row_sparse key's range bytes on our servers (engine/sparse.py) for partitions of
    ``partition_bytes``: where the link made them smaller than BytePS's default, ranges of
    ``ROW_RANGE_BYTES``, whose pulls come back while later ranges are pushed; on a fast link 0,
    a range a server, every request's CPU counting more. Measured, a 30,522 x 768 embedding
    with 4,096 rows a worker a step: 4 x 4 on 500 Mbit/s links, 4 MB ranges 0.34-0.35 s a step,
    a range a server 0.51 s; 2 x 2 on loopback 0.067-0.072 s against 0.051-0.053 s. Pure."""
    return ROW_RANGE_BYTES if partition_bytes < Config.partition_bytes else 0


def measure_rate(send: Callable[[bytes], None], servers: int,
                 clock: Callable[[], float] = time.perf_counter) -> float:
    """Bytes per second this worker moves to ``servers`` servers at once: ``send(body)``
    sends ``body`` to every server and returns once all answered. The difference between a
    large and a small body removes the round trip's fixed cost; each body's fastest time over a
    few tries counts (a busy machine only adds time: taking the best rate of each try instead
    favoured a try whose small body was held up, and measured a 1 Gbit/s link at over
    2 Gbit/s). Where the bytes take little time next to the round trip (fast links, loopback)
    the difference is noise: the rate is taken as at most 10x the large body's bytes over its
    whole time."""
    bodies = bytes(SMALL_BODY), bytes(LARGE_BODY)
    smalls, larges = [], []
    for _ in range(TRIES):
        smalls.append(_timed(send, bodies[0], clock))
        larges.append(_timed(send, bodies[1], clock))
    small, large = min(smalls), min(larges)
    return (LARGE_BODY - SMALL_BODY) * servers / max(large - small, large / 10, 1e-9)


def _timed(send: Callable[[bytes], None], body: bytes, clock: Callable[[], float]) -> float:
    started = clock()
    send(body)
    return clock() - started


def encode_layout(partition_bytes: int, rate: Optional[float],
                  fusion_bytes: Optional[int] = None,
                  row_range_bytes: Optional[int] = None) -> bytes:
    """The body of rank 0's ``BYTEPS_LAYOUT`` command."""
    layout = {"partition_bytes": partition_bytes, "rate": rate}
    if fusion_bytes is not None:
        layout["fusion_bytes"] = fusion_bytes
    if row_range_bytes is not None:
        layout["row_range_bytes"] = row_range_bytes
    return json.dumps(layout).encode("utf-8")


def decode_layout(body: bytes) -> dict:
    """The layout in a ``BYTEPS_LAYOUT`` answer; KVStoreBytePSError if it is not one."""
    try:
        layout = json.loads(bytes(body).decode("utf-8"))
        if int(layout["partition_bytes"]) < 1:
            raise ValueError("partition_bytes %r" % layout["partition_bytes"])
        return layout
    except (ValueError, KeyError, TypeError) as exc:
        raise KVStoreBytePSError("the servers answered the layout of rank 0 with %r: %s"
                                 % (bytes(body)[:80], exc)) from exc
