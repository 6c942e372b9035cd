"""In-process nodes for van tests: start postoffices in threads, a scheduler+server+worker trio."""
import contextlib
import socket
import threading

import numpy as np

from kvstore_byteps.van.kv import KVServer
from kvstore_byteps.van.kv.worker import KVWorker
from kvstore_byteps.van.runtime.postoffice import Postoffice


def start_all(nodes, join=15):
    """Start every postoffice in its own thread; each one's result: None, its error, or
    "still starting" if it did not finish within ``join`` seconds."""
    results = {}

    def run(po):
        try:
            po.start()
            results[id(po)] = None
        except Exception as exc:
            results[id(po)] = exc
    threads = [threading.Thread(target=run, args=(po,), daemon=True) for po in nodes]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(join)
    return [results.get(id(po), "still starting") for po in nodes]


def summing_handler():
    """A server's request handler that sums the float32 pushes of each key and answers a pull
    with the key's sum (one key per request)."""
    store = {}

    def on_request(req, server):
        key = int(req.keys[0])
        if req.meta.push:
            store[key] = store.get(key, 0) + np.frombuffer(req.vals, np.float32)
            server.respond(req)
        else:
            server.respond(req, req.keys, store[key], [store[key].nbytes])
    return on_request


def start_trio(configs, on_request):
    """Scheduler, one server answering with ``on_request(req, server)`` and one worker, from
    three configs; returns (postoffices, KVWorker) once all three are ready."""
    nodes = [Postoffice(cfg) for cfg in configs]
    KVServer(nodes[1], request_handler=on_request)
    worker = KVWorker(nodes[2])
    results = start_all(nodes)
    assert results == [None, None, None], results
    return nodes, worker


def stop_all(nodes) -> None:
    """Stop postoffices, the last started first (the worker before the server and scheduler)."""
    for po in reversed(nodes):
        po.stop()


def finalize_all(nodes) -> None:
    """Finalize postoffices without the shutdown barrier, the last started first; every one is
    finalized even if an earlier one fails (its threads would outlive the test), then the
    first failure is raised."""
    errors = []
    for po in reversed(nodes):
        try:
            po.finalize(barrier=False)
        except Exception as exc:
            errors.append(exc)
    if errors:
        raise errors[0]


@contextlib.contextmanager
def held_port():
    """A port on 127.0.0.1 that something else is listening on, for the block's duration."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen(1)
        yield holder.getsockname()[1]
