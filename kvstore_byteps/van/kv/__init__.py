"""The KV layer (ps-lite's KVWorker, KVServer and SimpleApp) on the node runtime: request slicing,
answers matched by timestamp, and its plug-in for restarted servers."""

from .app import open_worker  # noqa: E402,F401  (the engine's one way to a worker app)
