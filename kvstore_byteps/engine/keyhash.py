"""Hash functions that place partition keys on servers (``BYTEPS_KEY_HASH_FN``). Pure.

BytePS hashes the *decimal text* of a partition key and takes the result modulo the number of
servers. We keep its four documented choices:

* ``djb2`` (default): ``h = 5381; h = h * 33 + c`` over the digits, in unsigned 64-bit arithmetic.
* ``sdbm``: ``h = 0; h = c + (h << 6) + (h << 16) - h`` over the digits, unsigned 64-bit.
* ``built_in``: C++ ``std::hash<std::string>`` of the digits as libstdc++ computes it on 64-bit
  Linux (MurmurHash64A with libstdc++'s seed), so placement matches a BytePS worker built with GCC.
* ``mixed``: BytePS's mixed mode. The last ``num_workers`` servers run on the workers' machines
  (co-located) and get a smaller share of the keys than the ``num_servers - num_workers``
  dedicated ones before them; ``djb2`` decides both the share and the server.

All functions are deterministic across processes (unlike Python's ``hash`` of a ``str``), which is
the point: every worker must place a key on the same server.
"""
import enum

from ..errors import ConfigError

__all__ = ["KeyHash", "djb2", "sdbm", "builtin_hash", "mixed_mode_server", "server_for_key",
           "MIXED_MODE_BOUND"]

_MASK64 = (1 << 64) - 1
#: libstdc++'s ``std::_Hash_bytes`` multiplier and the seed ``std::hash<std::string>`` passes.
_MURMUR_MUL = 0xC6A4A7935BD1E995
_LIBSTDCXX_SEED = 0xC70F6907
#: BytePS's default ``BYTEPS_MIXED_MODE_BOUND``.
MIXED_MODE_BOUND = 101


class KeyHash(enum.Enum):
    """The choices of ``BYTEPS_KEY_HASH_FN``. ``balanced`` is not a hash: it places by bytes
    (see :class:`kvstore_byteps.engine.partition.Partitioner`); the others are BytePS's."""

    BALANCED = "balanced"
    DJB2 = "djb2"
    SDBM = "sdbm"
    BUILT_IN = "built_in"
    MIXED = "mixed"

    @classmethod
    def parse(cls, name: str) -> "KeyHash":
        """Parse a ``BYTEPS_KEY_HASH_FN`` value; raise ConfigError naming the choices."""
        try:
            return cls(name)
        except ValueError:
            choices = ", ".join(member.value for member in cls)
            raise ConfigError("BYTEPS_KEY_HASH_FN=%r is invalid: expected one of %s"
                              % (name, choices)) from None


def _digits(key: int) -> bytes:
    if key < 0 or key > _MASK64:
        raise ValueError("key %d is not an unsigned 64-bit integer" % key)
    return b"%d" % key


def djb2(key: int) -> int:
    """djb2 of the decimal text of ``key`` (unsigned 64-bit)."""
    value = 5381
    for char in _digits(key):
        value = (value * 33 + char) & _MASK64
    return value


def sdbm(key: int) -> int:
    """sdbm of the decimal text of ``key`` (unsigned 64-bit)."""
    value = 0
    for char in _digits(key):
        value = (char + (value << 6) + (value << 16) - value) & _MASK64
    return value


def _shift_mix(value: int) -> int:
    return value ^ (value >> 47)


def builtin_hash(key: int) -> int:
    """libstdc++'s 64-bit ``std::hash<std::string>`` of the decimal text of ``key``."""
    data = _digits(key)
    aligned = len(data) & ~7
    value = _LIBSTDCXX_SEED ^ ((len(data) * _MURMUR_MUL) & _MASK64)
    for start in range(0, aligned, 8):
        word = int.from_bytes(data[start:start + 8], "little")
        mixed = (_shift_mix((word * _MURMUR_MUL) & _MASK64) * _MURMUR_MUL) & _MASK64
        value = ((value ^ mixed) * _MURMUR_MUL) & _MASK64
    if len(data) > aligned:
        tail = int.from_bytes(data[aligned:], "little")
        value = ((value ^ tail) * _MURMUR_MUL) & _MASK64
    value = (_shift_mix(value) * _MURMUR_MUL) & _MASK64
    return _shift_mix(value)


def _mixed_ratio(num_servers: int, num_workers: int) -> float:
    """Share of keys that go to the dedicated (not co-located) servers, as BytePS computes it."""
    dedicated = num_servers - num_workers
    if dedicated < 0:
        raise ConfigError("BYTEPS_KEY_HASH_FN=mixed needs at least as many servers as workers "
                          "(servers=%d, workers=%d)" % (num_servers, num_workers))
    numerator = 2.0 * dedicated * (num_workers - 1)
    if numerator == 0:
        return 0.0
    ratio = numerator / (num_workers * (num_workers + dedicated) - 2 * dedicated)
    if not 0.0 <= ratio <= 1.0:
        raise ConfigError("BYTEPS_KEY_HASH_FN=mixed is not permitted with %d servers and %d "
                          "workers (more dedicated servers than workers)"
                          % (num_servers, num_workers))
    return ratio


def mixed_mode_server(key: int, num_servers: int, num_workers: int,
                      bound: int = MIXED_MODE_BOUND) -> int:
    """BytePS mixed mode: servers ``[0, S-W)`` are dedicated, ``[S-W, S)`` co-located."""
    if bound < num_servers:
        raise ConfigError("BYTEPS_MIXED_MODE_BOUND=%d must be at least the number of servers "
                          "(%d)" % (bound, num_servers))
    dedicated = num_servers - num_workers
    threshold = _mixed_ratio(num_servers, num_workers) * bound
    bucket = djb2(key) % bound
    if bucket < threshold:
        return djb2(bucket) % dedicated
    return dedicated + djb2(bucket) % num_workers


def server_for_key(key: int, num_servers: int, key_hash: KeyHash = KeyHash.DJB2,
                   num_workers: int = 1) -> int:
    """The server rank in ``[0, num_servers)`` that owns partition key ``key``."""
    if num_servers < 1:
        raise ValueError("num_servers must be positive, got %d" % num_servers)
    if key_hash is KeyHash.MIXED:
        return mixed_mode_server(key, num_servers, num_workers)
    if key_hash is KeyHash.BALANCED:
        raise ValueError("balanced placement depends on the bytes placed before; use a "
                         "Partitioner, not a hash of the key")
    function = {KeyHash.DJB2: djb2, KeyHash.SDBM: sdbm, KeyHash.BUILT_IN: builtin_hash}[key_hash]
    return function(key) % num_servers
