"""The default van (``DMLC_PS_VAN_TYPE`` unset, or ``auto``): ZeroMQ for everyone, byteps_tcp
between our nodes.

Every node registers over ZeroMQ exactly as MXNet's ps-lite does, so a cluster with upstream
MXNet processes forms with no setting. Our nodes also listen for byteps_tcp and announce that
port in their registration (``Node.tcp_port``, a BytePS extension field). Our scheduler passes
it on in the node list; MXNet's C++ scheduler rebuilds its node list from what it knows and
drops it. So a peer whose announcement reached this node is one of ours behind one of our
schedulers: everything this node sends to it goes over byteps_tcp (faster, receive-in-place);
everything else goes over ZeroMQ. Each direction of each pair uses one transport from the
moment the node list arrives, so per-peer order holds (nothing but the registration precedes
it).

Receiving: byteps_tcp's loop runs on the van's thread (the data path), ZeroMQ's on a second
thread; both deliver under one lock, so the postoffice sees one message at a time, as from a
single loop. ``on_tick`` runs on the van's thread only.
"""
import dataclasses
import logging
import threading
from typing import Callable, Dict, Optional, Set

from ...config import Config, Role
from ..base import Van
from ..wire.message import Message, Node
from ..tcp.van import TcpVan
from ..zmq.van import ZMQVan

log = logging.getLogger(__name__)

_JOIN_SECONDS = 5.0


class _Stopped(Exception):
    """Ends one receive loop because the other one delivered the last message."""


class AutoVan(Van):
    """ZeroMQ with every peer, byteps_tcp with the peers that announced a byteps_tcp port."""

    #: byteps_tcp's sends never wait; ZeroMQ's wait only once SNDHWM messages (1000 unless
    #: DMLC_PS_WATER_MARK says otherwise) are queued for one peer, which a handler that sends
    #: nothing but a recovery's resends (a worker's) does not reach
    handlers_inline_ok = True

    def __init__(self, config: Config):
        self.config = config
        self.zmq = ZMQVan(config)
        self.tcp = TcpVan(config)
        self.tcp_port = 0                 # byteps_tcp's listening port, once bound
        self._via: Dict[int, Van] = {}    # node id -> the van that sends to it
        #: workers and servers other than this node reached over byteps_tcp: who may send
        #: this node data frames there
        self._data_peers_on_tcp: Set[int] = set()

    def bind(self, node: Node, max_retry: int) -> int:
        port = self.zmq.bind(node, max_retry)
        self.tcp_port = self.tcp.bind(dataclasses.replace(node, port=0), max_retry)
        return port

    def advertise(self, node: Node) -> Node:
        return dataclasses.replace(node, tcp_port=self.tcp_port)

    def connect(self, node: Node, my_id: Optional[int]) -> None:
        """ZeroMQ always (the peer may be upstream, and a node registers over it); byteps_tcp
        too, and from then on only that, when the peer announced a port."""
        self.zmq.connect(node, my_id)
        if node.tcp_port:
            self.tcp.connect(dataclasses.replace(node, port=node.tcp_port), my_id)
        self._via[node.id] = self.tcp if node.tcp_port else self.zmq
        if node.tcp_port and node.role is not Role.SCHEDULER and node.id != my_id:
            self._data_peers_on_tcp.add(node.id)
        else:
            self._data_peers_on_tcp.discard(node.id)

    def send(self, message: Message) -> int:
        return self._via.get(message.meta.recver, self.zmq).send(message)

    def run(self, on_message: Callable[[Message], bool], on_tick: Callable[[], None],
            tick_seconds: float) -> None:
        lock, stop, failures = threading.Lock(), threading.Event(), []

        def deliver(message: Message) -> bool:
            with lock:
                if stop.is_set():
                    raise _Stopped()
                if on_message(message):
                    return True
                stop.set()
                return False

        def end_if_stopped() -> None:      # ZeroMQ's tick: nothing else to do there
            if stop.is_set():
                raise _Stopped()

        def tcp_tick() -> None:
            end_if_stopped()
            with lock:
                on_tick()

        def zmq_loop() -> None:
            try:
                self.zmq.run(deliver, end_if_stopped, tick_seconds)
            except _Stopped:
                pass
            except BaseException as exc:   # reaches the postoffice through the van's thread
                failures.append(exc)
            stop.set()

        other = threading.Thread(target=zmq_loop, daemon=True, name="van-receive-zmq")
        other.start()
        try:
            self.tcp.run(deliver, tcp_tick, tick_seconds)
        except _Stopped:
            pass
        finally:
            stop.set()
            other.join(_JOIN_SECONDS + tick_seconds)
            if other.is_alive():    # a handler still busy: close() goes on without it
                log.warning("the ZeroMQ receive thread did not stop within %.0f s",
                            _JOIN_SECONDS + tick_seconds)
        if failures:
            raise failures[0]

    def _peers(self, van: Van):
        return sorted(node_id for node_id, via in self._via.items() if via is van)

    def describe(self) -> str:
        tcp, zmq = self._peers(self.tcp), self._peers(self.zmq)
        if not zmq:
            return "byteps_tcp (auto: every peer is ours)"
        if not tcp:
            return "zmq (auto: an upstream MXNet scheduler, or DMLC_PS_VAN_TYPE=zmq on ours)"
        return "auto: byteps_tcp to nodes %s, zmq to nodes %s (upstream MXNet)" % (
            ",".join(map(str, tcp)), ",".join(map(str, zmq)))

    def on_ready(self) -> None:
        self.zmq.on_ready()
        self.tcp.on_ready()
        log.info("van %s", self.describe())

    def on_nodes(self, nodes) -> None:
        self.tcp.on_nodes(nodes)

    def register_recv_buffer(self, key: int, nbytes: int) -> None:
        # Only where a worker or server sends to this node over byteps_tcp: frames from
        # ZeroMQ peers land in ZeroMQ's own buffers, and a registered buffer is paged in at
        # once (with MXNet's workers only, a server's memory would double for nothing).
        if self._data_peers_on_tcp:
            self.tcp.register_recv_buffer(key, nbytes)

    def expect_frame(self, key: int, target):
        # Only while every peer is on byteps_tcp: a frame that comes over ZeroMQ lands in its
        # own buffer, and the van cannot tell which peer a key's answer comes from.
        if self.zmq in self._via.values():
            return None
        return self.tcp.expect_frame(key, target)

    def revoke_frame(self, handle) -> None:
        self.tcp.revoke_frame(handle)

    def close(self) -> None:
        self.tcp.close()
        self.zmq.close()
