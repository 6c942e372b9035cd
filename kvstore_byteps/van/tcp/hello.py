"""The byteps_tcp handshake: each side's hello (its node id, whether it authenticates, whether
it carries RDMA channels) and, with BYTEPS_AUTH_KEY, the mutual proof of auth.py.

A ZeroMQ peer is recognised by its greeting and refused with a ConfigError that says to use one
van everywhere. Blocking, on a socket with a timeout: the accept side runs it on a thread of its
own, the connect side on the thread that connects.
"""
import socket
from typing import Optional

from ...errors import AuthenticationError, ConfigError, PeerError, ProtocolError
from .. import auth
from . import frame as tcp_frame


def tune(sock: socket.socket) -> None:
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


def recv_exactly(sock: socket.socket, size: int, what: str) -> bytes:
    data = bytearray()
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            raise PeerError("%s closed the connection after %d of %d bytes"
                            % (what, len(data), size))
        data += chunk
    return bytes(data)


def read_hello(sock: socket.socket, what: str) -> tcp_frame.Hello:
    """Read and check a peer's hello. ConfigError for a ZeroMQ peer."""
    first = recv_exactly(sock, tcp_frame.ZMTP_SIGNATURE_BYTES, what)
    if tcp_frame.is_zmtp_signature(first):
        try:
            tcp_frame.decode_hello(first)
        except ProtocolError as exc:
            raise ConfigError("%s %s" % (what, exc)) from None
    rest = recv_exactly(sock, tcp_frame.HELLO_BYTES - len(first), what)
    try:
        return tcp_frame.decode_hello(first + rest)
    except ProtocolError as exc:
        raise ProtocolError("%s %s" % (what, exc)) from None


def exchange_hellos(sock: socket.socket, my_id: int, mac_key: Optional[bytes], side: bytes,
                    what: str, rdma: bool = False) -> int:
    """Send this node's hello, read the peer's and, with ``mac_key`` (BYTEPS_AUTH_KEY), run the
    mutual proof of auth.py; the peer's node id. AuthenticationError when the peer does not
    authenticate, or proves nothing, or the two sides disagree on whether to authenticate."""
    nonce = auth.new_nonce() if mac_key else b""
    sock.sendall(tcp_frame.encode_hello(my_id, auth=mac_key is not None, rdma=rdma) + nonce)
    hello = read_hello(sock, what)
    if hello.rdma != rdma:
        names = ("DMLC_PS_VAN_TYPE=byteps_rdma", "DMLC_PS_VAN_TYPE=byteps_tcp")
        raise ConfigError("%s uses %s but this node %s; every node of a cluster must use the "
                          "same van" % ((what,) + (names if hello.rdma else names[::-1])))
    if mac_key is None:
        if hello.auth:
            raise AuthenticationError("%s requires authentication (it has BYTEPS_AUTH_KEY) but "
                                      "this node has no key; give every node the same "
                                      "BYTEPS_AUTH_KEY or BYTEPS_AUTH_KEY_FILE" % what)
        return hello.node_id
    if not hello.auth:
        raise AuthenticationError("%s does not authenticate (it has no BYTEPS_AUTH_KEY) but this "
                                  "node requires it" % what)
    peer_nonce = recv_exactly(sock, auth.NONCE_BYTES, what)
    sock.sendall(auth.tcp_proof(mac_key, side, nonce, peer_nonce))
    proof = recv_exactly(sock, auth.PROOF_BYTES, what)
    peer_side = auth.ACCEPTOR if side == auth.CONNECTOR else auth.CONNECTOR
    if not auth.tcp_proof_ok(mac_key, peer_side, peer_nonce, nonce, proof):
        raise AuthenticationError("%s failed authentication: it holds a different "
                                  "BYTEPS_AUTH_KEY" % what)
    return hello.node_id
