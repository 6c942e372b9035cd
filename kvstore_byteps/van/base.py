"""The transport interface every van implements.

A van moves :class:`~kvstore_byteps.van.wire.message.Message` s between nodes and knows nothing of
membership or key-value semantics (those live in van/runtime/membership.py,
van/runtime/postoffice.py and van/kv/). It has ps-lite's four hooks plus a receive loop:

* ``bind(node, max_retry)``: listen at the node's address, return the port actually bound;
* ``connect(node, my_id)``: open the channel used to send to ``node`` (``my_id=None``: anonymous);
* ``send(message)``: thread-safe, to ``message.meta.recver``; returns bytes sent;
* ``run(on_message, on_tick, tick_seconds)``: the receive loop, run on the van's own thread; it
  returns after delivering a TERMINATE;
* ``close()``: release everything, called after ``run`` returned;
* ``interrupt()``: optional, make ``run`` return without a TERMINATE (thread-safe).

Receive-into-place transports (byteps_tcp: ``recv_into`` a reused buffer; RDMA: the sender
writes straight into a buffer the receiver registered) use ``register_recv_buffer``; a van that
cannot do that (ZeroMQ) ignores it and delivers data in its own buffers.
"""
import abc
from typing import Any, Callable, Optional

from .wire.message import Message, Node


class Van(abc.ABC):
    """Abstract transport. Only ``send``, ``register_recv_buffer``, ``expect_frame`` and
    ``revoke_frame`` are thread-safe."""

    #: whether an app's handler may run on the receive loop (customer.InlineHandler): a
    #: ``send`` from it never waits for a peer to read, so two nodes handling each other's
    #: messages that way cannot wait for each other
    handlers_inline_ok = False

    #: whether each peer receives this van's messages in the order ``send`` was called
    #: (PS_RESEND's fast retransmit relies on it)
    in_order = True

    @abc.abstractmethod
    def bind(self, node: Node, max_retry: int) -> int:
        """Listen at ``node.hostname``/``node.port`` (0: any free port); return the bound port."""

    @abc.abstractmethod
    def connect(self, node: Node, my_id: Optional[int]) -> None:
        """Open (or replace) the sending channel to ``node``."""

    @abc.abstractmethod
    def send(self, message: Message) -> int:
        """Send ``message`` to ``message.meta.recver``; return the number of bytes sent."""

    @abc.abstractmethod
    def run(self, on_message: Callable[[Message], bool], on_tick: Callable[[], None],
            tick_seconds: float) -> None:
        """Receive until ``on_message`` returns False (after TERMINATE); call ``on_tick`` often."""

    @abc.abstractmethod
    def close(self) -> None:
        """Close every socket; call once ``run`` has returned."""

    def interrupt(self) -> None:
        """Make ``run`` return soon even if this node's TERMINATE to itself cannot arrive (a
        node stopped while the cluster forms: its connection to itself may not be read yet).
        Thread-safe. Optional: a van whose TERMINATE always arrives needs nothing here."""

    def register_recv_buffer(self, key: int, nbytes: int) -> None:
        """Announce that data frames of ``nbytes`` bytes for ps key ``key`` will arrive every
        round, so a receive-into-place van can allocate their landing buffer now. Optional."""

    def expect_frame(self, key: int, target) -> Any:
        """Ask for the next data frame of ps key ``key`` with ``target.nbytes`` bytes to land
        in ``target`` (a writable C-contiguous uint8 numpy array), saving the consumer a copy.
        Returns a handle for :meth:`revoke_frame`, which the caller must call once its request
        is over, answered or not, before it gives ``target``'s memory back. A van that cannot
        land in place returns None and delivers the frame in its own buffer. Thread-safe."""
        return None

    def revoke_frame(self, handle: Any) -> None:
        """After this returns, the van writes nothing more into the target of ``handle`` (a
        result of :meth:`expect_frame`, or None). Thread-safe."""

    def describe(self) -> str:
        """The transport as a start-up line names it (once the cluster formed)."""
        return type(self).__name__

    def advertise(self, node: Node) -> Node:
        """``node`` (this node, bound) as its registration announces it: a van that listens on
        more than the node's port adds what peers need to reach it there. Optional."""
        return node

    def on_ready(self) -> None:
        """The cluster has formed (this node got its id and the node list). Optional."""

    def on_nodes(self, nodes) -> None:
        """The cluster's node list, at start and whenever the scheduler announces a change (a
        restarted server): a van that learns a peer's id from the peer itself uses it to
        check the claims (byteps_tcp). Called on the receive thread. Optional."""
