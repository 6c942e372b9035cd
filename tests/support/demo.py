"""The demo (examples/train_digits.py) launched the way users launch it, for cluster tests."""
import os
import subprocess
import sys

from tests.support.paths import REPO

LAUNCH = os.path.join(REPO, "launch.py")
DEMO = os.path.join(REPO, "examples", "train_digits.py")


def run_demo(spawn, params, *options, epochs=2, timeout=150, demo_args=()):
    """``launch.py -n 2 -s 2 [options] train_digits.py [demo_args]``, saving the parameters to
    ``params``; its output once it exited 0 (the test fails otherwise)."""
    argv = [sys.executable, LAUNCH, "-n", "2", "-s", "2", "--timeout", str(timeout), *options,
            "--env", "BYTEPS_START_TIMEOUT=60", "--env", "BYTEPS_REQUEST_TIMEOUT=90",
            sys.executable, DEMO, "--epochs", str(epochs), "--save-params", str(params),
            *demo_args]
    proc = spawn(argv, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    out, _ = proc.communicate(timeout=timeout + 20)
    assert proc.returncode == 0, out
    return out
