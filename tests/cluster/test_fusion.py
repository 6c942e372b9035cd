"""Gradient buckets (BYTEPS_FUSION_BYTES) in real clusters: exact sums against dist_sync's,
and the two ways a program can break them ending in clear errors."""
import re
import time

import pytest

from tests.support.cluster import SCHEDULER_OURS, SERVER_OURS, UPSTREAM, Cluster, app, \
    assert_all_ok
from tests.support.demo import run_demo

pytestmark = pytest.mark.timeout(150)


def run(store, *args, env=None, servers=2, expect_ok=True, timeout=90, worker1_env=None):
    ours = store == "dist_byteps"
    base = {"MXNET_KVSTORE_SERVER": "byteps"} if ours else {}
    with Cluster(num_workers=2, num_servers=servers, env=dict(base, **(env or {}))) as cluster:
        cluster.start("scheduler", SCHEDULER_OURS if ours else UPSTREAM)
        for _ in range(servers):
            cluster.start("server", SERVER_OURS if ours else UPSTREAM)
        cluster.start("worker", app("fusion_checks.py", *args))
        cluster.start("worker", app("fusion_checks.py", *args), env=worker1_env)
        if expect_ok:
            results = cluster.wait_all(timeout)
            assert_all_ok(results, cluster)
            return {name: results[name] for name in ("worker0", "worker1")}
        for name in ("worker0", "worker1"):
            cluster.procs[name][0].wait(timeout)
        return {name: (cluster.procs[name][0].returncode, cluster.output(name))
                for name in ("worker0", "worker1")}


def sums(results):
    found = {re.search(r"SUMS (\w+)", out).group(1) for _, out in results.values()}
    assert len(found) == 1, results
    return found.pop()


def buckets(results):
    return {int(re.search(r"BUCKETS (\d+)", out).group(1)) for _, out in results.values()}


def test_fused_and_unfused_sums_are_bit_equal_to_dist_syncs_with_workers_in_random_order():
    rounds = "40"
    fused = run("dist_byteps", "sums", "dist_byteps", rounds)
    alone = run("dist_byteps", "sums", "dist_byteps", rounds, env={"BYTEPS_FUSION_BYTES": "0"})
    upstream = run("dist_sync", "sums", "dist_sync", rounds)
    assert buckets(fused) == {3} and buckets(alone) == {0}
    assert sums(fused) == sums(alone) == sums(upstream)


def test_keys_pushed_and_read_one_at_a_time_go_alone_on_every_worker_and_sum_exactly():
    results = run("dist_byteps", "wait", env={"BYTEPS_LOG_LEVEL": "INFO"})
    for _, out in results.values():
        assert float(re.search(r"WAIT OK ([\d.]+)", out).group(1)) < 10, out   # never waits
        # rank 0 saw the reads in the first round of calls; every worker follows its decision
        assert re.search(r"worker rank \d: bucket 0 \(keys 0, 1, 2, float32, 120 bytes\) goes "
                         r"alone: rank 0 saw the program read a key's result before pushing "
                         r"the next", out), out


def test_a_worker_slower_between_two_members_keeps_every_round_in_the_bucket_as_the_others():
    # Issue 66: a bucket whose calls stopped for a second was dissolved by that worker alone;
    # a worker whose backward was slower between two members (a loaded host, a slower layer)
    # then pushed the round key by key while the others pushed the bucket, and every worker
    # waited for the others' pushes at the servers until BYTEPS_REQUEST_TIMEOUT (here 20 s)
    results = run("dist_byteps", "paced", "1.5", env={"BYTEPS_REQUEST_TIMEOUT": "20"},
                  timeout=60)
    for _, out in results.values():
        assert "PACED OK" in out, out


def test_a_round_called_before_the_bucket_formed_goes_alone_on_every_worker_however_late():
    # Whether a round travels in its bucket is decided when it is called, in the program's
    # order: decided when its gradient was ready, a late first-round gradient joined the
    # bucket formed meanwhile on one worker only, and both workers waited until their
    # requests' deadline (Module.fit hung so about one job in ten)
    results = run("dist_byteps", "late", env={"BYTEPS_REQUEST_TIMEOUT": "20"}, timeout=60)
    for _, out in results.values():
        assert "LATE OK" in out, out


def test_a_member_whose_gradient_never_comes_fails_the_round_naming_it():
    results = run("dist_byteps", "stuck", env={"BYTEPS_FUSION_TIMEOUT": "2"},
                  expect_ok=False, timeout=60)
    for _, out in results.values():
        assert "STUCK FAILED" in out, out
        assert "waited 2 s for the gradient of key 1 after keys 0, 2" in out, out


def test_a_worker_that_fuses_otherwise_than_rank_0_ends_the_job_at_start():
    # (keys declared in different orders already fail at their own initialisation:
    # test_worker_behaviour.py; here only BYTEPS_FUSION_BYTES differs). Found only when a
    # bucket was set up, a bucket rank 0 never made left the other waiting for its key until
    # BYTEPS_REQUEST_TIMEOUT (a new user's run: 300 s of silence); now rank 0's value is in the
    # layout every worker reads at start.
    started = time.monotonic()
    results = run("dist_byteps", "mismatch", env={"BYTEPS_REQUEST_TIMEOUT": "30"},
                  worker1_env={"BYTEPS_FUSION_BYTES": "12"}, expect_ok=False, timeout=60)
    said = [out for code, out in results.values()
            if re.search(r"configuration error: worker rank 1 has BYTEPS_FUSION_BYTES=\d+, "
                         r"rank 0 \d+: .*set the same BYTEPS_FUSION_BYTES on every worker", out)]
    assert len(said) == 1, results
    told = [out for code, out in results.values() if out not in said and re.search(
        r"worker rank 1 \(node \d+\) at \S+ ended the job: worker rank 1 has "
        r"BYTEPS_FUSION_BYTES=", out)]
    assert len(told) == 1, results           # rank 0 says why too
    assert all(code != 0 for code, _ in results.values()), results
    assert time.monotonic() - started < 25, results


@pytest.mark.timeout(200)
def test_the_demo_gives_the_same_parameters_with_buckets_on_and_off(spawn, tmp_path):
    # gluon's Trainer: its keys are declared together and pushed in one loop every step; the
    # workers update (with the servers' optimizer each key travels alone: no buckets)
    workers = ("--env", "MXNET_UPDATE_ON_KVSTORE=0")
    fused = run_demo(spawn, tmp_path / "fused.params", *workers, "--env",
                     "BYTEPS_LOG_LEVEL=INFO")
    alone = run_demo(spawn, tmp_path / "alone.params", *workers, "--env",
                     "BYTEPS_FUSION_BYTES=0")
    assert "[digits] parameters identical on all 2 workers" in fused
    assert "[digits] parameters identical on all 2 workers" in alone, alone
    assert "gradient buckets of up to 4096000 bytes" in fused, fused
    # the metrics key (float64, declared first) is bucket 0, alone; the six parameters fused
    assert "bucket 1 (keys 0, 1, 2, 3, 4, 5, float32, 68904 bytes) travels" in fused, fused
    assert "is not used" not in fused and "goes alone" not in fused, fused   # never alone
    assert (tmp_path / "fused.params").read_bytes() == (tmp_path / "alone.params").read_bytes()
