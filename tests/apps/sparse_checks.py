"""row_sparse arrays through a dist store: the store's own calls, or a gluon embedding model.

    sparse_checks.py CASE OUT_DIR [--kvstore dist_byteps]

CASE: ``store`` (init of row_sparse keys, a small one, one split over every server by row
ranges (MXNET_KVSTORE_BIGARRAY_BOUND), a float16 one and one of several ranges on our servers; a few rounds of pushes of different
rows from each worker, one of them empty, with SGD on the servers; ``row_sparse_pull`` of some
rows and ``pull`` of every row, checked here against the SGD steps computed from every worker's
gradients; the refusals MXNet's stores make), ``gluon-rsp`` (``SparseEmbedding``, a row_sparse
weight), ``gluon-dense`` (``Embedding(sparse_grad=True)``, a dense weight with row_sparse
gradients). The gluon cases save rank's weights to OUT_DIR/rank<R>.npz. Prints ``STORE OK``.
"""
import argparse
import os

import mxnet as mx
import numpy as np
from mxnet import autograd, gluon

ROUNDS, LR = 4, 0.5
#: 11: 9.2 MB, a range a server on our servers, or three (two on one server) where partitions
#: are small (ROW_RANGE_BYTES, engine/sizing.py); answered range by range
SHAPES = {3: ((6, 4), "float32"), 7: ((50, 3), "float32"), 9: ((6, 4), "float16"),
          11: ((4500, 512), "float32")}
VOCAB, DIM, STEPS = 1000, 16, 5


def rows_of(rank, step, key, num_rows):
    """The rows worker ``rank`` pushes in ``step`` (rank 1 pushes none in step 2)."""
    if rank == 1 and step == 2:
        return np.zeros(0, dtype=np.int64)
    rng = np.random.RandomState(1000 * step + 10 * rank + key)
    return np.unique(rng.randint(0, num_rows, size=max(2, num_rows // 3)))


def grad_of(rank, step, key, shape, dtype):
    rows = rows_of(rank, step, key, shape[0])
    rng = np.random.RandomState(7 + 1000 * step + 10 * rank + key)
    data = rng.uniform(-1, 1, size=(len(rows),) + shape[1:]).astype(dtype)
    return rows, data


def store_case(kv):
    keys = sorted(SHAPES)
    want = {}
    for key in keys:
        shape, dtype = SHAPES[key]
        init = np.arange(np.prod(shape), dtype=np.float64).reshape(shape) / 10
        want[key] = init.astype(dtype).astype(np.float64)
        kv.init(key, mx.nd.array(init, dtype=dtype).tostype("row_sparse"))
    kv.set_optimizer(mx.optimizer.SGD(learning_rate=LR, rescale_grad=1.0, wd=0.0))
    for step in range(ROUNDS):
        for key in keys:
            shape, dtype = SHAPES[key]
            rows, data = grad_of(kv.rank, step, key, shape, dtype)
            grad = mx.nd.sparse.row_sparse_array((data, rows), shape=shape, dtype=dtype)
            kv.push(key, grad)
            total = np.zeros(shape)
            for rank in range(kv.num_workers):
                r, d = grad_of(rank, step, key, shape, dtype)
                total[r] += d.astype(np.float64)
            want[key] -= LR * total
        for key in keys:
            shape, dtype = SHAPES[key]
            ids = np.array([shape[0] - 1, 0, 2, 2])      # unsorted, repeated: MXNet's unique
            out = mx.nd.sparse.zeros("row_sparse", shape, dtype=dtype)
            kv.row_sparse_pull(key, out=out, row_ids=mx.nd.array(ids, dtype="int64"))
            got = out.tostype("default").asnumpy()
            tol = 2e-2 if dtype == "float16" else 1e-4
            rows = np.unique(ids)
            np.testing.assert_allclose(got[rows], want[key][rows], rtol=tol, atol=tol)
            assert not got[np.setdiff1d(np.arange(shape[0]), rows)].any(), "rows not asked for"
    for key in keys:
        shape, dtype = SHAPES[key]
        dense = mx.nd.zeros(shape, dtype=dtype)
        kv.pull(key, out=dense)
        tol = 2e-2 if dtype == "float16" else 1e-4
        np.testing.assert_allclose(dense.asnumpy(), want[key], rtol=tol, atol=tol)
    refusals(kv)
    print("STORE OK rank %d" % kv.rank, flush=True)


def refusals(kv):
    """MXNet's dist stores: a pull into a row_sparse array is refused with ignore_sparse=False
    (MXNetError) and skipped with it; a pushpull of row_sparse arrays is refused."""
    out = mx.nd.sparse.zeros("row_sparse", SHAPES[3][0])
    try:
        kv.pull(3, out=out, ignore_sparse=False)
        raise AssertionError("a pull into a row_sparse array was not refused")
    except mx.MXNetError as exc:
        assert "row_sparse_pull" in str(exc), exc
    kv.pull(3, out=out)       # ignore_sparse=True: skipped, as MXNet's stores do
    grad = mx.nd.sparse.zeros("row_sparse", SHAPES[3][0])
    try:
        kv.pushpull(3, grad, out=mx.nd.zeros(SHAPES[3][0]))
        raise AssertionError("a pushpull of a row_sparse array was not refused")
    except NotImplementedError as exc:
        assert "row_sparse_pull" in str(exc), exc


def gluon_case(kv, sparse_weight):
    mx.random.seed(1)
    if sparse_weight:
        embedding = gluon.contrib.nn.SparseEmbedding(VOCAB, DIM)
    else:
        embedding = gluon.nn.Embedding(VOCAB, DIM, sparse_grad=True)
    net = gluon.nn.Sequential()
    net.add(embedding, gluon.nn.Dense(1, in_units=DIM, flatten=False))
    net.initialize(mx.init.Uniform(0.1), ctx=mx.cpu())
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1}, kvstore=kv)
    rng = np.random.RandomState(100 + kv.rank)
    for _ in range(STEPS):
        ids = mx.nd.array(rng.randint(0, VOCAB, size=(8, 4)))
        with autograd.record():
            loss = (net(ids) ** 2).mean()
        loss.backward()
        trainer.step(1)    # the batch is averaged in the loss (gluon's sparse rule)
    weight = (embedding.weight.row_sparse_data(mx.nd.arange(VOCAB)).tostype("default")
              if sparse_weight else embedding.weight.data())
    dense = net[1]
    return {"embedding": weight.asnumpy(), "dense_w": dense.weight.data().asnumpy(),
            "dense_b": dense.bias.data().asnumpy()}, trainer._update_on_kvstore


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("case", choices=["store", "gluon-rsp", "gluon-dense"])
    parser.add_argument("out_dir")
    parser.add_argument("--kvstore", default="dist_byteps")
    args = parser.parse_args()
    kv = mx.kv.create(args.kvstore)
    if args.case == "store":
        store_case(kv)
        return
    values, on_kvstore = gluon_case(kv, args.case == "gluon-rsp")
    print("rank %d update_on_kvstore=%s type=%s" % (kv.rank, on_kvstore, kv.type), flush=True)
    np.savez(os.path.join(args.out_dir, "rank%d.npz" % kv.rank), **values)


if __name__ == "__main__":
    main()
