"""Sends mutated ps-lite frames from unknown peers: ``fuzzer.py HOST:PORT[,HOST:PORT] COUNT SEED``.

For each target, COUNT messages over ZeroMQ DEALER sockets whose identities are not cluster
members (``ps99``, ``ps12345``, junk, none): valid metas of every kind (pushes, pulls, commands,
control messages), mutated (bytes flipped, cut short, extended) or left intact, with random
data frames. Prints ``FUZZ SENT N (could not send M)``: a target that refuses the handshake
(BYTEPS_AUTH_KEY) makes sends block; after 2 s that socket's messages count as not sent.
"""
import random
import sys

import zmq

from kvstore_byteps.van.wire.codec import encode_meta
from kvstore_byteps.van.wire.message import ControlCommand, Control, Meta, Node, Role

IDENTITIES = [b"ps99", b"ps12345", b"junk", b"ps-3", b"\xff\xfe\xfd"]


def valid_metas():
    node = Node(Role.WORKER, 99, "127.0.0.1", 1)
    metas = [Meta(head=h, request=True, push=p, pull=not p, app_id=0, customer_id=0,
                  timestamp=t, data_type=[8, 11, 3]) for h in (0, 0x30009, 0x10009, 0x20009)
             for p in (True, False) for t in (0, 1, 7)]
    metas += [Meta(head=h, request=True, simple_app=True, app_id=0, timestamp=3, body=b"x")
              for h in (0, 1, 2, 3, 5, 42)]
    metas += [Meta(control=Control(cmd=cmd, nodes=[node], barrier_group=7), request=True,
                   timestamp=1, app_id=0)
              for cmd in (ControlCommand.ADD_NODE, ControlCommand.BARRIER, ControlCommand.HEARTBEAT,
                          ControlCommand.TERMINATE, ControlCommand.ACK)]
    return [encode_meta(m) for m in metas]


def mutate(rng, data: bytes) -> bytes:
    kind = rng.randrange(4)
    if kind == 0 or not data:
        return data
    if kind == 1:
        buf = bytearray(data)
        for _ in range(rng.randint(1, 4)):
            buf[rng.randrange(len(buf))] = rng.randrange(256)
        return bytes(buf)
    if kind == 2:
        return data[:rng.randrange(len(data))]
    return data + bytes(rng.randrange(256) for _ in range(rng.randint(1, 16)))


def random_bytes(rng, count: int) -> bytes:
    """``count`` random bytes in one call (a generator of 40000 randrange calls took ~10 ms)."""
    return rng.getrandbits(8 * count).to_bytes(count, "little") if count else b""


def frames(rng):
    keys = (rng.choice([0, 1, 2, 3, 1 << 40, 2 ** 64 - 1])).to_bytes(8, "little")
    vals = random_bytes(rng, rng.choice([0, 3, 4, 16, 40000]))
    lens = rng.choice([len(vals), 0, 4, -1]).to_bytes(4, "little", signed=True)
    return [keys, vals, lens][:rng.randrange(5)] + [b"x"] * (rng.random() < 0.1)


def main():
    targets, count, seed = sys.argv[1].split(","), int(sys.argv[2]), int(sys.argv[3])
    rng = random.Random(seed)
    ctx = zmq.Context()
    metas = valid_metas()
    sent, refused, refusing = 0, 0, set()
    for target in targets:
        sockets = []
        for identity in IDENTITIES:
            sock = ctx.socket(zmq.DEALER)
            sock.setsockopt(zmq.IDENTITY, identity)
            sock.setsockopt(zmq.LINGER, 20000)
            sock.setsockopt(zmq.SNDTIMEO, 2000)   # a target that refuses us (auth) blocks sends
            sock.connect("tcp://" + target)
            sockets.append(sock)
        for _ in range(count):
            message = [mutate(rng, rng.choice(metas))] + frames(rng)
            sock = rng.choice(sockets)
            if sock in refusing:
                refused += 1
                continue
            try:
                sock.send_multipart(message)
                sent += 1
            except zmq.Again:
                refusing.add(sock)
                refused += 1
        for sock in sockets:
            sock.close(0 if sock in refusing else None)
    ctx.term()
    print("FUZZ SENT %d (could not send %d)" % (sent, refused), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
