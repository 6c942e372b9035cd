"""A pull riding along with its push (``pull_timestamp`` in the push's meta). Pure helpers.

Our ``dist_byteps`` worker sends a round's pull of a partition inside the push of it (see
``KVWorker.push_with_pull``): one message less per partition and round. The server
acknowledges the push at once, as any push, and answers the pull under its own timestamp as
if it had been sent right after the push.
"""
from typing import Optional

from ..van.kv import KVPairs, KVRequest
from ..van.wire.message import Meta

__all__ = ["why_no_riding_pull", "attached_pull"]


def why_no_riding_pull(req, plain_heads, path) -> Optional[str]:
    """Why ``req`` cannot carry a pull, or None if it can. ``plain_heads``: the heads of plain
    BytePS requests; ``path``: the server's data path (:mod:`.datapath`)."""
    if req.meta.head not in plain_heads:
        return "only a plain BytePS push (request type 3) can carry a pull (pull_timestamp)"
    if not req.meta.push or req.meta.pull:
        return "only a push can carry a pull (pull_timestamp)"
    return path.riding_pull_refusal


def attached_pull(req) -> Optional[KVRequest]:
    """The pull riding along with ``req`` as a request of its own (checked already by
    :func:`why_no_riding_pull`), or None."""
    timestamp = (req.meta.extra or {}).get("pull_timestamp")
    if timestamp is None:
        return None
    # the push's meta, copied with these changes (as dataclasses.replace would, at a third of
    # its cost on every push; every field of Meta is copied, whatever fields it gains)
    meta = Meta.__new__(Meta)
    meta.__dict__.update(req.meta.__dict__, timestamp=int(timestamp), push=False, pull=True,
                         data_type=[], extra=None)
    return KVRequest(meta, KVPairs(req.keys, memoryview(b""), None))
