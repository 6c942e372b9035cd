"""Prints what a worker is told about its place: ``local_ranks.py hvd|kv``.

hvd  ``import kvstore_byteps.horovod as hvd``: prints
     ``HVD rank R size S local_rank L local_size LS`` after a Sum allreduce of ones, which must
     equal size() (every process took part).
kv   a plain ``mx.kv.create('dist_byteps')`` script: prints ``KV rank R num_workers N`` after a
     pushpull of ones, which must equal num_workers.
"""
import sys

import mxnet as mx


def hvd_mode() -> None:
    import kvstore_byteps.horovod as hvd
    hvd.init()
    total = hvd.allreduce(mx.nd.ones((3,)), op=hvd.Sum, name="ones").asnumpy()
    assert (total == hvd.size()).all(), total
    print("HVD rank %d size %d local_rank %d local_size %d"
          % (hvd.rank(), hvd.size(), hvd.local_rank(), hvd.local_size()), flush=True)
    hvd.shutdown()


def kv_mode() -> None:
    kv = mx.kv.create("dist_byteps")
    kv.init(3, mx.nd.zeros((3,)))
    out = mx.nd.zeros((3,))
    kv.pushpull(3, mx.nd.ones((3,)), out=out)
    assert (out.asnumpy() == kv.num_workers).all(), out
    print("KV rank %d num_workers %d" % (kv.rank, kv.num_workers), flush=True)


if __name__ == "__main__":
    {"hvd": hvd_mode, "kv": kv_mode}[sys.argv[1]]()
