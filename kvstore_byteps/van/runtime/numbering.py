"""How the scheduler numbers the nodes of a forming cluster (ps-lite's ids: servers 8 + 2r,
workers 9 + 2r), as upstream's scheduler does unless every node of a role asks for its rank.
Pure."""
import dataclasses
from typing import List, Optional

from ...config import Role
from ..wire.message import Node, server_rank_to_id, worker_rank_to_id

__all__ = ["assign_ids"]


def _sort_key(node: Node):
    # hostname descending (byte order), then port ascending
    return tuple(-b for b in node.hostname.encode()) + (256,), node.port


def _hinted_ranks(nodes: List[Node], role: Role) -> Optional[dict]:
    """{address: rank} when every node of ``role`` asks for a distinct rank in range, else None."""
    members = [n for n in nodes if n.role == role]
    hints = [n.rank_hint for n in members]
    if not members or sorted(h for h in hints if h is not None) != list(range(len(members))):
        return None
    return {n.address: n.rank_hint for n in members}


def assign_ids(nodes: List[Node]) -> List[Node]:
    """Node ids: servers 8+2r, workers 9+2r.

    Ranks are upstream's order, (hostname desc, port asc), unless every node of a role asked
    for a distinct rank 0..n-1 (our workers send DMLC_WORKER_ID, as BytePS reads it for the rank):
    then those, so the launcher's ``[worker R]`` is the rank. Upstream nodes ask for nothing.
    """
    ordered = sorted(nodes, key=_sort_key)
    hinted = {role: _hinted_ranks(nodes, role) for role in (Role.SERVER, Role.WORKER)}
    next_rank = {Role.SERVER: 0, Role.WORKER: 0}
    assigned, by_address = [], {}
    for node in ordered:
        if node.address in by_address:      # same host:port twice shares one id, as upstream
            node_id = by_address[node.address]
        else:
            if hinted[node.role] is not None:
                rank = hinted[node.role][node.address]
            else:
                rank = next_rank[node.role]
                next_rank[node.role] += 1
            node_id = (server_rank_to_id if node.role == Role.SERVER else worker_rank_to_id)(rank)
            by_address[node.address] = node_id
        assigned.append(dataclasses.replace(node, id=node_id))
    return assigned
