"""The byteps_rdma van on the soft provider: the demo trains as on the default van (whose
parameters equal zmq's: test_demo_variants.py, MXNet's servers); an upstream MXNet node
is refused with a clear error; without a device a node stops at start with one line. On a
machine with an RDMA device and pyverbs, the demo on that device trains as on zmq (skipped
with the reason elsewhere)."""
import os
import subprocess

import pytest

from tests.support.cluster import SCHEDULER_OURS, Cluster, app
from tests.support.demo import run_demo


@pytest.mark.timeout(200)
def test_the_demo_over_rdma_gives_the_parameters_of_the_default_van(spawn, tmp_path,
                                                                   demo_reference):
    out = run_demo(spawn, tmp_path / "rdma.params", "--env", "DMLC_PS_VAN_TYPE=byteps_rdma",
                   "--env", "BYTEPS_RDMA_DEVICE=soft")
    assert "van byteps_rdma;" in out and "parameters identical on all 2 workers" in out, out
    assert (tmp_path / "rdma.params").read_bytes() == demo_reference.params


def _real_device():
    """The RDMA device to test on (KVSTORE_TEST_RDMA_DEVICE, else the first); skip without."""
    sysfs = "/sys/class/infiniband"
    devices = sorted(os.listdir(sysfs)) if os.path.isdir(sysfs) else []
    if not devices:
        pytest.skip("no RDMA device here (%s is empty or missing): the pyverbs provider's "
                    "hardware test needs one" % sysfs)
    pytest.importorskip("pyverbs", reason="pyverbs is not installed (pip install '.[rdma]')")
    return os.environ.get("KVSTORE_TEST_RDMA_DEVICE", devices[0])


@pytest.mark.timeout(200)
def test_the_demo_on_a_real_rdma_device_gives_the_parameters_of_zmq(spawn, tmp_path):
    device = _real_device()
    run_demo(spawn, tmp_path / "zmq.params", "--env", "DMLC_PS_VAN_TYPE=zmq", epochs=3)
    out = run_demo(spawn, tmp_path / "rdma.params", "--env", "DMLC_PS_VAN_TYPE=byteps_rdma",
                   "--env", "BYTEPS_RDMA_DEVICE=%s" % device, epochs=3)
    assert "van byteps_rdma;" in out and "parameters identical on all 2 workers" in out, out
    assert (tmp_path / "rdma.params").read_bytes() == (tmp_path / "zmq.params").read_bytes()


@pytest.mark.timeout(60)
def test_an_upstream_node_joining_an_rdma_cluster_stops_it_with_a_clear_error():
    env = {"BYTEPS_START_TIMEOUT": "60"}
    with Cluster(num_workers=1, num_servers=1, env=env) as cluster:
        cluster.start("scheduler", SCHEDULER_OURS, env={"DMLC_PS_VAN_TYPE": "byteps_rdma",
                                                        "BYTEPS_RDMA_DEVICE": "soft"})
        cluster.start("worker", app("upstream_worker.py", "3"))
        proc = cluster.procs["scheduler0"][0]
        proc.wait(30)
        out = cluster.output("scheduler0")
    assert proc.returncode != 0 and "speaks ZeroMQ" in out, out


@pytest.mark.timeout(60)
def test_without_a_device_a_node_stops_at_start_with_one_line(spawn):
    env = dict(os.environ, DMLC_ROLE="scheduler", DMLC_PS_VAN_TYPE="byteps_rdma",
               DMLC_PS_ROOT_URI="127.0.0.1", DMLC_PS_ROOT_PORT="1", DMLC_NUM_WORKER="1",
               DMLC_NUM_SERVER="1")
    env.pop("BYTEPS_RDMA_DEVICE", None)
    proc = spawn(SCHEDULER_OURS, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                 text=True)
    out, _ = proc.communicate(timeout=50)
    assert proc.returncode != 0, out
    errors = [line for line in out.splitlines() if "BYTEPS_RDMA_DEVICE=soft" in line]
    # no pyverbs here (CI may have it), or pyverbs and no device
    assert len(errors) == 1 and ("needs pyverbs" in errors[0] or
                                 "no RDMA device" in errors[0]), out
    assert "Traceback" not in out, out
