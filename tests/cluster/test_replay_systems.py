"""The replay benchmark's reference systems run as its jobs do (``launch.py``, a scheduler and
servers of their own): the plain-socket ceiling and the gloo all-reduce anchor sum exactly,
with tensors cut into several partitions and spread over the servers, and the job exits 0."""
import json
import os
import subprocess
import sys

import pytest
from tests.support.paths import REPO

LAUNCH = os.path.join(REPO, "launch.py")
WORKER = os.path.join(REPO, "benchmarks", "_replay_worker.py")
PLAIN = "%s %s" % (sys.executable, os.path.join(REPO, "benchmarks", "_plain_ps.py"))
GLOO = "%s %s" % (sys.executable, os.path.join(REPO, "benchmarks", "_gloo_replay.py"))
TAG = "REPLAY_RESULT "

pytestmark = pytest.mark.timeout(120)

#: Two layers: small tensors, and one of 2.4 MB (three partitions of at most 1 MB).
MODEL = [{"name": "first", "flops": 1.0, "params": [[64, 32], [64]], "index": [0, 1]},
         {"name": "big", "flops": 3.0, "params": [[2000, 300]], "index": [2]}]


def run_replay(spawn, tmp_path, kvstore, roles, dtype="float32", env=None):
    models = tmp_path / "models.json"
    models.write_text(json.dumps({"tiny": MODEL}))
    argv = [sys.executable, LAUNCH, "-n", "3", "-s", "2", "--timeout", "90", *roles,
            sys.executable, WORKER, "--kvstore", kvstore, "--models", str(models),
            "--model", "tiny", "--dtype", dtype, "--compute", "0.02", "--steps", "3",
            "--warmup", "1"]
    proc = spawn(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                 env=dict(os.environ, **(env or {})), cwd=REPO)
    output, _ = proc.communicate(timeout=110)
    results = [json.loads(line[line.index(TAG) + len(TAG):])
               for line in output.splitlines() if TAG in line]
    return proc.returncode, results, output


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_the_plain_socket_ceiling_sums_exactly_over_partitions_and_servers(spawn, tmp_path,
                                                                           dtype):
    code, results, output = run_replay(
        spawn, tmp_path, "plain", ["--scheduler-cmd", PLAIN + " scheduler",
                                   "--server-cmd", PLAIN + " server"],
        dtype=dtype, env={"PLAIN_PARTITION_BYTES": str(1 << 20)})
    assert code == 0, output                   # a worker with a wrong sum exits 3
    assert sorted(r["rank"] for r in results) == [0, 1, 2], output
    assert all(r["wrong_sums"] == 0 and len(r["steps"]) == 3 for r in results), output
    # CPU per step by thread, [user, system] (threads below a clock tick left out)
    assert all(len(pair) == 2 and min(pair) >= 0 and sum(pair) > 0
               for r in results for pair in r["threads_s"].values()), output


def test_the_gloo_anchor_sums_exactly_in_its_buckets(spawn, tmp_path):
    pytest.importorskip("torch.distributed", reason="the gloo anchor needs torch "
                                                    "(pip install torch)")
    code, results, output = run_replay(
        spawn, tmp_path, "gloo", ["--scheduler-cmd", GLOO + " rendezvous",
                                  "--server-cmd", GLOO + " idle"],
        env={"GLOO_BUCKET_BYTES": str(1 << 20)})
    assert code == 0, output
    assert sorted(r["rank"] for r in results) == [0, 1, 2], output
    assert all(r["wrong_sums"] == 0 for r in results), output
