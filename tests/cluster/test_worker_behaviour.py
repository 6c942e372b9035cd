"""dist_byteps behaviours in real 2-worker clusters with our BytePS server."""
import collections
import json
import re

import pytest

from tests.support.vans import van_env
from tests.support.cluster import SCHEDULER_OURS, SERVER_OURS, UPSTREAM, Cluster, app, \
    assert_all_ok

pytestmark = pytest.mark.timeout(120)


def run_checks(mode, *args, env=None, timeout=90, expect_ok=True, servers=1):
    env = dict({"MXNET_KVSTORE_SERVER": "byteps"}, **(env or {}))
    with Cluster(num_workers=2, num_servers=servers, env=env) as cluster:
        cluster.start("scheduler", SCHEDULER_OURS)
        for _ in range(servers):
            cluster.start("server", SERVER_OURS)
        workers = [cluster.start("worker", app("byteps_checks.py", mode, *args))
                   for _ in range(2)]
        if expect_ok:
            results = cluster.wait_all(timeout)
            assert_all_ok(results, cluster)
            return results
        for name in workers:                     # the servers may wait for them forever
            cluster.procs[name][0].wait(timeout)
        return {name: (cluster.procs[name][0].returncode, cluster.output(name))
                for name in workers}


@pytest.mark.parametrize("van,pull_with_push", [("auto", "1"), ("zmq", "0")])
def test_pushpull_returns_before_communication_and_result_is_correct(van, pull_with_push):
    env = van_env(van)
    if pull_with_push == "0":             # on by default
        env["BYTEPS_PULL_WITH_PUSH"] = "0"
    results = run_checks("async", env=env, servers=2)
    assert all("ASYNC OK" in results[w][1] for w in ("worker0", "worker1")), results
    rides = pull_with_push == "1"
    said = "".join(results[w][1] for w in ("worker0", "worker1"))   # rank 0 says it
    assert "dist_byteps: 2 workers" in said
    assert ("each pull sent with its push" in said) == rides, said


def test_high_priority_partitions_overtake_queued_low_priority_ones(tmp_path):
    env = {"BYTEPS_PARTITION_BYTES": "4096", "BYTEPS_SCHEDULING_CREDIT": "1",
           "BYTEPS_TRACE_ON": "1", "BYTEPS_TRACE_START_STEP": "0",
           "BYTEPS_TRACE_DIR": str(tmp_path)}
    results = run_checks("priority", tmp_path, env=env)
    assert all("PRIORITY OK" in results[w][1] for w in ("worker0", "worker1")), results


@pytest.mark.parametrize("setting,threshold", [(None, 10000), ("2500", 2500), ("0", 700)])
def test_a_worker_collects_young_garbage_as_configured(setting, threshold):
    # 700 is Python's own default, which BYTEPS_GC_YOUNG_THRESHOLD=0 leaves alone
    env = {} if setting is None else {"BYTEPS_GC_YOUNG_THRESHOLD": setting}
    results = run_checks("collector", env=env)
    for name in ("worker0", "worker1"):
        assert "COLLECTOR young generation threshold %d" % threshold in results[name][1]


@pytest.mark.parametrize("van", ["auto", "zmq"])
def test_returned_credit_sends_the_next_pushes_from_the_receive_loop(van):
    # byteps_tcp between our nodes (auto): the receive loop that completes a push's
    # acknowledgement sends the partitions its credit lets in, instead of waking the PUSH
    # thread; zmq's sends may wait for a peer, so there the PUSH thread sends them all
    env = {"BYTEPS_PARTITION_BYTES": "4096", "BYTEPS_SCHEDULING_CREDIT": "1",
           "BYTEPS_FUSION_BYTES": "0"}
    if van == "zmq":
        env["DMLC_PS_VAN_TYPE"] = "zmq"
    results = run_checks("push-threads", env=env)
    for name in ("worker0", "worker1"):
        line = [l for l in results[name][1].splitlines() if l.startswith("PUSH THREADS ")]
        assert line, results[name][1]
        threads = json.loads(line[0][len("PUSH THREADS "):])
        assert sum(threads.values()) >= 3 * 30 // 2, threads   # batches of one or more
        if van == "auto":
            assert threads.get("van-receive", 0) > sum(threads.values()) // 2, threads
        else:
            assert set(threads) == {"kvstore-byteps-PUSH"}, threads


def test_pushpull_of_a_key_never_initialised_raises_key_error():
    results = run_checks("uninitialised")
    assert all("UNINITIALISED OK" in results[w][1] for w in ("worker0", "worker1")), results


def test_workers_disagreeing_on_a_shape_get_an_error_naming_the_key():
    results = run_checks("mismatch", env={"BYTEPS_REQUEST_TIMEOUT": "5"}, timeout=60,
                         expect_ok=False)
    for name, (code, out) in results.items():
        assert code == 3, "%s exited %s:\n%s" % (name, code, out)
        assert "ERROR rank" in out and "key 5" in out, out


@pytest.mark.parametrize("buckets", ["0", "262144"])
def test_trace_shows_every_stage_with_the_parameter_names(tmp_path, buckets):
    import json
    # a key's step counts its own rounds: step 1 is the second round of a key, and of a
    # bucket (formed at the program's second step, travelling from its third)
    env = {"BYTEPS_TRACE_ON": "1", "BYTEPS_TRACE_START_STEP": "1",
           "BYTEPS_TRACE_END_STEP": "1", "BYTEPS_TRACE_DIR": str(tmp_path),
           "BYTEPS_FUSION_BYTES": buckets}
    results = run_checks("trace", env=env)
    assert all("TRACE OK" in results[w][1] for w in ("worker0", "worker1")), results
    for rank in (0, 1):
        events = json.loads((tmp_path / str(rank) / "comm.json").read_text())["traceEvents"]
        assert {e["args"]["step"] for e in events} == {1}
        stages = {(e["pid"], e["tid"], e["name"]) for e in events}
        if buckets != "0":      # the two keys travel as one bucket, named by its parameters
            name = "bucket 0 (conv0_weight, dense0_bias)"
            assert {(name, "part 0", "PUSH"), (name, "part 0", "PULL"),
                    (name, "part 0", "LOCAL_BROADCAST")} <= stages, stages
            continue
        for name in ("conv0_weight", "dense0_bias"):   # one partition each
            assert {(name, "tensor", "LOCAL_REDUCE"), (name, "part 0", "PUSH"),
                    (name, "part 0", "PULL"), (name, "part 0", "LOCAL_BROADCAST")} <= stages
        first = {e["name"]: e for e in events if e["pid"] == "conv0_weight"}
        assert first["LOCAL_REDUCE"]["ts"] <= first["PUSH"]["ts"] <= first["PULL"]["ts"] \
            <= first["LOCAL_BROADCAST"]["ts"]


def test_workers_initialising_keys_in_different_orders_are_told_why():
    # balanced placement follows the initialisation order; rank 1 reverses it, so it looks for
    # the partitions on the wrong servers: a clear error at init, never a hang or a wrong sum
    results = run_checks("init-order", env={"BYTEPS_REQUEST_TIMEOUT": "6"}, servers=2,
                         timeout=60, expect_ok=False)
    code, out = results["worker1"] if "ERROR rank 1" in results["worker1"][1] else \
        results["worker0"]
    assert code == 3 and "ERROR rank 1" in out, results
    assert "same order" in out and "BYTEPS_KEY_HASH_FN" in out, out


def test_module_fit_over_dist_byteps_keeps_workers_identical():
    with Cluster(num_workers=2, num_servers=1, env={"MXNET_KVSTORE_SERVER": "byteps"}) as cluster:
        cluster.start("scheduler", SCHEDULER_OURS)
        cluster.start("server", UPSTREAM)   # as MXNet's launcher runs it, with the knob
        for _ in range(2):
            cluster.start("worker", app("module_fit.py"))
        results = cluster.wait_all(90)
        assert_all_ok(results, cluster)
    lines = [line for w in ("worker0", "worker1") for line in results[w][1].splitlines()
             if "CHECKSUM" in line or line.startswith("REFERENCE")]
    sums = sorted(line.split("CHECKSUM ")[1] for line in lines if "CHECKSUM" in line)
    assert len(sums) == 2 and sums[0] == sums[1], lines
    assert all("type dist_sync_byteps" in line for line in lines if "CHECKSUM" in line), lines
    reference = [line for line in lines if line.startswith("REFERENCE")]
    assert len(reference) == 1 and float(reference[0].split("max-diff ")[1]) < 1e-5, lines


@pytest.mark.parametrize("victim", ["worker", "server"])
def test_a_killed_node_is_named_and_every_other_node_exits_in_bounded_time(victim):
    """Nodes started by hand (no launcher to tear the job down): kill -9 one of them; the
    others must exit non-zero within the heartbeat timeout + 10 s, naming the dead node."""
    import os
    import signal
    import time
    env = {"MXNET_KVSTORE_SERVER": "byteps", "PS_HEARTBEAT_INTERVAL": "1",
           "PS_HEARTBEAT_TIMEOUT": "5"}
    with Cluster(num_workers=2, num_servers=1, env=env) as cluster:
        cluster.start("scheduler", SCHEDULER_OURS)
        cluster.start("server", SERVER_OURS)
        for _ in range(2):
            cluster.start("worker", app("byteps_checks.py", "endless"))
        cluster.wait_for("worker1", "round 20")
        name = "worker1" if victim == "worker" else "server0"
        proc = cluster.procs[name][0]
        os.kill(proc.pid, signal.SIGKILL)
        killed = time.monotonic()
        others = [n for n in cluster.procs if n != name]
        for other in others:
            cluster.procs[other][0].wait(max(1.0, killed + 15 - time.monotonic()))
        took = time.monotonic() - killed
        for other in others:
            code, out = cluster.procs[other][0].returncode, cluster.output(other)
            assert code not in (0, None), "%s exited %s:\n%s" % (other, code, out)
            assert "%s rank" % victim in out and "is dead" in out, "%s:\n%s" % (other, out)
        assert took < 15, took


def test_fuzzed_frames_from_strangers_leave_training_exact_and_the_log_bounded(tmp_path):
    """Thousands of mutated frames at the scheduler and the server while 2 workers train
    (until the fuzzer is done): no crash, every sum exact, each complaint logged once per
    peer and then only counted."""
    stop_file = tmp_path / "stop"
    with Cluster(num_workers=2, num_servers=1, env={"MXNET_KVSTORE_SERVER": "byteps"}) as cluster:
        server_port, = cluster.ports(1)
        scheduler_port = cluster.base_env["DMLC_PS_ROOT_PORT"]
        cluster.start("scheduler", SCHEDULER_OURS)
        cluster.start("server", SERVER_OURS, env={"PORT": str(server_port)})
        for _ in range(2):
            cluster.start("worker", app("byteps_checks.py", "until", stop_file))
        cluster.wait_for("worker0", "round 20")
        cluster.start("fuzzer", app("fuzzer.py", "127.0.0.1:%s,127.0.0.1:%d"
                                    % (scheduler_port, server_port), 2000, 7))
        cluster.procs["fuzzer0"][0].wait(60)
        results = cluster.stop_training(stop_file, 100)
    assert "FUZZ SENT 4000" in results["fuzzer0"][1]
    for name in ("scheduler0", "server0"):
        lines = [line for line in results[name][1].splitlines()
                 if " WARNING " in line or " ERROR " in line or "Traceback" in line]
        assert len(lines) < 60, "%s logged %d lines:\n%s" % (name, len(lines),
                                                             "\n".join(lines[:80]))
        # each complaint once per peer (the fuzzer has 5 identities), then only counted
        texts = collections.Counter(re.sub(r"[0-9]+|b'[^']*'", "#", line.split(" WARNING ")[-1])
                                    for line in lines)
        assert max(texts.values(), default=0) <= 5, texts.most_common(3)


def test_200_rounds_with_resend_and_10_percent_of_messages_dropped_stay_exact():
    env = {"PS_RESEND": "1", "PS_DROP_MSG": "10"}     # the default (adaptive) timeout
    results = run_checks("rounds", 200, env=env, timeout=150)
    drops = 0
    for name, (_, out) in results.items():
        if name.startswith("worker"):
            assert "ROUNDS OK" in out, out
        for line in out.splitlines():
            if "received data messages were dropped on purpose" in line:
                drops += int(line.split(": ")[-1].split()[0])
    assert drops > 0, results
