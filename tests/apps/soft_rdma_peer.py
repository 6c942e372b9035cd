"""A soft RDMA device in a process of its own (tests/cluster/test_verbs_soft_processes.py).

Prints its endpoint and region as a JSON line, reads the peer's endpoint from stdin, posts
receives, says when its queue pair is ready (``{"ready": true}``: the soft provider, strict as
RC without retries, refuses a request that arrives before that), and prints each completion and the bytes written into its region (JSON lines) until
``--expect`` completions arrived (exit 0) or 20 s passed (exit 3)."""
import argparse
import json
import sys
import time

import numpy as np

from kvstore_byteps.van.rdma.verbs.api import SGE, Access, Endpoint, QPCaps, RecvWR
from kvstore_byteps.van.rdma.verbs.soft_fabric import UnixFabric


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--expect", type=int, default=1)
    args = p.parse_args()
    fabric = UnixFabric()
    device = fabric.device()
    pd, cq = device.alloc_pd(), device.create_cq(64)
    qp = device.create_qp(pd, cq, cq, QPCaps(max_recv_wr=args.expect))
    memory = np.zeros(4096, np.uint8)
    mr = pd.reg_mr(memory, Access.LOCAL_WRITE | Access.REMOTE_WRITE)
    print(json.dumps({"address": device.address, "qp_num": qp.qp_num, "addr": mr.addr,
                      "rkey": mr.rkey}), flush=True)
    peer = json.loads(sys.stdin.readline())
    qp.to_init(Access.REMOTE_WRITE)
    for i in range(args.expect):
        qp.post_recv(RecvWR(i, [SGE(mr.addr + 2048, 2048, mr.lkey)]))
    qp.to_rtr(Endpoint(peer["address"], peer["qp_num"]))
    qp.to_rts()
    print(json.dumps({"ready": True}), flush=True)
    got, deadline = 0, time.monotonic() + 20
    while got < args.expect and time.monotonic() < deadline:
        for completion in cq.poll():
            got += 1
            print(json.dumps({"status": completion.status.value, "imm": completion.imm_data,
                              "bytes": completion.byte_len,
                              "head": memory[:8].tolist(), "tail": memory[2048:2056].tolist()}),
                  flush=True)
        time.sleep(0.001)
    fabric.close()
    return 0 if got == args.expect else 3


if __name__ == "__main__":
    sys.exit(main())
