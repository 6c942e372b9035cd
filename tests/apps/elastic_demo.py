"""The digits demo (examples/train_digits.py) as an elastic job's worker, one of which dies:

    elastic_demo.py KILL_RANKS KILL_STEP [demo options]

The workers of ranks ``KILL_RANKS`` (comma-separated; DMLC_WORKER_ID, as launch.py sets it)
each kill themselves with
SIGKILL as it enters its ``KILL_STEP``-th ``trainer.step`` (counted from 1, over the epochs):
mid-epoch, after its backward pass, before its gradients are pushed. The others run the demo
unchanged. (``none``: nobody dies, the uninterrupted run to compare with.) ``HOLD_FOR_JOIN``:
the others hold their commit at the end of the last epoch but two until a late worker asks to
join (join_hold.py).
"""
import os
import runpy
import signal
import sys

from mxnet import gluon

import join_hold

DEMO = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples",
                    "train_digits.py")


def dying_step(step, kill_step):
    calls = [0]

    def step_or_die(self, *args, **kwargs):
        calls[0] += 1
        if calls[0] == kill_step:
            os.kill(os.getpid(), signal.SIGKILL)
        return step(self, *args, **kwargs)
    return step_or_die


if __name__ == "__main__":
    kill_ranks, kill_step = sys.argv[1].split(","), int(sys.argv[2])
    # (a restarted worker, launch.py --max-restarts, trains on)
    if (os.environ.get("DMLC_WORKER_ID") in kill_ranks
            and not os.environ.get("BYTEPS_RESTART_COUNT")):
        gluon.Trainer.step = dying_step(gluon.Trainer.step, kill_step)
    sys.argv = [DEMO] + sys.argv[3:]
    epochs = int(sys.argv[sys.argv.index("--epochs") + 1])
    join_hold.install(lambda state: (state.epoch, state.batch) == (epochs - 1, 0))
    runpy.run_path(DEMO, run_name="__main__")
