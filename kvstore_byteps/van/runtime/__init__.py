"""The node runtime (ps-lite's postoffice and customers): membership, barriers, heartbeats, resending;
it asks the transport registry (``van/registry.py``) for its van and imports no transport."""
