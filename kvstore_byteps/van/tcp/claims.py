"""Which incoming connection speaks for which node id (byteps_tcp), as a pure state machine.

A byteps_tcp peer says who it is in its hello, and every message on that connection counts as
sent by that node id. Without authentication (BYTEPS_AUTH_KEY) nothing proves the claim, so the
rules are those ZeroMQ's ROUTER gives the zmq van, where a peer's identity is its node id:

* one connection per node id: a second connection claiming an id that an open connection holds
  is not read; it is held (one per id) and takes over only once the first one closes (a peer
  that restarted and reconnected before its old connection was seen to close);
* once the node list is known, a claim of an id that is no node of the cluster is refused;
* when the scheduler announces that a node id moved (a restarted server took it over), a held
  connection takes over from the holder; without one, a holder older than
  ``RECONNECT_WINDOW_S`` is dropped (it belongs to the process that was replaced: the
  restarted one connects as it learns its id, the moment the others are told) and the next
  claim is read;
* anonymous connections (no id yet: ADD_NODE to the scheduler) are always read; what they may
  do is membership's business.

Connections are opaque objects; the van does the I/O for each decision.
"""
from typing import Dict, Hashable, Iterable, List, Optional, Tuple

from ..wire.message import K_EMPTY, Node

#: decisions of :meth:`Claims.admit`
READ, HOLD, REFUSE = "read", "hold", "refuse"
#: a connection this young when its node is announced as moved is the new process's
RECONNECT_WINDOW_S = 5.0


class Claims:
    """The connections of one listening node, by the node id each one claims."""

    def __init__(self) -> None:
        self._holder: Dict[int, Hashable] = {}      # node id -> the connection read for it
        self._held: Dict[int, Hashable] = {}        # node id -> one connection waiting for it
        self._ids: Dict[Hashable, int] = {}         # connection -> the id it claims
        self._since: Dict[Hashable, float] = {}     # connection -> when it was admitted
        self._nodes: Optional[Dict[int, Tuple[str, int]]] = None   # id -> (host, port)

    def admit(self, conn: Hashable, node_id: int,
              now: float = 0.0) -> Tuple[str, Optional[Hashable], str]:
        """A new connection claims ``node_id``: ``(decision, connection to close, why)``.
        Decisions: READ it, HOLD it unread, or REFUSE it (close it)."""
        if node_id == K_EMPTY:
            return READ, None, ""
        if self._nodes is not None and node_id not in self._nodes:
            return REFUSE, None, "node id %d is no node of this cluster" % node_id
        self._ids[conn], self._since[conn] = node_id, now
        if node_id not in self._holder:
            self._holder[node_id] = conn
            return READ, None, ""
        replaced = self._held.get(node_id)
        if replaced is not None:
            self._forget(replaced)
        self._held[node_id] = conn
        return HOLD, replaced, ("node %d already has an open connection; this one is not read "
                                "unless that one closes" % node_id)

    def closed(self, conn: Hashable) -> Optional[Hashable]:
        """``conn`` was closed; returns a held connection to read from now on, if any."""
        node_id = self._forget(conn)
        if node_id is None:
            return None
        if self._held.get(node_id) is conn:
            del self._held[node_id]
            return None
        if self._holder.get(node_id) is not conn:
            return None
        del self._holder[node_id]
        successor = self._held.pop(node_id, None)
        if successor is not None:
            self._holder[node_id] = successor
        return successor

    def _forget(self, conn: Hashable) -> Optional[int]:
        self._since.pop(conn, None)
        return self._ids.pop(conn, None)

    def nodes_changed(self, nodes: Iterable[Node],
                      now: float = 0.0) -> Tuple[List[Hashable], List[Hashable]]:
        """The scheduler's node list (at start, or after a restart). Returns ``(to close, to
        read)``: connections claiming ids that are no node, and the holder of an id whose node
        moved (see the module docstring; its held connection, if any, is to be read)."""
        table = {node.id: (node.hostname, node.port) for node in nodes}
        before, self._nodes = self._nodes, table
        close, read = [], []
        for node_id, conn in list(self._holder.items()):
            moved = before is not None and before.get(node_id) != table.get(node_id)
            if node_id in table and not moved:
                continue
            if (node_id in table and node_id not in self._held
                    and now - self._since[conn] < RECONNECT_WINDOW_S):
                continue            # the restarted process itself, already connected
            close.append(conn)
            successor = self.closed(conn)
            if successor is not None:
                if node_id in table:
                    read.append(successor)
                else:
                    close.append(successor)
                    self.closed(successor)
        for node_id, conn in list(self._held.items()):
            if node_id not in table:
                close.append(conn)
                self.closed(conn)
        return close, read
