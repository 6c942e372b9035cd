"""A scheduler that cannot reach a node as the cluster forms (its byteps_tcp hello refused:
another version, van or key; an address that does not answer) stops; first it tells every node
that registered why (best effort), so that they stop now too instead of waiting out
BYTEPS_START_TIMEOUT for a node list that never comes. The notices are the scheduler
membership's (``start_failed``); this module delivers them."""
import logging
import time
from typing import Callable, List, Optional, Tuple

from ..wire.message import Message, Node

log = logging.getLogger(__name__)

#: how long the scheduler tries to reach the other nodes (a connect already under way still
#: runs to its end), and then waits for its notices to leave
_ABORT_NOTICE_S = 5.0
_ABORT_LINGER_S = 0.5


def tell_start_failed(notices: List[Tuple[Node, Message]], failed: Node, my_id: int,
                      connect: Callable[[Node, Optional[int]], None],
                      transmit: Callable[[Message], int]) -> None:
    """Send each of ``notices`` to its node (``failed``, the node that could not be reached,
    is not connected to again), through ``connect`` (the van's) and ``transmit``."""
    deadline = time.monotonic() + _ABORT_NOTICE_S
    for other, notice in notices:
        if time.monotonic() > deadline:      # (one that does not answer took it all)
            log.debug("no time left to tell %s that the job cannot start",
                      other.describe_rank())
            continue
        try:
            if other.id != failed.id:     # (``failed`` is reached over ZeroMQ if at all)
                connect(other, my_id)
            notice.meta.sender = my_id
            transmit(notice)
        except Exception as exc:     # the others still get theirs
            log.debug("could not tell %s that the job cannot start: %s",
                      other.describe_rank(), exc)
    if notices:     # ZeroMQ drops what it has not sent when the van closes (byteps_tcp's
        time.sleep(_ABORT_LINGER_S)     # sockets send theirs out after close)
