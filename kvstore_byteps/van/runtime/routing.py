"""Data messages to their apps' customers (ps-lite's Postoffice::GetCustomer): the table of
customers by (app, customer), and the messages kept for a customer not registered yet or for a
node not ready yet.

Thread-safety: ``dispatch`` and ``hold`` run on the receive thread; ``add`` and ``stop`` are
thread-safe.
"""
import threading
from typing import Any, Dict, List, Tuple

from ...logs import PeerLog
from ..wire.message import K_EMPTY, Message

#: data messages kept while the node is not ready yet (a restarted server hears from workers
#: that learnt of it before its own ADD_NODE answer arrived); more are dropped
_EARLY_DATA_LIMIT = 10000


class CustomerTable:
    """The node's customers (customer.py's); a worker's are found by customer id, the others'
    by app id."""

    def __init__(self, by_customer_id: bool, peer_log: PeerLog):
        self._by_customer_id = by_customer_id
        self._peer_log = peer_log
        self._customers: Dict[Tuple[int, int], Any] = {}
        self._early: Dict[Tuple[int, int], List[Message]] = {}
        self._lock = threading.Lock()
        self._before_ready: List[Message] = []

    def hold(self, message: Message) -> None:
        """Keep a data message that came before this node was ready (its sender may know this
        node before it does)."""
        if len(self._before_ready) < _EARLY_DATA_LIMIT:
            self._before_ready.append(message)

    def release_held(self) -> None:
        """The node is ready: hand on what :meth:`hold` kept."""
        early, self._before_ready = self._before_ready, []
        for message in early:
            self.dispatch(message)

    def dispatch(self, message: Message) -> None:
        meta = message.meta
        if meta.sender == K_EMPTY or meta.app_id == K_EMPTY:
            self._peer_log.warning(meta.sender, "dropped a data message without %s",
                                   "sender identity" if meta.sender == K_EMPTY else "app_id")
            return
        customer_id = meta.customer_id if self._by_customer_id else meta.app_id
        key = (meta.app_id, customer_id)
        # (a dict read needs no lock; only a miss has to be decided under it, where
        # add also takes the messages kept for later)
        customer = self._customers.get(key)
        if customer is None:
            with self._lock:
                customer = self._customers.get(key)
                if customer is None:   # the app is not registered yet: keep it for later
                    self._early.setdefault(key, []).append(message)
                    return
        customer.accept(message)

    def add(self, app_id: int, customer_id: int, customer) -> None:
        """Route (app_id, customer_id)'s data messages to ``customer``, those kept for it first."""
        with self._lock:
            if (app_id, customer_id) in self._customers:
                raise ValueError("customer (%d, %d) is already registered" % (app_id, customer_id))
            self._customers[(app_id, customer_id)] = customer
            early = self._early.pop((app_id, customer_id), [])
        for message in early:
            customer.accept(message)

    def stop(self, timeout: float) -> None:
        """Stop every customer (each waits up to ``timeout`` seconds for its thread)."""
        with self._lock:
            customers = list(self._customers.values())
        for customer in customers:
            customer.stop(timeout)
