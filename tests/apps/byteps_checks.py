"""dist_byteps behaviours checked from inside a worker: ``byteps_checks.py MODE [OUT_DIR]``.

async     rank 1 joins the round 1.5 s late; rank 0's pushpull must return at once and the
          output, when read, must hold the sum (so the read waited for the communication).
          Then rounds of a 2 MB key into fresh outputs (one and two per call): exact sums,
          and on byteps_tcp the answers landed straight in the outputs; then rounds over a
          changing set of small keys (grouped frames of a new size every round): exact
          sums, and on byteps_tcp the receive-buffer pool stops allocating once warm.
priority  with a credit of one 4 KB partition, a low-priority key of many partitions is issued
          before a high-priority key; the engine's trace must show the high-priority
          partitions overtaking the low-priority ones still queued.
uninitialised  pushpull of a key never initialised raises KeyError naming it (no hang).
mismatch  rank 0 and rank 1 declare key 5 with different shapes: both get a clear error
          naming key 5, within the request deadline.
init-order  the ranks initialise two keys in opposite orders (balanced placement differs).
trace     str keys (parameter names) pushpulled from 2 CPU contexts for 3 steps; the
          Chrome trace of every stage is written when the store closes.
endless   pushpull rounds (sums checked) for up to 120 s; prints "round N" as it goes and
          the error that ends it (the test kills a peer).
rounds N  N pushpull rounds (sums checked, "round N" every 20), then "ROUNDS OK".
compress PARAMS_JSON CONTEXTS  set_gradient_compression(PARAMS), 4 rounds checked against
          the compression simulated locally; prints "COMPRESS OK ... (ratio)".
until FILE  rounds as above until FILE exists (rank 0 looks; all ranks stop at the same
          round), then "ROUNDS OK".
varied N  N rounds of three keys (one cut into partitions, one small enough to be batched),
          every rank and round pushing different values, each sum checked exactly; "round N"
          every 20, then "VARIED OK". (A server may be killed and restarted meanwhile.)
"""
import json
import os
import sys
import time

import mxnet as mx
import numpy as np

from kvstore_byteps.engine.stage_specs import Stage


def check_async(kv):
    kv.init(0, mx.nd.zeros((1000,)))
    grad = mx.nd.ones((1000,)) * (kv.rank + 1)
    mx.nd.waitall()
    if kv.rank == 1:
        time.sleep(1.5)
    started = time.perf_counter()
    kv.pushpull(0, grad)
    returned = time.perf_counter() - started
    value = grad.asnumpy()
    read = time.perf_counter() - started
    print("returned after %.3f s, value ready after %.3f s, value %s" % (returned, read, value[0]))
    if kv.rank == 0:
        assert returned < 0.5, returned
        assert read > 1.0, read
    assert np.all(value == 3.0), value[:3]
    # two rounds of one key on different arrays: the engine must keep them in order
    first, second = mx.nd.ones((1000,)), mx.nd.ones((1000,)) * 10
    kv.pushpull(0, first)
    kv.pushpull(0, second)
    assert np.all(first.asnumpy() == 2) and np.all(second.asnumpy() == 20)
    check_landing(kv)
    check_grouped_frames(kv)
    print("ASYNC OK")


def check_landing(kv):
    """A 2 MB key is one partition whose pull answer byteps_tcp lands in the first output."""
    values = mx.nd.arange(1 << 19) + kv.rank            # 2 MB, different per rank
    expected = 2 * np.arange(1 << 19, dtype=np.float32) + 1
    kv.init(1, mx.nd.zeros(values.shape))
    outs = [mx.nd.zeros(values.shape) for _ in range(3)]
    for out in outs:
        kv.pushpull(1, values, out=out)
    pair = [mx.nd.zeros(values.shape), mx.nd.zeros(values.shape)]
    kv.pushpull(1, values, out=pair)                    # the second output gets a copy
    for out in outs + pair:
        np.testing.assert_array_equal(out.asnumpy(), expected)
    pool = getattr(kv._engine.po.van, "pool", None)
    if os.environ.get("DMLC_PS_VAN_TYPE") == "byteps_tcp":
        assert pool.landed_in_place >= 4, pool.landed_in_place
    print("LANDING OK (in place: %s)" % (pool.landed_in_place if pool is not None else "-"))


def check_grouped_frames(kv):
    """Rounds over a changing set of small keys: they travel grouped, in frames whose size
    changes every round. Sums stay exact, and on byteps_tcp the receive-buffer pool stops
    allocating once warm (it used to keep new buffers for every frame size it saw)."""
    keys = list(range(100, 220))                         # 120 keys of 4 KB each
    for key in keys:
        kv.init(key, mx.nd.zeros((1024,)))
    mx.nd.waitall()
    pool = getattr(kv._engine.po.van, "pool", None)
    allocated = []
    for turn in range(30):
        chosen = keys[:60 + 2 * turn]
        outs = [mx.nd.zeros((1024,)) for _ in chosen]
        for key, out in zip(chosen, outs):
            kv.pushpull(key, mx.nd.full((1024,), key + kv.rank), out=out)
        mx.nd.waitall()
        for key, out in zip(chosen, outs):
            assert np.all(out.asnumpy() == 2 * key + 1), (turn, key, out.asnumpy()[:3])
        if pool is not None:
            allocated.append(pool.allocated)
    if pool is not None:
        assert allocated[-1] - allocated[4] <= 8, allocated
    print("GROUPED FRAMES OK (pool buffers allocated per round: %s)" % (
        [b - a for a, b in zip(allocated, allocated[1:])] if allocated else "-"))


def check_priority(kv, out_dir):
    low, high = mx.nd.ones((64 * 1024,)), mx.nd.ones((4 * 1024,))   # 64 and 4 partitions
    kv.init(0, mx.nd.zeros(low.shape))
    kv.init(1, mx.nd.zeros(high.shape))
    mx.nd.waitall()
    kv.pushpull(0, low, priority=-10)
    kv.pushpull(1, high, priority=0)
    mx.nd.waitall()
    events = [e for e in kv._engine.tracer.events() if e.stage == Stage.PUSH]
    order = [e.key for e in sorted(events, key=lambda e: e.start_ns)]
    with open("%s/push_order_rank%d.json" % (out_dir, kv.rank), "w") as f:
        json.dump(order, f)
    first_high = order.index(1)
    high_run = order[first_high:first_high + 4]
    assert high_run == [1, 1, 1, 1], order
    assert 0 in order[first_high + 4:], "no low-priority partition was left to overtake: %s" % order
    assert np.all(low.asnumpy() == 2) and np.all(high.asnumpy() == 2)
    print("PRIORITY OK: high-priority partitions left at positions %d-%d of %d"
          % (first_high, first_high + 3, len(order)))


def check_collector(kv):
    import gc
    print("COLLECTOR young generation threshold %d" % gc.get_threshold()[0])


def check_push_threads(kv):
    """Which threads send the pushes: 30 partitions a round, credit for one at a time."""
    import collections
    import threading
    engine = kv._engine
    route, threads = engine.rounds.route, collections.Counter()
    original = route.push

    def push(group, done):
        threads[threading.current_thread().name] += 1
        original(group, done)
    route.push = push
    kv.init(3, mx.nd.zeros((30 * 1024,)))
    out = mx.nd.zeros((30 * 1024,))
    for _ in range(3):
        kv.pushpull(3, mx.nd.ones((30 * 1024,)), out=out)
        out.wait_to_read()
    assert np.all(out.asnumpy() == kv.num_workers), out.asnumpy()[:4]
    print("PUSH THREADS %s" % json.dumps(dict(threads), sort_keys=True))


def check_uninitialised(kv):
    try:
        kv.pushpull(7, mx.nd.ones((3,)))
    except KeyError as exc:
        assert "7" in str(exc) and "not initialised" in str(exc), exc
        print("UNINITIALISED OK: %s" % exc)
        return
    raise AssertionError("pushpull of a key never initialised did not raise")


def expect_error(kv, action) -> int:
    """Run ``action``; print its error as ``ERROR rank R: Type: message`` and return 3, or
    say there was none and return 0."""
    try:
        action()
    except Exception as exc:
        print("ERROR rank %d: %s: %s" % (kv.rank, type(exc).__name__, exc), flush=True)
        return 3
    print("no error on rank %d" % kv.rank)
    return 0


def check_mismatch(kv):
    shape = (10,) if kv.rank == 0 else (20,)

    def action():
        kv.init(5, mx.nd.zeros(shape))
        grad = mx.nd.ones(shape)
        kv.pushpull(5, grad)
        grad.asnumpy()
    return expect_error(kv, action)


def check_init_order(kv):
    """Workers initialising keys in different orders: balanced placement differs; say so."""
    keys = [(1, (1024,)), (2, (100,))]

    def action():
        for key, shape in (keys if kv.rank == 0 else keys[::-1]):
            kv.init(key, mx.nd.zeros(shape))
    return expect_error(kv, action)


def check_trace(kv):
    values = {"conv0_weight": (3000,), "dense0_bias": (10,)}
    for name, shape in values.items():
        kv.init(name, mx.nd.zeros(shape))
    for _ in range(4):      # buckets: learnt, formed, then two rounds in the bucket
        for index, (name, shape) in enumerate(values.items()):
            grads = [mx.nd.ones(shape, ctx=mx.cpu(i)) for i in range(2)]
            kv.pushpull(name, grads, priority=-index)
        mx.nd.waitall()
    assert float(grads[0][0].asscalar()) == 4.0  # 2 contexts x 2 workers
    print("TRACE OK")


def check_endless(kv, limit=None, stop_file=None):
    kv.init(0, mx.nd.zeros((10000,)))
    kv.init(1, mx.nd.zeros((1,)))

    def stop_agreed():
        """Rank 0 says whether ``stop_file`` exists; every rank learns it from the sum."""
        flag = mx.nd.array([1 if kv.rank == 0 and os.path.exists(stop_file) else 0])
        kv.pushpull(1, flag)
        return float(flag.asscalar()) > 0

    def action():
        started, rounds, stopped = time.monotonic(), 0, False
        while time.monotonic() - started < 120 and rounds != limit and not stopped:
            grad = mx.nd.ones((10000,))
            kv.pushpull(0, grad)
            assert float(grad[0].asscalar()) == kv.num_workers
            rounds += 1
            if rounds % 20 == 0:
                print("round %d" % rounds, flush=True)
            stopped = stop_file is not None and stop_agreed()
        if rounds == limit or stopped:
            print("ROUNDS OK after %d rounds" % rounds, flush=True)
    return expect_error(kv, action)


def check_varied(kv, limit):
    sizes = {0: 300000, 1: 10, 2: 5000}
    for key, size in sizes.items():
        kv.init(key, mx.nd.zeros((size,)))
    workers = kv.num_workers
    for r in range(limit):
        grads = {key: mx.nd.arange(size) + (kv.rank + 1) * (r + 1) + key
                 for key, size in sizes.items()}
        for key in sizes:
            kv.pushpull(key, grads[key], priority=-key)
        for key, size in sizes.items():
            want = (workers * np.arange(size, dtype=np.float32)
                    + workers * (workers + 1) // 2 * (r + 1) + workers * key)
            got = grads[key].asnumpy()
            if not np.array_equal(got, want):
                bad = np.flatnonzero(got != want)
                print("WRONG SUM key %d round %d at %d positions, e.g. [%d] %s != %s"
                      % (key, r, bad.size, bad[0], got[bad[0]], want[bad[0]]), flush=True)
                return 1
        if (r + 1) % 20 == 0:
            print("round %d" % (r + 1), flush=True)
    print("VARIED OK after %d rounds" % limit, flush=True)
    return 0


def check_compress(kv, params_json, contexts):
    """Gradient compression end to end: every rank sets ``params``, pushes 4 rounds of known
    gradients (summed over ``contexts`` CPU contexts first) and checks each result against
    the same compression simulated here for every rank and the server; and that the pushed
    payload really shrank."""
    from kvstore_byteps.compress.params import parse_compression_params
    from kvstore_byteps.compress.state import PartitionCompressor, server_side
    params = json.loads(params_json)
    kv.set_gradient_compression(params)
    n, rounds = 100000, 4
    ctxs = [mx.cpu(i) for i in range(contexts)]
    kv.init(0, mx.nd.zeros((n,)))
    spec = parse_compression_params(params)
    [slot] = kv._engine.layout(0, (n,), np.float32).partitions
    workers = [PartitionCompressor(spec, salt=slot.ps_key) for _ in range(kv.num_workers)]
    server = PartitionCompressor(server_side(spec), salt=slot.ps_key)

    def gradient(rank, r, device):
        return np.random.default_rng([rank, r, device]).standard_normal(n).astype(np.float32)
    for r in range(rounds):
        grads = [mx.nd.array(gradient(kv.rank, r, d), ctx=c) for d, c in enumerate(ctxs)]
        kv.pushpull(0, grads)
        total = np.zeros(n, np.float32)
        for rank, part in enumerate(workers):
            x = sum(gradient(rank, r, d) for d in range(contexts))
            total += part.decode(part.encode(x, r), n, r)
        expected = server.decode(server.encode(total, r), n, r)
        for g in grads:
            np.testing.assert_allclose(g.asnumpy(), expected, rtol=1e-5, atol=1e-5)
    pushed = kv._engine.rounds.compressed.bytes_pushed
    print("COMPRESS OK %d bytes pushed for %d uncompressed (%.4f)"
          % (pushed, rounds * n * 4, pushed / (rounds * n * 4.0)), flush=True)


def main():
    mode = sys.argv[1]
    kv = mx.kv.create("dist_byteps")
    if mode == "async":
        check_async(kv)
    elif mode == "priority":
        check_priority(kv, sys.argv[2])
    elif mode == "uninitialised":
        check_uninitialised(kv)
    elif mode == "collector":
        check_collector(kv)
    elif mode == "push-threads":
        check_push_threads(kv)
    elif mode == "init-order":
        return check_init_order(kv)
    elif mode == "trace":
        check_trace(kv)
    elif mode == "endless":
        return check_endless(kv)
    elif mode == "rounds":
        return check_endless(kv, int(sys.argv[2]))
    elif mode == "compress":
        return check_compress(kv, sys.argv[2], int(sys.argv[3]))
    elif mode == "varied":
        return check_varied(kv, int(sys.argv[2]))
    elif mode == "until":
        return check_endless(kv, stop_file=sys.argv[2])
    else:
        return check_mismatch(kv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
