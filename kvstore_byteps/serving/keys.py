"""The BytePS keys of one server: each key's dtype, size, value, summing thread and rounds.

A key is initialised by rank 0's first push, as upstream: either a default-type push (the value
lands in the inherited store, where default-type pulls read it back) or, failing that, the first
BytePS-type push of the key. Its rounds are the data path's (:mod:`.datapath`). On a restarted
server the keys are rebuilt from the workers' reports, without their initial values.
"""
import dataclasses
import logging
import threading
from typing import Callable, Dict, List, Optional, Tuple

import numpy as np

from ..errors import ProtocolError
from ..mxproto import Cmd
from .store import publish

__all__ = ["BytePSKey", "KeyTable", "check_matches"]

log = logging.getLogger(__name__)


@dataclasses.dataclass
class BytePSKey:
    ps_key: int
    dtype: np.dtype
    #: init value (sync) / current weights (async); published. None on a restarted server
    value: Optional[np.ndarray]
    size: int                       # elements
    thread: int                     # summing thread the key is bound to
    rounds: object                  # KeyRounds (sync), BackupRounds, Versions (async)


def check_matches(key: BytePSKey, values: np.ndarray) -> None:
    """ProtocolError unless a push of ``values`` fits ``key``."""
    if values.dtype != key.dtype or values.size != key.size:
        raise ProtocolError("key %d holds %d x %s, push has %d x %s"
                            % (key.ps_key, key.size, key.dtype, values.size, values.dtype))


class KeyTable:
    """ps key -> :class:`BytePSKey`. Thread-safe.

    ``new_rounds(ps_key, values)`` is the data path's; ``summing`` binds each key to a thread;
    ``initial_value(ps_key)`` is what a default-type push stored (or None); ``restarted()`` says
    whether this server replaced a dead one (then a first push cannot initialise a key);
    ``expect_pushes(ps_key, nbytes)`` is told of every key made."""

    def __init__(self, new_rounds: Callable, summing, initial_value: Callable,
                 restarted: Callable[[], bool], expect_pushes: Callable[[int, int], None]):
        self._new_rounds, self._summing = new_rounds, summing
        self._initial_value, self._restarted = initial_value, restarted
        self._expect_pushes = expect_pushes
        self.by_ps_key: Dict[int, BytePSKey] = {}
        self._lock = threading.Lock()

    def get(self, ps_key: int) -> Optional[BytePSKey]:
        return self.by_ps_key.get(ps_key)

    def all(self) -> List[BytePSKey]:
        """Every key now."""
        with self._lock:
            return list(self.by_ps_key.values())

    def recover(self, restored: Dict[int, tuple]) -> None:
        """The keys as the workers' reports rebuilt them: ps key -> (dtype, bytes, rounds)."""
        with self._lock:
            for ps_key, (dtype, nbytes, rounds) in restored.items():
                self.by_ps_key[ps_key] = BytePSKey(ps_key, dtype, None, nbytes // dtype.itemsize,
                                                   self._summing.bind(nbytes), rounds)
                self._expect_pushes(ps_key, nbytes)

    def for_push(self, ps_key: int, values: np.ndarray) -> Tuple[BytePSKey, bool]:
        """(key state, whether ``values`` just initialised it)."""
        with self._lock:
            key = self.by_ps_key.get(ps_key)
            if key is not None:
                return key, False
            initial = self._initial_value(ps_key)
            if initial is None and self._restarted():
                # a first push here would be taken as the key's initial value: a wrong sum
                raise ProtocolError("BytePS push of ps key %d, which no worker's recovery "
                                    "report named" % ps_key)
            key = self._init_key(ps_key, values if initial is None else initial)
            self.by_ps_key[ps_key] = key
            return key, initial is None

    def key_of(self, ps_key: int, cmd: Cmd) -> BytePSKey:
        """A key of a batch or a compressed request: known, or initialised earlier by a
        default-type push."""
        with self._lock:
            if ps_key not in self.by_ps_key:
                initial = self._initial_value(ps_key)
                if initial is not None:
                    self.by_ps_key[ps_key] = self._init_key(ps_key, initial)
        return self.known(ps_key, cmd)

    def known(self, ps_key: int, cmd: Cmd) -> BytePSKey:
        """An initialised key of ``cmd``'s dtype, else ProtocolError."""
        key = self.by_ps_key.get(ps_key)
        if key is None:
            raise ProtocolError("BytePS pull of key %d, which was never initialised" % ps_key)
        if cmd.dtype != key.dtype:
            raise ProtocolError("key %d holds %s, pull asks for %s"
                                % (ps_key, key.dtype, cmd.dtype))
        return key

    def _init_key(self, ps_key: int, values: np.ndarray) -> BytePSKey:
        rounds = self._new_rounds(ps_key, values)
        thread = self._summing.bind(values.nbytes)
        self._expect_pushes(ps_key, values.nbytes)
        log.debug("BytePS key %d: %d bytes of %s on summing thread %d", ps_key, values.nbytes,
                  values.dtype, thread)
        return BytePSKey(ps_key, values.dtype, publish(values.copy()), values.size, thread,
                         rounds)
