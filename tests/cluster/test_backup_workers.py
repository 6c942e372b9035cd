"""Synchronous training with backup workers (BYTEPS_BACKUP_WORKERS=1 of 3 workers), one
worker slower than the others and every step randomly late: through the store's API the
servers' weights hold exactly the counted pushes, each scaled by W/c of its round
(tests/apps/backup_train.py checks them); Module.fit trains, and every worker ends with the
same weights. When the others end their loop with a barrier (and a pull of the final weights),
the slow worker's training ends (TrainingOver: no round closes with fewer than W - b pushes),
caught or not: nothing hangs, every worker exits 0. Refusals (another mode at the server, MXNet's servers) are unit
tests: tests/unit/test_server_backup.py, tests/unit/test_training_modes.py."""
import re
import sys

import pytest

from tests.support.cluster import SCHEDULER_OURS, Cluster, app, assert_all_ok

pytestmark = pytest.mark.timeout(120)

SERVER = [sys.executable, "-c", "import mxnet"]      # with MXNET_KVSTORE_SERVER=byteps
WORKERS = 3


# gluon's Trainer takes the store's pushpull path, as "kv" does (the demo and the straggler
# benchmark train through it); Module pushes and pulls separately.
@pytest.mark.parametrize("path,steps,caught", [("kv", 30, True), ("module", 20, True),
                                               ("kv", 30, False)])
def test_backup_workers_train_without_the_slowest(path, steps, caught):
    env = {"MXNET_KVSTORE_SERVER": "byteps", "BYTEPS_BACKUP_WORKERS": "1"}
    with Cluster(num_workers=WORKERS, num_servers=2, env=env) as cluster:
        cluster.start("scheduler", SCHEDULER_OURS)
        for _ in range(2):
            cluster.start("server", SERVER)
        for _ in range(WORKERS):
            cluster.start("worker", app("backup_train.py", path, steps, WORKERS - 1,
                                        *([] if caught else ["uncaught"])))
        results = cluster.wait_all(100)
        assert_all_ok(results, cluster)
    output = "".join(results["worker%d" % n][1] for n in range(WORKERS))
    found = dict(re.findall(r"BACKUP_RESULT %s (\d) (.*)" % path, output))
    # uncaught, TrainingOver may end the slow worker's process before its final pull (its
    # exit passes the finish and shutdown barriers, which no longer pair with the others')
    assert len(found) >= (WORKERS if caught else WORKERS - 1), output
    assert len(set(found.values())) == 1, output
