"""bpslaunch's plan from BytePS's environment (pure), and how tensor names become keys."""
import pytest

import kvstore_byteps.horovod as hvd        # imports MXNet: at collection, as other unit tests
from kvstore_byteps.config import Role
from kvstore_byteps.launcher.bpslaunch import UsageError, local_size, main, plan_bpslaunch
from mxnet_patch.collective import key_of

DIST = {"DMLC_NUM_WORKER": "2", "DMLC_NUM_SERVER": "1", "DMLC_PS_ROOT_URI": "10.0.0.1",
        "DMLC_PS_ROOT_PORT": "1234"}


def test_local_size_from_byteps_local_size_then_visible_devices():
    assert local_size({}) == 1
    assert local_size({"NVIDIA_VISIBLE_DEVICES": "0,1,2,3"}) == 4
    assert local_size({"NVIDIA_VISIBLE_DEVICES": "0,1", "BYTEPS_LOCAL_SIZE": "3"}) == 3
    for bad in ("x", "0"):
        with pytest.raises(UsageError, match="BYTEPS_LOCAL_SIZE"):
            local_size({"BYTEPS_LOCAL_SIZE": bad})


def test_a_worker_host_runs_one_process_per_device_with_byteps_ranks():
    env = dict(DIST, DMLC_ROLE="worker", DMLC_WORKER_ID="1", NVIDIA_VISIBLE_DEVICES="4,5")
    what, specs = plan_bpslaunch(env, ["python", "train.py"], python="py")
    assert what == "2 worker process(es)"
    assert [(s.role, s.rank, s.argv) for s in specs] == [
        (Role.WORKER, 2, ("python", "train.py")), (Role.WORKER, 3, ("python", "train.py"))]
    assert [s.env["BYTEPS_LOCAL_RANK"] for s in specs] == ["0", "1"]
    # local rank 0 joins the cluster as the host's worker (id 1); the others reduce through it
    assert all(s.env["BYTEPS_LOCAL_SIZE"] == "2" and "DMLC_NUM_WORKER" not in s.env
               for s in specs)
    assert [s.env["DMLC_WORKER_ID"] for s in specs] == ["1", "1"]


def test_scheduler_and_server_count_hosts_as_byteps_does():
    for role, argv in (("scheduler", ("py", "-m", "kvstore_byteps.scheduler")),
                       ("server", ("py", "-m", "kvstore_byteps.server"))):
        _, [spec] = plan_bpslaunch(dict(DIST, DMLC_ROLE=role, BYTEPS_LOCAL_SIZE="4"), [],
                                   python="py")
        assert spec.argv == argv and spec.env == {}


def test_one_worker_host_starts_its_own_scheduler_and_server():
    what, specs = plan_bpslaunch({"BYTEPS_LOCAL_SIZE": "2"}, ["python", "t.py"], python="py",
                                 port_of=lambda: 4321)
    assert [s.role for s in specs] == [Role.SCHEDULER, Role.SERVER, Role.WORKER, Role.WORKER]
    assert {s.env["DMLC_PS_ROOT_PORT"] for s in specs} == {"4321"}
    assert all(s.env["DMLC_NUM_WORKER"] == "1" for s in specs)      # one host
    assert [s.env["BYTEPS_LOCAL_RANK"] for s in specs[2:]] == ["0", "1"]
    assert "scheduler and a server on this machine" in what
    # the other roles have nothing to do then, as with BytePS
    assert plan_bpslaunch({"DMLC_ROLE": "server"}, [])[1] == []
    # unless the job is forced to be distributed
    forced = dict(DIST, DMLC_NUM_WORKER="1", BYTEPS_FORCE_DISTRIBUTED="1", DMLC_ROLE="server")
    assert len(plan_bpslaunch(forced, [])[1]) == 1


def test_bad_environments_are_named(capsys):
    with pytest.raises(UsageError, match="DMLC_ROLE"):
        plan_bpslaunch(dict(DIST, DMLC_ROLE="boss"), ["x"])
    with pytest.raises(UsageError, match="needs the command"):
        plan_bpslaunch(dict(DIST, DMLC_ROLE="worker"), [])
    with pytest.raises(UsageError, match="DMLC_NUM_WORKER"):
        plan_bpslaunch({"DMLC_ROLE": "worker", "DMLC_NUM_WORKER": "two"}, ["x"])
    assert main(["x"], dict(DIST, DMLC_ROLE="boss")) == 2
    assert "DMLC_ROLE must be" in capsys.readouterr().err


def test_tensor_names_become_the_same_keys_everywhere():
    assert key_of("gradient_0") == key_of("gradient_0")
    keys = {key_of("gradient_%d" % i) for i in range(2000)}
    assert len(keys) == 2000 and all(0 <= k < 2 ** 30 for k in keys)


def test_horovod_reductions_a_server_cannot_sum_are_refused(monkeypatch):
    monkeypatch.setattr(hvd, "size", lambda: 4)
    assert hvd._scales(None, None, 1.0, 1.0) == (1.0, 0.25)          # Average by default
    assert hvd._scales(False, None, 2.0, 0.5) == (2.0, 0.5)          # Sum
    assert hvd._scales(None, hvd.Average, 1.0, 2.0) == (1.0, 0.5)
    for op in (hvd.Min, hvd.Max, hvd.Product, hvd.Adasum):
        with pytest.raises(ValueError, match="not served by a parameter server"):
            hvd._scales(None, op, 1.0, 1.0)
    with pytest.raises(ValueError, match="either op or average"):
        hvd._scales(True, hvd.Sum, 1.0, 1.0)


def test_grace_is_our_one_option_before_the_command():
    from kvstore_byteps.launcher.bpslaunch import DEFAULT_GRACE_S, split_options
    assert split_options(["python", "t.py", "--grace", "1"]) == (
        DEFAULT_GRACE_S, ["python", "t.py", "--grace", "1"])       # the command's own
    assert split_options(["--grace", "2.5", "python", "t.py"]) == (2.5, ["python", "t.py"])
    assert split_options(["--grace", "0", "--", "--odd"]) == (0.0, ["--odd"])
    for bad in (["--grace"], ["--grace", "x"], ["--grace", "-1"], ["--grace", "nan"]):
        with pytest.raises(UsageError, match="--grace takes a number of seconds"):
            split_options(bad)
