"""Slurm and MPI as process starters, without either (pure parts): ranks to roles, Slurm's
compressed counts, the allocation's size check, the mpirun command line, the command-line rules."""
import pytest

from kvstore_byteps.config import Role
from kvstore_byteps.launcher import cli, mpi, node, slurm
from kvstore_byteps.launcher.plan import LaunchError
from kvstore_byteps.launcher.rankrole import EngineRank, engine_rank, expand_counts, node_role


def test_slurm_counts_expand():
    assert expand_counts("2(x3),1") == [2, 2, 2, 1]
    assert expand_counts("5") == [5]
    with pytest.raises(LaunchError, match="cannot read Slurm's per-node count 'x'"):
        expand_counts("x")


@pytest.mark.parametrize("environ, expected", [
    ({"OMPI_COMM_WORLD_RANK": "3", "OMPI_COMM_WORLD_SIZE": "6",
      "OMPI_COMM_WORLD_LOCAL_RANK": "1", "OMPI_COMM_WORLD_LOCAL_SIZE": "3",
      "SLURM_PROCID": "0", "SLURM_NTASKS": "1"},          # mpirun inside an allocation: MPI's
     EngineRank("Open MPI", 3, 6, 1, 3)),
    ({"PMI_RANK": "2", "PMI_SIZE": "4"}, EngineRank("MPICH", 2, 4)),
    ({"SLURM_PROCID": "4", "SLURM_NTASKS": "6", "SLURM_LOCALID": "1", "SLURM_NODEID": "1",
      "SLURM_STEP_TASKS_PER_NODE": "3(x2)"}, EngineRank("Slurm", 4, 6, 1, 3)),
])
def test_engine_rank_reads_each_engine(environ, expected):
    assert engine_rank(environ) == expected


def test_engine_rank_refuses_what_it_cannot_use():
    with pytest.raises(LaunchError, match="no rank in the environment.*OMPI_COMM_WORLD_RANK"):
        engine_rank({})
    with pytest.raises(LaunchError, match="srun -m cyclic places ranks out of order"):
        engine_rank({"SLURM_PROCID": "0", "SLURM_NTASKS": "2", "SLURM_DISTRIBUTION": "cyclic"})
    with pytest.raises(LaunchError, match="PMI_SIZE='x' is not a number"):
        engine_rank({"PMI_RANK": "0", "PMI_SIZE": "x"})


def test_ranks_are_scheduler_then_servers_then_workers():
    roles = [node_role(EngineRank("Slurm", r, 6), 2) for r in range(6)]
    assert [(p.role, p.rank) for p in roles] == [
        (Role.SCHEDULER, None), (Role.SERVER, 0), (Role.SERVER, 1), (Role.WORKER, 0),
        (Role.WORKER, 1), (Role.WORKER, 2)]
    assert {p.num_workers for p in roles} == {3}
    assert [p.label for p in roles[:4]] == ["scheduler", "server 0", "server 1", "worker 0"]


def test_local_ranks_count_the_workers_on_each_host():
    # 8 ranks, 4 per host, 2 servers: host 0 holds the scheduler, 2 servers and worker 0;
    # host 1 workers 1-4.
    places = [node_role(EngineRank("Open MPI", r, 8, r % 4, 4), 2) for r in range(3, 8)]
    assert [(p.rank, p.local_rank, p.local_size) for p in places] == [
        (0, 0, 1), (1, 0, 4), (2, 1, 4), (3, 2, 4), (4, 3, 4)]


def test_too_few_processes_say_how_many_are_needed():
    with pytest.raises(LaunchError, match=r"Slurm started 3 processes; 1 scheduler \+ 2 servers "
                                          r"\+ at least 1 worker need at least 4"):
        node_role(EngineRank("Slurm", 0, 3), 2)
    with pytest.raises(LaunchError, match=r"started 5 processes; 1 scheduler \+ 2 servers \+ 4 "
                                          r"workers need 7"):
        node_role(EngineRank("Open MPI", 0, 5), 2, 4)


def test_an_allocation_too_small_is_refused_in_one_line():
    found = slurm.Allocation("42", ("a", "b"), (2, 1))
    slurm.check_size(found, 1, 1)
    with pytest.raises(LaunchError) as info:
        slurm.check_size(found, 2, 2)
    assert str(info.value) == ("Slurm job 42 has 3 tasks; 1 scheduler + 2 servers + 2 workers "
                               "need 5 (salloc -n 5, or #SBATCH --ntasks=5)")
    hosts = slurm.hosts_of(found, {"a": "10.0.0.1"})
    assert [(h.address, h.slots) for h in hosts] == [("10.0.0.1", 2), ("b", 1)]


def test_outside_an_allocation_the_slurm_launcher_says_how_to_get_one():
    with pytest.raises(LaunchError, match="runs inside a Slurm allocation.*salloc"):
        slurm.allocation({})


def test_inside_an_allocation_the_workers_are_the_tasks_left_after_the_servers(capsys):
    environ = {"SLURM_JOB_ID": "42", "SLURM_TASKS_PER_NODE": "3(x2),1"}
    args = cli.parse_args(["--launcher", "slurm", "-s", "2", "python", "t.py"], environ=environ)
    assert (args.num_servers, args.num_workers) == (2, 4)
    for argv, environ, says in [
            (["-s", "2"], {}, "error: the following arguments are required: -n/--num-workers"),
            (["--launcher", "slurm"], environ, "error: the following arguments are required"),
            (["--launcher", "slurm", "-s", "2"], {"SLURM_TASKS_PER_NODE": "7"},
             "error: -n/--num-workers is required outside a Slurm allocation"),
            (["--launcher", "slurm", "-s", "6"], environ, "error: Slurm job 42 has 7 tasks; 1 "
             "scheduler + 6 servers leave none for a worker (salloc -n 8 or more, or give -n)")]:
        with pytest.raises(SystemExit) as info:
            cli.parse_args(argv + ["python", "t.py"], environ=environ)
        assert info.value.code == 2
        assert says in capsys.readouterr().err


def test_every_task_of_a_step_derives_the_same_port():
    environ = {"SLURM_JOB_ID": "1234", "SLURM_STEP_ID": "2"}
    port = slurm.job_port(environ)
    assert port == slurm.job_port(dict(environ))
    assert slurm.JOB_PORT_BASE <= port < slurm.JOB_PORT_BASE + slurm.JOB_PORT_SPAN
    assert slurm.job_port({"SLURM_JOB_ID": "1234", "SLURM_STEP_ID": "3"}) != port


@pytest.mark.parametrize("text, flavor", [
    ("mpirun (Open MPI) 4.1.4\n\nReport bugs to http://www.open-mpi.org/", mpi.Flavor.OPEN_MPI),
    ("HYDRA build details:\n    Version: 4.0.2", mpi.Flavor.MPICH),
    ("Intel(R) MPI Library", None),
])
def test_mpi_flavors_are_told_apart(text, flavor):
    assert mpi.flavor_of(text) is flavor


def test_mpirun_command_lines():
    node_argv = mpi.node_command("/py", 2, 3, "h1", 9000, ["python", "train.py"], "127.0.0.1",
                                 ["--server", "mxnet"])
    assert node_argv == ["/py", "-m", "kvstore_byteps.launcher.node", "-s", "2", "-n", "3",
                         "--root-uri", "h1", "--port", "9000", "--python", "/py",
                         "--node-host", "127.0.0.1", "--server", "mxnet", "--",
                         "python", "train.py"]
    openmpi = mpi.mpirun_argv("mpirun", mpi.Flavor.OPEN_MPI, 6, ["x"], ["A", "B"], "hosts",
                              ["--tag-output"], as_root=True)
    assert openmpi == ["mpirun", "-np", "6", "--allow-run-as-root", "--hostfile", "hosts",
                       "-x", "A", "-x", "B", "--tag-output", "x"]
    assert mpi.mpirun_argv("mpirun", mpi.Flavor.OPEN_MPI, 4, ["x"], [])[3:5] == \
        ["--host", "localhost:4"]
    assert mpi.mpirun_argv("mpiexec", mpi.Flavor.MPICH, 4, ["x"], ["A", "B"], "hosts") == \
        ["mpiexec", "-np", "4", "-f", "hosts", "-genvlist", "A,B", "x"]


def test_values_never_travel_on_the_mpirun_command_line():
    names = mpi.exported_names({"PATH": "/bin", "SECRET": "s"}, {"BYTEPS_AUTH_KEY": "k"})
    assert names == ["BYTEPS_AUTH_KEY", "PATH"]


def test_without_an_mpi_starter_the_launcher_says_so(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(LaunchError) as info:
        mpi.find_starter(None)
    assert str(info.value).startswith("neither mpirun nor mpiexec was found on PATH: "
                                      "--launcher mpi needs an MPI's starter (Debian: ")
    with pytest.raises(LaunchError, match="^mympirun not found on PATH: --launcher mpi needs"):
        mpi.find_starter("mympirun")


@pytest.mark.parametrize("argv, says", [
    (["--launcher", "local", "--srun-args", "-p x"], "--srun-args is for --launcher slurm"),
    (["--launcher", "slurm", "--mpirun-args=-v"], "--mpirun-args is for --launcher mpi"),
    (["--launcher", "mpi", "--image", "x"], "--image is for --launcher kubernetes"),
    (["--launcher", "ssh", "-H", "h", "--gpus", "1"], "--gpus is for --launcher kubernetes"),
    (["--launcher", "mpi", "--local-groups"], "--local-groups is not for --launcher mpi"),
    (["--launcher", "kubernetes"], "--launcher kubernetes needs --image IMAGE"),
    (["--launcher", "kubernetes", "--image", "x", "--name", "Bad_Name"],
     "error: --name 'Bad_Name': expected at most 40 lower-case letters"),
])
def test_engine_options_belong_to_their_launcher(argv, says, capsys):
    with pytest.raises(SystemExit) as info:
        cli.parse_args(["-n", "1"] + argv + ["python", "t.py"], environ={})
    assert info.value.code == 2
    assert says in capsys.readouterr().err


def test_a_node_sets_what_the_launcher_would_set():
    parser = node.build_parser()
    args = parser.parse_args(["-s", "2", "--env", "A=1", "--env-worker", "W=2",
                              "--env-server", "S=3", "python", "train.py"])
    worker = node_role(EngineRank("Open MPI", 4, 6, 1, 3), 2)
    env = node.node_environment(args, worker, "h0", 9000, "h1", {})
    assert env["DMLC_ROLE"] == "worker" and env["DMLC_WORKER_ID"] == "1"
    assert (env["DMLC_NUM_WORKER"], env["DMLC_NUM_SERVER"]) == ("3", "2")
    assert (env["DMLC_PS_ROOT_URI"], env["DMLC_PS_ROOT_PORT"], env["DMLC_NODE_HOST"]) == \
        ("h0", "9000", "h1")
    assert (env["BYTEPS_LOCAL_RANK"], env["BYTEPS_LOCAL_SIZE"]) == ("1", "3")
    assert env["A"] == "1" and env["W"] == "2" and "S" not in env
    server = node.node_environment(args, node_role(EngineRank("Open MPI", 1, 6), 2), "h0",
                                   9000, None, {})
    assert server["DMLC_ROLE"] == "server" and server["S"] == "3" and "W" not in server
    assert "DMLC_NODE_HOST" not in server
    assert node.node_argv(args, worker) == ["python", "train.py"]
    assert node.node_argv(args, node_role(EngineRank("x", 0, 6), 2))[1:] == \
        ["-m", "kvstore_byteps.scheduler"]


def test_a_node_without_a_scheduler_address_says_what_to_pass(capsys):
    code = node.main(["-s", "1", "true"], environ={"PMI_RANK": "0", "PMI_SIZE": "3"})
    assert code == 2
    assert capsys.readouterr().err == ("[kvstore-byteps-node] MPICH gives no scheduler address: "
                                       "pass --root-uri HOST (the host that runs rank 0) and "
                                       "--port PORT\n")


def test_only_rank_zero_reports_a_shared_problem(capsys):
    assert node.main(["-s", "2", "true"], environ={"PMI_RANK": "1", "PMI_SIZE": "3"}) == 2
    assert capsys.readouterr().err == ""

