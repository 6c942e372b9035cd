"""Cluster authentication (``BYTEPS_AUTH_KEY``): key derivation and the byteps_tcp proofs. Pure.

Every node of an authenticated cluster holds one shared secret. From it each van derives what
it needs, so the secret itself never travels and one van's keys say nothing about another's:

- the zmq van: one CURVE key pair (van/zmq/auth.py). Every node is a CURVE server with that pair,
  connects with it as client, and admits (ZAP) only clients proving they hold its secret half.
  CURVE encrypts and authenticates every message after the handshake.
- the byteps_tcp van: an HMAC-SHA256 key for a mutual challenge-response in the connection's
  hello (van/tcp/frame.py). Both sides send a fresh random nonce and then prove they hold the key by
  a MAC over both nonces, labelled with their side of the connection so a proof cannot be
  reflected back. It authenticates who connects; it does not encrypt or MAC the messages
  that follow (see the README's "Failures and security").
"""
import hashlib
import hmac
import os

__all__ = ["NONCE_BYTES", "PROOF_BYTES", "CONNECTOR", "ACCEPTOR", "curve_secret", "hmac_key",
           "new_nonce", "tcp_proof", "tcp_proof_ok"]

NONCE_BYTES = 16
PROOF_BYTES = 32
CONNECTOR = b"connector"
ACCEPTOR = b"acceptor"
_LABEL = b"kvstore-byteps auth v1 "


def _derive(key: bytes, purpose: bytes) -> bytes:
    return hmac.new(key, _LABEL + purpose, hashlib.sha256).digest()


def curve_secret(key: bytes) -> bytes:
    """The 32 raw bytes of the cluster's CURVE secret key."""
    return _derive(key, b"curve secret")


def hmac_key(key: bytes) -> bytes:
    """The key of the byteps_tcp handshake's proofs."""
    return _derive(key, b"byteps_tcp hello")


def new_nonce() -> bytes:
    return os.urandom(NONCE_BYTES)


def tcp_proof(mac_key: bytes, side: bytes, own_nonce: bytes, peer_nonce: bytes) -> bytes:
    """What ``side`` (CONNECTOR or ACCEPTOR) sends to prove it holds the key."""
    return hmac.new(mac_key, _LABEL + side + b" " + own_nonce + peer_nonce,
                    hashlib.sha256).digest()


def tcp_proof_ok(mac_key: bytes, peer_side: bytes, peer_nonce: bytes, own_nonce: bytes,
                 proof: bytes) -> bool:
    """Whether ``proof`` is the peer's (on ``peer_side``) for this pair of nonces."""
    return hmac.compare_digest(tcp_proof(mac_key, peer_side, peer_nonce, own_nonce), proof)
