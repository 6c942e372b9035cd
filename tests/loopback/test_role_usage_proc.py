"""The replay benchmark's /proc sampling (benchmarks/_role_usage.py) finds a marked process
of another program, its role and the CPU it used."""
import os
import subprocess
import sys
import time

import pytest
from tests.support.benchmarks import load_benchmark

pytestmark = pytest.mark.timeout(60)


def test_a_marked_process_is_found_with_its_role_and_its_cpu_counted():
    usage_module = load_benchmark("_role_usage")
    env = {**os.environ, usage_module.JOB_MARK: "mark-%d" % os.getpid(), "DMLC_ROLE": "worker"}
    spin = "import time\nend = time.process_time() + 0.6\nwhile time.process_time() < end: pass\n" \
           "time.sleep(30)"
    child = subprocess.Popen([sys.executable, "-c", spin], env=env)
    try:
        with usage_module.RoleUsage(env[usage_module.JOB_MARK], period=0.05) as usage:
            start = time.time()
            time.sleep(1.5)
            end = time.time()
        got = usage.per_step(start, end, steps=1, nodes={"worker": 1})
    finally:
        child.kill()
        child.wait()
    assert set(got) == {"worker"}
    assert 0.4 <= got["worker"]["cpu_s"] <= 1.2
