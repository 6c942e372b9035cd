"""Where launch.py puts each worker on its host (pure): local ranks and sizes per host, and what
DMLC_NUM_WORKER counts (processes by default, hosts with --local-groups, as bpslaunch)."""
import pytest

from kvstore_byteps.config import Config, Env, Role
from kvstore_byteps.errors import ConfigError
from kvstore_byteps.launcher import cli, runs
from kvstore_byteps.launcher.plan import (LaunchError, lay_out_workers, local_hosts,
                                          parse_hostfile)

TWO_BY_TWO = parse_hostfile("host1 slots=2\nhost2 slots=2\n")


def planned(argv, hosts=None):
    """The workers' (label, host, env) that launch.py would start for ``argv``."""
    args = cli.parse_args(argv + ["python", "train.py"], environ={})
    specs = runs.plan(args, hosts or local_hosts(), 9000)
    return specs, [s for s in specs if s.role is Role.WORKER]


def local_places(workers):
    return [(w.host, w.env[Env.LOCAL_RANK], w.env[Env.LOCAL_SIZE]) for w in workers]


def test_local_n4_gives_local_ranks_0_to_3_of_4_and_keeps_mxnets_worker_count():
    specs, workers = planned(["-n", "4", "-s", "1"])
    assert local_places(workers) == [(0, "0", "4"), (0, "1", "4"), (0, "2", "4"), (0, "3", "4")]
    assert [w.env[Env.WORKER_ID] for w in workers] == ["0", "1", "2", "3"]
    assert {s.env[Env.NUM_WORKER] for s in specs} == {"4"}        # processes, as MXNet's
    assert {w.env[Env.LOCAL_GROUPS] for w in workers} == {"0"}
    config = Config.from_env(workers[2].env)             # what the worker's library reads
    assert (config.local_rank, config.local_size, config.local_groups) == (2, 4, False)
    assert not config.local_member                       # a worker of its own


def test_ssh_hostfile_with_two_slots_on_two_hosts_numbers_each_hosts_workers():
    argv = ["--launcher", "ssh", "-H", "hosts.txt", "-n", "4", "-s", "2"]
    specs, workers = planned(argv, TWO_BY_TWO)
    # as MXNet's launcher: servers on host1, host2, then workers round-robin
    assert [(w.label, w.host) for w in workers] == [("worker 0", 0), ("worker 1", 1),
                                                    ("worker 2", 0), ("worker 3", 1)]
    assert local_places(workers) == [(0, "0", "2"), (1, "0", "2"), (0, "1", "2"), (1, "1", "2")]
    assert {s.env[Env.NUM_WORKER] for s in specs} == {"4"}


def test_local_groups_lay_the_job_out_as_bpslaunch_does():
    argv = ["--launcher", "ssh", "-H", "hosts.txt", "-n", "4", "-s", "2", "--local-groups"]
    specs, workers = planned(argv, TWO_BY_TWO)
    assert {s.env[Env.NUM_WORKER] for s in specs} == {"2"}        # hosts, as BytePS's
    # rank = worker id x local size + local rank, the output prefix and size() of the APIs
    assert [(w.label, w.host, w.env[Env.WORKER_ID], w.env[Env.LOCAL_RANK]) for w in workers] == [
        ("worker 0", 0, "0", "0"), ("worker 1", 0, "0", "1"),
        ("worker 2", 1, "1", "0"), ("worker 3", 1, "1", "1")]
    assert [w.detail for w in workers][1] == "worker host 0, local rank 1"
    assert {w.env[Env.LOCAL_GROUPS] for w in workers} == {"1"}
    local = planned(["-n", "4", "-s", "1", "--local-groups"])[1]
    assert [w.env[Env.WORKER_ID] for w in local] == ["0"] * 4
    assert {w.env[Env.NUM_WORKER] for w in local} == {"1"}


def test_local_groups_need_as_many_workers_on_every_host():
    with pytest.raises(LaunchError, match="host 0: 2, host 1: 1"):
        lay_out_workers([0, 1, 0], local_groups=True)
    assert lay_out_workers([0, 1, 0])[0] == 3           # per process, any spread will do


def test_a_host_per_node_gives_every_worker_local_size_1():
    assert [(p.rank, p.local_rank, p.local_size) for p in lay_out_workers([3, 4])[1]] == [
        (0, 0, 1), (1, 0, 1)]


@pytest.mark.parametrize("name", [Env.LOCAL_RANK, Env.LOCAL_SIZE, Env.LOCAL_GROUPS])
def test_the_layout_variables_are_the_launchers(name, capsys):
    with pytest.raises(SystemExit):
        cli.parse_args(["-n", "2", "--env", "%s=1" % name, "python", "t.py"], environ={})
    assert "%s is set by the launcher" % name in capsys.readouterr().err


def test_a_local_member_makes_no_worker_of_the_cluster():
    member = {Env.ROLE: "worker", Env.LOCAL_RANK: "1", Env.LOCAL_SIZE: "2"}
    with pytest.raises(ConfigError, match=r"\(launch.py\) without --local-groups"):
        Config.from_env(member)                  # e.g. a script's own dist_byteps store
    assert Config.from_env(member, in_local_group=True).local_member    # the APIs' group
    assert not Config.from_env(dict(member, BYTEPS_LOCAL_GROUPS="0")).local_member
    assert Config.from_env(dict(member, DMLC_ROLE="server")).role is Role.SERVER  # a worker's
    with pytest.raises(ConfigError, match=r"BYTEPS_LOCAL_RANK=2 is outside \[0, "):
        Config.from_env(dict(member, BYTEPS_LOCAL_RANK="2"), in_local_group=True)
