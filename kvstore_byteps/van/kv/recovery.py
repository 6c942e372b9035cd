"""Restarted servers as the KV worker sees them: a plug-in of the KV worker (:mod:`.worker`).

With BYTEPS_SERVER_RECOVERY a server that died may be restarted under its node id. The worker
then needs three things of the KV layer, all here (:class:`ServerRecovery`):

* requests keep the message sent to each server, so a part the dead process never answered can
  be re-sent; a request to a server that is unreachable waits for its restart (its deadline and
  the server's heartbeat timeout still hold);
* requests to a restarted server carry its ``epoch``, and answers from the process it replaced
  (which only seemed dead) are dropped;
* :meth:`ServerRecovery.recover` sends the restarted server the worker's report, then re-sends
  every part it never answered, except those the report carries.

Without recovery the KV worker plugs in :class:`NoServerRecovery`: nothing is kept, stamped or
parked. The hooks run under the KV worker's send lock (``stamp``, ``park``), or on its customer
thread (``accepts``, ``recover``). :class:`ServerRecovery` reaches its worker only through a
:class:`RecoveryPort`, the few operations it needs.
"""
import dataclasses
import logging
from typing import Callable, ContextManager, Dict, List, Optional

from ...errors import PeerError
from ...logs import PeerLog
from ..wire.message import Message, Meta, is_server_id
from .requests import Request

log = logging.getLogger(__name__)
_PEER_LOG = PeerLog(log)

__all__ = ["NoServerRecovery", "ServerRecovery", "RecoveryPort"]


@dataclasses.dataclass(frozen=True)
class RecoveryPort:
    """What :class:`ServerRecovery` needs of its KV worker."""

    #: held while a request is stamped and sent (reentrant): taken to restore a server
    send_lock: ContextManager
    stopped: Callable[[], bool]                  # the node's postoffice stopped
    #: ``(server, head, body, keys, vals, lens, what, callback)``: a push to ``server`` alone
    send_push: Callable[..., Request]
    #: ``(server, but)``: the pending requests waiting for ``server`` (except ``but``)
    waiting_on: Callable[[int, Optional[Request]], List[Request]]
    #: ``(request, server)``: count ``server``'s part as answered, with no data
    count_answered: Callable[[Request, int], None]
    resend: Callable[[Request, Message], None]   # send a request's message again


class NoServerRecovery:
    """The KV worker's plug-in without BYTEPS_SERVER_RECOVERY: every hook lets things be."""

    def stamp(self, request, message: Message) -> Message:
        """``message`` as it goes out now (called as it is sent)."""
        return message

    def park(self, request, message: Message, error: PeerError) -> bool:
        """Whether a request whose send to ``message``'s receiver failed waits instead of
        failing."""
        return False

    def accepts(self, meta: Meta) -> bool:
        """Whether an answer is one to take."""
        return True


class ServerRecovery(NoServerRecovery):
    """The KV worker's plug-in with BYTEPS_SERVER_RECOVERY."""

    def __init__(self, port: RecoveryPort):
        self._port = port
        self._epochs: Dict[int, int] = {}            # server id -> restarts (when > 0)
        self._parked_logged: set = set()

    def stamp(self, request, message: Message) -> Message:
        """Keep ``message`` with its request (to re-send it to a restarted server); to a
        restarted server it goes with its epoch, as a copy, so a copy kept for PS_RESEND still
        says what it was (a restarted server drops it)."""
        request.messages[message.meta.recver] = message
        epoch = self._epochs.get(message.meta.recver)
        if not epoch:
            return message
        meta = dataclasses.replace(message.meta, extra=dict(message.meta.extra or {},
                                                            epoch=epoch))
        return Message(meta, message.data)

    def park(self, request, message: Message, error: PeerError) -> bool:
        server = message.meta.recver
        if not is_server_id(server) or self._port.stopped():
            return False
        if server not in self._parked_logged:
            self._parked_logged.add(server)
            log.warning("%s: server node %d is unreachable (%s); requests to it wait for it to "
                        "be restarted", request.what, server, error)
        return True

    def accepts(self, meta: Meta) -> bool:
        epoch = self._epochs.get(meta.sender)
        if epoch and (meta.extra or {}).get("epoch") != epoch:
            # from the process a restarted server replaced (it only seemed dead): not its
            # answer to give any more
            _PEER_LOG.warning(meta.sender, "dropped an answer of server node %d from before "
                              "its restart %d", meta.sender, epoch)
            return False
        return True

    def recover(self, server: int, epoch: int, report: Optional[Callable[[], tuple]],
                answered_by_report: Callable[[Meta], bool], callback=None):
        """``server`` was restarted (its ``epoch``-th time): send it the push ``report()``
        returns, ``(head, body, keys, vals, lens)`` (what it must rebuild; None: nothing), then,
        for every request still waiting on it, count the part sent there as answered when
        ``answered_by_report(meta)`` (a push the report carries) and re-send it otherwise.
        Call on the customer thread. ``report()`` runs while no request is being sent: what
        it reports was sent before it, the rest is sent after. Returns the report's request
        (``callback`` runs when it is answered)."""
        port = self._port
        with port.send_lock:
            self._epochs[server] = epoch
            sent = None
            if report is not None:
                sent = port.send_push(server, *report(), what="recovery report to node %d"
                                      % server, callback=callback)
            for request in port.waiting_on(server, but=sent):
                message = request.messages.get(server)
                if message is None:
                    continue
                if answered_by_report(message.meta):
                    port.count_answered(request, server)
                else:
                    port.resend(request, message)
        return sent
