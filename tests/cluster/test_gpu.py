"""GPU paths (NCCL through cupy): run on a machine with CUDA GPUs, skipped cleanly elsewhere."""
import sys

import pytest

import numpy as np

from tests.support.cluster import SCHEDULER_OURS, Cluster, app, assert_all_ok
from tests.cluster.test_worker_training import reference_params

cupy = pytest.importorskip("cupy", reason="GPU tests need cupy (pip install kvstore-byteps[gpu])")
try:
    GPUS, WHY = cupy.cuda.runtime.getDeviceCount(), ""
except Exception as exc:  # no driver / no device
    GPUS, WHY = 0, " (%s: %s)" % (type(exc).__name__, exc)
pytestmark = [pytest.mark.skipif(GPUS == 0, reason="GPU tests need an NVIDIA GPU and its driver; "
                                 "cupy sees none%s" % WHY),
              pytest.mark.timeout(180)]


def test_cupy_and_nccl_import():
    from kvstore_byteps.engine.reduce import import_cupy
    assert import_cupy()[0] is cupy


@pytest.mark.parametrize("contexts", [1, min(GPUS, 2)])
def test_gluon_training_on_gpus_matches_single_process(tmp_path, contexts):
    with Cluster(num_workers=2, num_servers=1, env={"MXNET_KVSTORE_SERVER": "byteps"}) as cluster:
        cluster.start("scheduler", SCHEDULER_OURS)
        cluster.start("server", [sys.executable, "-c", "import mxnet"])
        for _ in range(2):
            cluster.start("worker", app("gluon_train.py", tmp_path, "--contexts", contexts,
                                        "--device", "gpu"))
        assert_all_ok(cluster.wait_all(150), cluster)
    expected = reference_params(5, 2)
    for rank in range(2):
        got = np.load(tmp_path / ("rank%d.npz" % rank))
        for name, value in expected.items():
            np.testing.assert_allclose(got[name], value, rtol=1e-4, atol=1e-5, err_msg=name)
