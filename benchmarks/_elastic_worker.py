"""A worker of bench_elastic.py: the digits demo (examples/train_digits.py) unchanged, with its
steps timed, and one worker killed with SIGKILL as it enters a given step.

    _elastic_worker.py KILL_RANK KILL_STEP [demo options]

Every worker records when each ``trainer.step`` returns; rank 0 prints them at exit as
``ELASTIC_STEPS <json list of seconds since the first step's end>``. The worker of rank
KILL_RANK (-1: none) kills itself as it enters its KILL_STEP-th step (counted from 1), after
its backward pass, before its gradients are pushed (a restarted one, ``launch.py
--max-restarts``, trains on).
"""
import atexit
import json
import os
import runpy
import signal
import sys
import time

from mxnet import gluon

DEMO = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples",
                    "train_digits.py")
TAG = "ELASTIC_STEPS "


def timed_step(step, kill_step, ends):
    def step_timed(self, *args, **kwargs):
        if len(ends) + 1 == kill_step:
            os.kill(os.getpid(), signal.SIGKILL)
        done = step(self, *args, **kwargs)
        ends.append(time.perf_counter())
        return done
    return step_timed


if __name__ == "__main__":
    kill_rank, kill_step = int(sys.argv[1]), int(sys.argv[2])
    rank = os.environ.get("DMLC_WORKER_ID")
    ends = []
    restarted = bool(os.environ.get("BYTEPS_RESTART_COUNT"))    # launch.py --max-restarts
    gluon.Trainer.step = timed_step(gluon.Trainer.step,
                                    kill_step if str(kill_rank) == rank and not restarted
                                    else -1, ends)
    if rank == "0":
        atexit.register(lambda: print(TAG + json.dumps([t - ends[0] for t in ends]),
                                      flush=True))
    sys.argv = [DEMO] + sys.argv[3:]
    runpy.run_path(DEMO, run_name="__main__")
