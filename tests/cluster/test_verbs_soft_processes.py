"""The soft RDMA provider across processes: a write lands in another process's memory."""
import json
import subprocess
import sys

import numpy as np
import pytest

from kvstore_byteps.van.rdma.verbs.api import SGE, Access, Endpoint, Opcode, SendWR, WCStatus
from kvstore_byteps.van.rdma.verbs.soft_fabric import UnixFabric
from tests.support.paths import REPO

PEER = REPO + "/tests/apps/soft_rdma_peer.py"


@pytest.mark.timeout(60)
def test_a_write_and_a_send_land_in_the_other_process(spawn):
    child = spawn([sys.executable, PEER, "--expect", "2"], cwd=REPO, stdin=subprocess.PIPE,
                  stdout=subprocess.PIPE, text=True)
    theirs = json.loads(child.stdout.readline())
    fabric = UnixFabric()
    try:
        device = fabric.device()
        pd, cq = device.alloc_pd(), device.create_cq(8)
        qp = device.create_qp(pd, cq, cq)
        memory = np.arange(16, dtype=np.uint8)
        mr = pd.reg_mr(memory, Access.LOCAL_WRITE)
        child.stdin.write(json.dumps({"address": device.address, "qp_num": qp.qp_num}) + "\n")
        child.stdin.flush()
        qp.to_init(Access(0))
        qp.to_rtr(Endpoint(theirs["address"], theirs["qp_num"]))
        qp.to_rts()
        # the peer's queue pair must be ready to receive first (a request before that fails
        # with RETRY_EXC_ERR, as on RC without retries)
        assert json.loads(child.stdout.readline()) == {"ready": True}
        qp.post_send(SendWR(1, Opcode.RDMA_WRITE_WITH_IMM, [SGE(mr.addr, 8, mr.lkey)],
                            remote_addr=theirs["addr"], rkey=theirs["rkey"], imm_data=7))
        qp.post_send(SendWR(2, Opcode.SEND, [SGE(mr.addr + 8, 8, mr.lkey)]))
        out, _ = child.communicate(timeout=30)
        sent = []
        while len(sent) < 2:
            sent += cq.poll()
    finally:
        fabric.close()
    assert child.returncode == 0, out
    write, send = [json.loads(line) for line in out.splitlines()]
    assert (write["status"], write["imm"], write["bytes"]) == ("SUCCESS", 7, 8)
    assert (send["status"], send["imm"], send["bytes"]) == ("SUCCESS", None, 8)
    assert send["head"] == list(range(8)) and send["tail"] == list(range(8, 16))
    assert [c.status for c in sent] == [WCStatus.SUCCESS] * 2
