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
    assert what == "worker: worker host 1 of 2: 2 processes, ranks 2-3 of 4"
    assert [(s.role, s.rank, s.argv) for s in specs] == [
        (Role.WORKER, 2, ("python", "train.py")), (Role.WORKER, 3, ("python", "train.py"))]
    assert [s.env["BYTEPS_LOCAL_RANK"] for s in specs] == ["0", "1"]
    # local rank 0 joins the cluster as the host's worker (id 1); the others reduce through it
    assert all(s.env["BYTEPS_LOCAL_SIZE"] == "2" and "DMLC_NUM_WORKER" not in s.env
               for s in specs)
    assert [s.env["DMLC_WORKER_ID"] for s in specs] == ["1", "1"]
    # a crash names the rank users know (the label) and the host's worker rank the library
    # names in its own messages (the detail)
    assert [s.detail for s in specs] == ["worker host 1, local rank 0",
                                         "worker host 1, local rank 1"]


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
    assert what == ("worker (DMLC_ROLE unset): worker host 0 of 1: 2 processes, ranks 0-1 "
                    "of 2, with a scheduler and a server on this machine")
    # the other roles have nothing to do then, as with BytePS
    assert plan_bpslaunch({"DMLC_ROLE": "server"}, [])[1] == []
    # unless the job is forced to be distributed
    forced = dict(DIST, DMLC_NUM_WORKER="1", BYTEPS_FORCE_DISTRIBUTED="1", DMLC_ROLE="server")
    assert len(plan_bpslaunch(forced, [])[1]) == 1


@pytest.mark.parametrize("value, forced", [("1", True), ("true", True), ("YES", True),
                                           ("on", True), ("0", False), ("False", False),
                                           ("", False)])
def test_force_distributed_takes_the_spellings_of_every_flag(value, forced):
    env = dict(DIST, DMLC_NUM_WORKER="1", BYTEPS_FORCE_DISTRIBUTED=value, DMLC_ROLE="server")
    what, specs = plan_bpslaunch(env, [])
    assert (len(specs) == 1) is forced, what
    with pytest.raises(UsageError, match="BYTEPS_FORCE_DISTRIBUTED='maybe'"):
        plan_bpslaunch(dict(env, BYTEPS_FORCE_DISTRIBUTED="maybe"), [])


def test_the_start_up_line_says_what_runs_whatever_the_role(capsys):
    roles = {"scheduler": "scheduler: our scheduler, for 2 worker hosts",
             "server": "server: our server, for 2 worker hosts"}
    for role, says in roles.items():
        assert plan_bpslaunch(dict(DIST, DMLC_ROLE=role), [])[0] == says
    one = plan_bpslaunch({"DMLC_ROLE": "scheduler"}, [])[0]
    assert one.startswith("scheduler: nothing to do (one worker host"), one
    # DMLC_ROLE unset with several hosts: the error says it is unset, and no "?" is printed
    assert main(["x"], dict(DIST)) == 2
    err = capsys.readouterr().err
    assert "DMLC_ROLE must be scheduler, server or worker, got '' (it is unset" in err, err
    assert main([], {"DMLC_ROLE": "server"}) == 0
    assert capsys.readouterr().err == ("[bpslaunch] server: nothing to do (one worker host and "
                                       "no BYTEPS_FORCE_DISTRIBUTED: that host's bpslaunch "
                                       "starts a scheduler and a server)\n")


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
    monkeypatch.setattr(hvd.COLLECTIVE, "scale_size", lambda: 4)      # an average divides by it
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


def test_counts_are_read_as_config_reads_them():
    """bpslaunch reads its integers with config's reader: what a node would refuse, it refuses
    before starting any (a job of 0 hosts, a negative worker id)."""
    with pytest.raises(UsageError, match="DMLC_NUM_WORKER='0' is invalid"):
        plan_bpslaunch(dict(DIST, DMLC_ROLE="scheduler", DMLC_NUM_WORKER="0"), [])
    with pytest.raises(UsageError, match="DMLC_WORKER_ID='-1' is invalid"):
        plan_bpslaunch(dict(DIST, DMLC_ROLE="worker", DMLC_WORKER_ID="-1"), ["x"])
    with pytest.raises(UsageError, match="DMLC_NUM_WORKER is not set"):
        plan_bpslaunch({"DMLC_ROLE": "worker", "BYTEPS_FORCE_DISTRIBUTED": "1"}, ["x"])


@pytest.fixture
def own_defaults(monkeypatch):
    import kvstore_byteps.config.environment as environment
    monkeypatch.setattr(environment, "_process_defaults", {})
    for name in ("DMLC_WORKER_ID", "BYTEPS_KEY_HASH_FN", "BYTEPS_LOCAL_SIZE"):
        monkeypatch.delenv(name, raising=False)


def test_the_apis_choose_their_stores_settings_without_writing_the_environment(
        own_defaults, monkeypatch):
    """init() asks for BYTEPS_GLOBAL_RANK and the collective for djb2 placement: the store
    start() creates reads them from its Config, os.environ stays as the user set it."""
    import os
    import kvstore_byteps.mxnet as bps
    from kvstore_byteps.config import Config
    from mxnet_patch import collective

    class Store:
        rank, num_workers = 3, 4

    seen = []
    monkeypatch.setattr(collective.mx.kv, "create",
                        lambda name: seen.append(Config.from_env()) or Store())
    monkeypatch.setattr(collective, "COLLECTIVE", collective.Collective())
    monkeypatch.setattr(bps, "COLLECTIVE", collective.COLLECTIVE)
    monkeypatch.setenv("BYTEPS_GLOBAL_RANK", "3")
    bps.init()
    assert [(c.worker_id, c.key_hash_fn) for c in seen] == [(3, "djb2")]
    assert "DMLC_WORKER_ID" not in os.environ and "BYTEPS_KEY_HASH_FN" not in os.environ
    assert bps.rank() == 3
