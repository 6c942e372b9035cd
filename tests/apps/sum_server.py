"""A minimal summing server on our KV server API (dist_sync without updater, any key count).

First push of a key initialises it; then each round's pushes are summed and, when all workers
pushed, the stored value becomes the round's sum and the pushes are acknowledged. Pulls are
answered from the store. kStopServer ends it. Test-only: the real one is kvstore_byteps.server.
"""
import sys
import threading

import numpy as np

from kvstore_byteps.config import Config
from kvstore_byteps.van.kv import KVServer
from kvstore_byteps.van.runtime.postoffice import Postoffice


def main():
    po = Postoffice(Config.from_env())
    store, merged, waiting = {}, {}, {}
    stop = threading.Event()

    def on_request(req, server):
        offsets = np.concatenate(([0], np.cumsum(req.lens))) if req.lens is not None else None
        if req.meta.push:
            for i, key in enumerate(int(k) for k in req.keys):
                value = np.frombuffer(req.vals[offsets[i]:offsets[i + 1]], np.float32)
                if key not in store:
                    store[key] = value.copy()
                    continue
                merged[key] = merged.get(key, 0) + value
            if all(int(k) not in merged for k in req.keys):   # it was an init push
                server.respond(req)
                return
            pending = waiting.setdefault(tuple(int(k) for k in req.keys), [])
            pending.append(req)
            if len(pending) == po.num_workers:
                for key in (int(k) for k in req.keys):
                    store[key] = merged.pop(key)
                for r in waiting.pop(tuple(int(k) for k in req.keys)):
                    server.respond(r)
        else:
            vals = np.concatenate([store[int(k)] for k in req.keys])
            server.respond(req, req.keys, vals,
                           np.array([store[int(k)].nbytes for k in req.keys], np.int32))

    def on_command(req, server):
        server.respond(req)
        if req.meta.head == 2:
            stop.set()

    KVServer(po, request_handler=on_request, command_handler=on_command)
    po.start()
    po.barrier(7)
    stop.wait(120)
    po.finalize()
    return 0


if __name__ == "__main__":
    sys.exit(main())
