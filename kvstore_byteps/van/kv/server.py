"""The KV layer's server app: ps-lite's KVServer and SimpleApp's command handling on the
postoffice (spec §4): a handler gets each request as a :class:`KVRequest` and answers it with
:meth:`KVServer.respond`.

Thread-safety: every KVServer method is thread-safe. Handlers run on the customer's thread (or
on the van's receive loop for the requests ``quick_request`` names): keep them short.
"""
import logging
import time
from typing import Callable, Optional

import numpy as np

from ...errors import ProtocolError
from ...logs import PeerLog
from ..wire.message import Message, Meta
from .pairs import KVPairs, kv_frames, parse_kv_frames

__all__ = ["KVRequest", "KVServer", "Handler"]

log = logging.getLogger(__name__)


class KVRequest:
    """One request as a server handler sees it (data frames viewed without copying)."""

    __slots__ = ("meta", "keys", "vals", "lens", "received")

    def __init__(self, meta: Meta, kvs: KVPairs):
        self.meta = meta
        self.keys, self.vals, self.lens = kvs
        self.received = time.monotonic()

    @property
    def sender(self) -> int:
        return self.meta.sender


Handler = Callable[[KVRequest, "KVServer"], None]


class KVServer:
    """Receives KV requests and SimpleApp commands for ``app_id`` and sends the answers."""

    def __init__(self, postoffice, app_id: int = 0, request_handler: Optional[Handler] = None,
                 command_handler: Optional[Handler] = None,
                 quick_request: Optional[Callable[[Meta], bool]] = None):
        """``quick_request(meta)``: whether the request handler answers or queues such a KV
        request without waiting (for the van, a lock held long, an optimizer): where the van
        allows it, those run on its receive loop while the handler thread is idle."""
        self.po, self.app_id = postoffice, app_id
        self.request_handler = request_handler
        self.command_handler = command_handler
        self._peer_log = PeerLog(log)
        quick = None if quick_request is None else \
            (lambda message: not message.meta.simple_app and quick_request(message.meta))
        postoffice.register_handler(app_id, app_id, self._on_message, quick=quick)

    def expect_requests(self, key: int, nbytes: int) -> None:
        """Requests carrying ``nbytes`` for ``key`` will come every round: a van that receives
        in place sets up their buffer now."""
        self.po.landing.register_recv_buffer(key, nbytes)

    def respond(self, req: KVRequest, keys=None, vals=None, lens=None,
                error: Optional[str] = None, body: bytes = b"") -> None:
        """Answer ``req``: an ack (no data), data (keys, vals, lens) or an error text; ``body``
        is a SimpleApp answer's payload (upstream's answers carry none)."""
        data, types = kv_frames(keys, vals, lens, with_empty_vals=keys is not None)
        m = req.meta
        extra = {"error": error} if error else {}
        if self.po.recovery_epoch:    # a restarted server: its answers say so
            extra["epoch"] = self.po.recovery_epoch
        meta = Meta(head=m.head, request=False, push=m.push, pull=m.pull,
                    simple_app=m.simple_app, app_id=self.app_id, customer_id=m.customer_id,
                    body=body,
                    timestamp=m.timestamp, data_type=types, recver=m.sender,
                    extra=extra or None)
        self.po.send(Message(meta, data))

    def _on_message(self, message: Message) -> None:
        meta = message.meta
        if not self.po.is_member(meta.sender):    # no way to answer it, nothing to serve
            self._peer_log.warning(meta.sender, "request from node %s, which is not a node of "
                                   "this cluster; dropped", meta.sender)
            return
        if not meta.request:
            self._peer_log.warning(meta.sender, "server got an answer from node %d; dropped",
                                   meta.sender)
            return
        try:
            req = KVRequest(meta, parse_kv_frames(message))
        except ProtocolError as exc:
            self._peer_log.warning(meta.sender, "malformed request from node %d: %s",
                                   meta.sender, exc)
            self._respond_error(KVRequest(meta, KVPairs(np.empty(0, np.uint64),
                                                         memoryview(b""), None)), str(exc))
            return
        handler = self.command_handler if meta.simple_app else self.request_handler
        try:
            if handler is None:
                raise ProtocolError("no handler for %s" % (
                    "commands" if meta.simple_app else "KV requests"))
            handler(req, self)
        except Exception as exc:
            self._peer_log.warning(meta.sender, "request from node %d (head %d) failed: %s",
                                   meta.sender, meta.head, exc)
            self._respond_error(req, str(exc))

    def _respond_error(self, req: KVRequest, text: str) -> None:
        try:
            self.respond(req, error=text)
        except Exception as exc:
            self._peer_log.warning(req.sender, "could not send an error answer to node %d: %s",
                                   req.sender, exc)
