"""Where the workers agree on the partition layout at start (``BYTEPS_LAYOUT``, a command of
ours): rank 0 leaves the layout it chose (engine/sizing.py) on the servers, and the other
workers, after their start-up barrier, read it back."""
from typing import Optional

from ..errors import ProtocolError

__all__ = ["LayoutBoard"]


class LayoutBoard:
    """The layout rank 0 left, as it sent it."""

    def __init__(self):
        self._layout: Optional[bytes] = None

    def command(self, body: bytes) -> bytes:
        """Rank 0's body leaves the layout; an empty body reads it back."""
        if body:
            self._layout = body
            return b""
        if self._layout is None:
            raise ProtocolError("no partition layout: rank 0 leaves it before the workers' "
                                "start-up barrier")
        return self._layout
