"""The KV layer (ps-lite's KVWorker, KVServer and SimpleApp) on the node runtime: request slicing,
answers matched by timestamp, and its plug-in for restarted servers."""
