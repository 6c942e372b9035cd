"""mxnet_patch.engine_async under MXNET_ENGINE_TYPE=NaiveEngine (in a fresh interpreter)."""
import os
import subprocess
import sys

import pytest
from tests.support.paths import REPO


mx = pytest.importorskip("mxnet")

pytestmark = pytest.mark.timeout(60)


def test_naive_engine_waits_for_done_inside_the_push():
    code = (
        "import threading, numpy as np, mxnet as mx\n"
        "from mxnet_patch import engine_async\n"
        "out = mx.nd.zeros((3,))\n"
        "def fn(done):\n"
        "    def work():\n"
        "        import time; time.sleep(0.2)\n"
        "        engine_async.host_view(out)[...] = 5\n"
        "        done()\n"
        "    threading.Thread(target=work).start()\n"
        "engine_async.push_async(fn, mutable_arrays=[out])\n"
        "print(out.asnumpy().tolist())\n")
    env = dict(os.environ, MXNET_ENGINE_TYPE="NaiveEngine", PYTHONPATH=REPO)
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == "[5.0, 5.0, 5.0]"
