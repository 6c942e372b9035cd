"""The KV layer (ps-lite's KVWorker, KVServer and SimpleApp) on the node runtime: the data
frames (``pairs``), the worker's requests until answered (``requests``), request slicing, the
worker and server apps, and the worker's plug-in for restarted servers."""

from .pairs import NO_PAIRS, KVPairs, parse_kv_frames  # noqa: F401
from .requests import Request  # noqa: F401
from .server import KVRequest, KVServer  # noqa: F401
from .worker import open_worker  # noqa: F401  (the engine's one way to a worker app)
