"""``--launcher kubernetes``: the rendered objects are valid Kubernetes objects (checked against the
API's schemas by kubernetes-validate, which bundles them) and give every node what it needs (its
role, the cluster's size, the scheduler's address, its rank); bad options are refused; the
state of a running job is read right. Creating and following a job with kubectl is tested
against a fake kubectl in tests/cluster (it starts processes)."""
import dataclasses
import json
import re

import pytest

from kvstore_byteps.config import Config, Env, Role, ServerKind, VanType
from kvstore_byteps.launcher import cli, kubectl, kubernetes
from kvstore_byteps.launcher.plan import LaunchError
from tests.support import kubernetes_fakes as fakes

IMAGE = "registry.example.com/kvstore-byteps:0.1"
WORKER_CMD = ["python", "examples/train_digits.py", "--epochs", "2"]
#: the oldest and the newest API versions kubernetes-validate bundles (Indexed Jobs: GA in 1.24)
API_VERSIONS = ("1.25", "1.37")
POD_IP = "10.244.1.7"

#: W / S / option combinations, each a command line after --launcher kubernetes --image ...
CONFIGS = {
    "1x1": ["-n", "1", "-s", "1"],
    "4x2-resources-env": ["-n", "4", "-s", "2", "--cpu", "3500m", "--memory", "16Gi",
                          "--gpus", "2", "--node-selector", "kubernetes.io/arch=amd64",
                          "--node-selector", "example.com/pool=gpu-a100",
                          "--env", "OMP_NUM_THREADS=4", "--env-server",
                          "BYTEPS_SERVER_ENGINE_THREAD=8", "--env-worker",
                          "BYTEPS_PARTITION_BYTES=1024000"],
    # servers on CPU nodes, workers on GPU nodes: role-prefixed options over plain ones
    "per-role-placement": ["-n", "4", "-s", "2", "--node-selector", "kubernetes.io/arch=amd64",
                           "--node-selector", "server:example.com/pool=cpu",
                           "--node-selector", "worker:example.com/pool=gpu-a100",
                           "--cpu", "2", "--cpu", "server:8", "--memory", "server:64Gi",
                           "--memory", "worker:16Gi", "--gpus", "1"],
    "server-mxnet": ["-n", "2", "--server", "mxnet"],
    "server-knob-scheduler-mxnet": ["-n", "3", "-s", "1", "--server", "byteps-knob",
                                    "--scheduler", "mxnet"],
    "p3": ["-n", "2", "-s", "2", "--p3"],
    "namespace-port-timeout": ["-n", "2", "-s", "3", "--namespace", "training", "--port",
                               "9000", "--timeout", "600"],
    "local-groups-commands": ["-n", "2", "--local-groups", "--scheduler-cmd",
                              "python -m kvstore_byteps.scheduler", "--server-cmd",
                              "python -m kvstore_byteps.server --verbose"],
}


def parse(options, name="digits", command=WORKER_CMD):
    argv = ["--launcher", "kubernetes", "--image", IMAGE] + (["--name", name] if name else [])
    return cli.parse_args(argv + list(options) + list(command), environ={})


def rendered(options, **kwargs):
    return kubernetes.render(kubernetes.job_from_args(parse(options, **kwargs)))


def by_kind(objects):
    services = [o for o in objects if o["kind"] == "Service"]
    jobs = {o["metadata"]["labels"][kubernetes.LABEL_ROLE]: o
            for o in objects if o["kind"] == "Job"}
    assert len(services) == 1 and sorted(jobs) == ["scheduler", "server", "worker"]
    return services[0], jobs


container = fakes.the_container
expand = fakes.expand


def node_env(job, pod_ip=POD_IP, index=None):
    return fakes.pod_env(job, pod_ip, index)


# ---------------------------------------------------------------------- API schemas
@pytest.fixture(scope="module")
def validator():
    return pytest.importorskip("kubernetes_validate")


@pytest.mark.parametrize("version", API_VERSIONS)
@pytest.mark.parametrize("config", sorted(CONFIGS))
def test_every_object_is_valid_against_the_kubernetes_api_schema(validator, config, version):
    for obj in rendered(CONFIGS[config]):
        # strict: no property the API does not know (a typo would be dropped by a cluster)
        assert validator.validate(obj, version, strict=True) == version, obj["kind"]


def test_the_fake_cluster_answers_have_the_apis_shape(validator):
    """The state the tests below (and the fake kubectl) feed the launcher is shaped as a
    cluster's: Jobs and Pods with status, valid against the schema."""
    answers = fakes.failed_job("digits", 2, 2, 1, 3)["items"] + [
        fakes.pod("digits", "worker", 0, "Pending", waiting="ImagePullBackOff")]
    for obj in answers:
        validator.validate(obj, API_VERSIONS[-1], strict=True)


# ------------------------------------------------------------------- what nodes need
@pytest.mark.parametrize("config", sorted(CONFIGS))
def test_each_node_gets_its_role_the_cluster_size_and_the_schedulers_address(config):
    args = parse(CONFIGS[config])
    service, jobs = by_kind(rendered(CONFIGS[config]))
    port = args.port or kubernetes.DEFAULT_PORT
    sched = Config.from_env(node_env(jobs["scheduler"]))
    assert sched.role is Role.SCHEDULER
    # the scheduler binds DMLC_PS_ROOT_URI: its own pod IP, not the Service's name
    assert (sched.root_uri, sched.node_host, sched.root_port) == (POD_IP, POD_IP, port)
    for role, count in ((Role.SERVER, args.num_servers), (Role.WORKER, args.num_workers)):
        for index in range(count):
            env = node_env(jobs[role.name.lower()], "10.244.2.%d" % index, index)
            node = Config.from_env(env)
            assert node.role is role
            assert (node.num_workers, node.num_servers) == (args.num_workers, args.num_servers)
            assert node.root_uri == service["metadata"]["name"] == "digits-scheduler"
            assert (node.root_port, node.node_host) == (port, "10.244.2.%d" % index)
            if role is Role.WORKER:
                assert node.worker_id == index    # the rank: the pod's completion index
                assert (env[Env.LOCAL_RANK], env[Env.LOCAL_SIZE]) == ("0", "1")
                assert env[Env.LOCAL_GROUPS] == ("1" if args.local_groups else "0")
            assert env["PYTHONUNBUFFERED"] == "1"


@pytest.mark.parametrize("config", sorted(CONFIGS))
def test_the_service_finds_the_scheduler_pod_and_only_it_on_its_port(config):
    service, jobs = by_kind(rendered(CONFIGS[config]))
    spec = service["spec"]
    assert spec["clusterIP"] == "None" and spec["publishNotReadyAddresses"] is True
    labels = {role: job["spec"]["template"]["metadata"]["labels"] for role, job in jobs.items()}
    assert spec["selector"] == labels["scheduler"]
    assert all(not spec["selector"].items() <= labels[r].items() for r in ("server", "worker"))
    (port,) = spec["ports"]
    (container_port,) = container(jobs["scheduler"])["ports"]
    root_port = int(node_env(jobs["worker"], index=0)[Env.ROOT_PORT])
    assert port["port"] == port["targetPort"] == container_port["containerPort"] == root_port


@pytest.mark.parametrize("config", sorted(CONFIGS))
def test_jobs_run_one_node_per_pod_never_restarted(config):
    args = parse(CONFIGS[config])
    _, jobs = by_kind(rendered(CONFIGS[config]))
    for role, pods in (("scheduler", 1), ("server", args.num_servers),
                       ("worker", args.num_workers)):
        spec = jobs[role]["spec"]
        assert spec["completions"] == spec["parallelism"] == pods
        assert spec.get("completionMode", "NonIndexed") == ("NonIndexed" if role == "scheduler"
                                                             else "Indexed")
        assert spec["backoffLimit"] == 0 and spec["template"]["spec"]["restartPolicy"] == "Never"
        assert jobs[role]["metadata"]["name"] == "digits-" + role
        assert container(jobs[role])["name"] == role
        assert spec["template"]["metadata"]["labels"] == {
            "app.kubernetes.io/name": "kvstore-byteps", "kvstore-byteps/job": "digits",
            "kvstore-byteps/role": role}


def test_commands_images_resources_node_selectors_and_variables():
    service, jobs = by_kind(rendered(CONFIGS["4x2-resources-env"]))
    worker, server, sched = (container(jobs[r]) for r in ("worker", "server", "scheduler"))
    assert worker["command"] == WORKER_CMD
    assert server["command"] == ["python", "-m", "kvstore_byteps.server"]
    assert sched["command"] == ["python", "-m", "kvstore_byteps.scheduler"]
    assert {c["image"] for c in (worker, server, sched)} == {IMAGE}
    assert {c["imagePullPolicy"] for c in (worker, server, sched)} == {"IfNotPresent"}
    assert worker["resources"] == {"requests": {"cpu": "3500m", "memory": "16Gi"},
                                   "limits": {"cpu": "3500m", "memory": "16Gi",
                                              "nvidia.com/gpu": "2"}}
    assert server["resources"] == {"requests": {"cpu": "3500m", "memory": "16Gi"},
                                   "limits": {"cpu": "3500m", "memory": "16Gi"}}
    for job in jobs.values():
        assert job["spec"]["template"]["spec"]["nodeSelector"] == {
            "kubernetes.io/arch": "amd64", "example.com/pool": "gpu-a100"}
    worker_env, server_env = node_env(jobs["worker"], index=0), node_env(jobs["server"], index=0)
    assert worker_env["OMP_NUM_THREADS"] == server_env["OMP_NUM_THREADS"] == "4"
    assert worker_env["BYTEPS_PARTITION_BYTES"] == "1024000"
    assert "BYTEPS_PARTITION_BYTES" not in server_env
    assert server_env["BYTEPS_SERVER_ENGINE_THREAD"] == "8"
    assert "BYTEPS_SERVER_ENGINE_THREAD" not in worker_env


def placement(job):
    """A rendered Job's pods' nodeSelector and their container's resources (None: unset)."""
    pod = job["spec"]["template"]["spec"]
    return pod.get("nodeSelector"), fakes.the_container(job).get("resources")


def test_each_role_gets_its_own_node_selector_and_resources():
    """Servers on CPU nodes with memory, workers on GPU nodes with GPUs: a role-prefixed option
    goes on that role's pod template only, over the plain one for both; the scheduler's pod
    goes with the servers' (a CPU process) and gets no resources."""
    _, jobs = by_kind(rendered(CONFIGS["per-role-placement"]))
    assert placement(jobs["server"]) == (
        {"kubernetes.io/arch": "amd64", "example.com/pool": "cpu"},
        {"requests": {"cpu": "8", "memory": "64Gi"}, "limits": {"cpu": "8", "memory": "64Gi"}})
    assert placement(jobs["worker"]) == (
        {"kubernetes.io/arch": "amd64", "example.com/pool": "gpu-a100"},
        {"requests": {"cpu": "2", "memory": "16Gi"},
         "limits": {"cpu": "2", "memory": "16Gi", "nvidia.com/gpu": "1"}})
    assert placement(jobs["scheduler"]) == (
        {"kubernetes.io/arch": "amd64", "example.com/pool": "cpu"}, None)


def test_one_roles_options_leave_the_other_roles_pods_alone():
    _, jobs = by_kind(rendered(["-n", "2", "--node-selector", "worker:example.com/pool=gpu",
                                "--cpu", "worker:4", "--memory", "worker:16Gi"]))
    assert placement(jobs["worker"]) == (
        {"example.com/pool": "gpu"},
        {"requests": {"cpu": "4", "memory": "16Gi"}, "limits": {"cpu": "4", "memory": "16Gi"}})
    assert placement(jobs["server"]) == placement(jobs["scheduler"]) == (None, None)
    _, jobs = by_kind(rendered(["-n", "2", "--node-selector", "server:example.com/pool=cpu",
                                "--memory", "server:32Gi"]))
    assert placement(jobs["worker"]) == (None, None)
    assert placement(jobs["scheduler"]) == ({"example.com/pool": "cpu"}, None)
    assert placement(jobs["server"]) == ({"example.com/pool": "cpu"},
                                         {"requests": {"memory": "32Gi"},
                                          "limits": {"memory": "32Gi"}})


def test_a_role_prefix_wins_over_the_plain_value_wherever_it_stands():
    """A role's value replaces the plain one for that role whatever the order; among options of
    the same kind the last one wins, as for any repeated option (--cpu 2 --cpu 4: 4)."""
    placements = kubernetes.parse_placements(
        ["server:pool=cpu", "pool=any", "zone=a", "zone=b"],
        ["server:8", "2", "4"], ["worker:16Gi", "worker:32Gi"])
    servers, workers = placements[Role.SERVER], placements[Role.WORKER]
    assert (dict(servers.node_selector), servers.cpu, servers.memory) == (
        {"pool": "cpu", "zone": "b"}, "8", None)
    assert (dict(workers.node_selector), workers.cpu, workers.memory) == (
        {"pool": "any", "zone": "b"}, "4", "32Gi")
    # a ':' in the value, not before the '=', is not a role: the label value is refused as such
    with pytest.raises(LaunchError, match="expected \\[server:\\|worker:\\]LABEL=VALUE"):
        kubernetes.parse_placements(["pool=a:b"])


def test_server_and_scheduler_programs_and_p3():
    _, jobs = by_kind(rendered(CONFIGS["server-mxnet"]))
    assert container(jobs["server"])["command"] == ["python", "-c", "import mxnet"]
    assert Config.from_env(node_env(jobs["server"], index=0)).kvstore_server is ServerKind.MXNET
    _, jobs = by_kind(rendered(CONFIGS["server-knob-scheduler-mxnet"]))
    assert container(jobs["scheduler"])["command"] == ["python", "-c", "import mxnet"]
    assert Config.from_env(node_env(jobs["server"], index=0)).kvstore_server is ServerKind.BYTEPS
    _, jobs = by_kind(rendered(CONFIGS["p3"]))
    for role, job in jobs.items():
        assert Config.from_env(node_env(job, index=0)).van_type is VanType.P3, role
    _, jobs = by_kind(rendered(CONFIGS["local-groups-commands"]))
    assert container(jobs["server"])["command"] == ["python", "-m", "kvstore_byteps.server",
                                                    "--verbose"]


def test_namespace_and_timeout_reach_every_object():
    service, jobs = by_kind(rendered(CONFIGS["namespace-port-timeout"]))
    assert {o["metadata"]["namespace"] for o in [service, *jobs.values()]} == {"training"}
    # the short name resolves inside the namespace, whatever the cluster's domain
    assert node_env(jobs["worker"], index=0)[Env.ROOT_URI] == "digits-scheduler"
    assert {j["spec"]["activeDeadlineSeconds"] for j in jobs.values()} == {
        600 + kubernetes.CLUSTER_DEADLINE_MARGIN_S}
    _, jobs = by_kind(rendered(CONFIGS["1x1"]))
    assert all("namespace" not in o["metadata"] and "activeDeadlineSeconds" not in o["spec"]
               for o in jobs.values())


def test_dollar_signs_reach_the_node_as_written():
    """Kubernetes expands $(NAME) in commands and variables; the user's text must not change."""
    _, jobs = by_kind(rendered(["-n", "1", "--env", "GREETING=$(HOME) costs $$5"],
                               command=["python", "train.py", "--out", "$(HOME)/x"]))
    env = node_env(jobs["worker"], index=0)
    assert env["GREETING"] == "$(HOME) costs $$5"
    assert [expand(w, env) for w in container(jobs["worker"])["command"]] == [
        "python", "train.py", "--out", "$(HOME)/x"]


def test_the_default_name_is_random_and_valid():
    names = {kubernetes.job_from_args(parse(["-n", "1"], name=None)).name for _ in range(5)}
    assert len(names) > 1
    assert all(re.fullmatch(r"kvstore-byteps-[a-z0-9]{6}", n) for n in names)


# ----------------------------------------------------------------------- refusals
def usage_error(options, capsys, name="digits"):
    """The one error line of a command line refused as a usage error (exit status 2)."""
    with pytest.raises(SystemExit) as exit_:
        parse(options, name=name)
    assert exit_.value.code == 2
    lines = capsys.readouterr().err.splitlines()
    assert lines[-1].startswith("kvstore-byteps-launch: error: ")
    return lines[-1]


@pytest.mark.parametrize("name", ["Digits", "1digits", "digits-", "dig_its", "a.b", "x" * 41, ""])
def test_a_name_that_cannot_name_kubernetes_objects_is_a_usage_error(name, capsys):
    assert "error: --name %r: expected at most 40 lower-case letters" % name in usage_error(
        ["-n", "1", "--name", name], capsys, name=None)


def test_the_job_refuses_a_bad_name_itself():
    job = kubernetes.job_from_args(parse(["-n", "1"]))
    with pytest.raises(LaunchError, match="--name 'Bad_Name'"):
        dataclasses.replace(job, name="Bad_Name")


@pytest.mark.parametrize("option", ["gpu", "=a100", "pool=", "pool=a b", "-pool=x",
                                    "example.com/=x", "Example_.com/pool=x", "pool=" + "v" * 64])
def test_a_bad_node_selector_is_a_usage_error(option, capsys):
    if option == "pool=":      # an empty value is a valid label value
        assert kubernetes.parse_node_selector([option]) == {"pool": ""}
        return
    assert "error: --node-selector %r" % option in usage_error(
        ["-n", "1", "--node-selector=" + option], capsys)


@pytest.mark.parametrize("options, word", [(["--cpu", "four"], "--cpu"),
                                           (["--memory", "16GB"], "--memory"),
                                           (["--cpu", "server:four"], "--cpu"),
                                           (["--memory", "worker:16GB"], "--memory"),
                                           (["--memory", "worker:"], "--memory"),
                                           (["--namespace", "Training"], "--namespace")])
def test_bad_sizes_and_namespaces_are_usage_errors(options, word, capsys):
    assert "error: %s %r" % (word, options[1]) in usage_error(["-n", "1"] + options, capsys)


@pytest.mark.parametrize("option, text", [
    ("--node-selector", "gpu:pool=a100"), ("--node-selector", "scheduler:pool=cpu"),
    ("--node-selector", "Server:pool=cpu"), ("--node-selector", ":pool=cpu"),
    ("--cpu", "workers:4"), ("--memory", "ps:16Gi")])
def test_an_unknown_role_prefix_is_a_usage_error(option, text, capsys):
    role = text.partition(":")[0]
    assert usage_error(["-n", "1", option, text], capsys).endswith(
        "error: %s %r: unknown role %r; expected server: or worker: or no prefix (both)"
        % (option, text, role))


@pytest.mark.parametrize("text", ["server:pool", "worker:=x", "worker:pool=a b", "server:"])
def test_a_bad_label_after_a_role_prefix_is_a_usage_error(text, capsys):
    assert "error: --node-selector %r: expected [server:|worker:]LABEL=VALUE" % text in \
        usage_error(["-n", "1", "--node-selector", text], capsys)


@pytest.mark.parametrize("text", ["server:1", "worker:1"])
def test_gpus_take_no_role_prefix(text, capsys):
    assert usage_error(["-n", "1", "--gpus", text], capsys).endswith(
        "error: argument --gpus: %r: GPUs are for workers only; give a number, e.g. --gpus 1"
        % text)


def test_the_job_refuses_a_bad_quantity_itself():
    job = kubernetes.job_from_args(parse(["-n", "1"]))
    with pytest.raises(LaunchError, match="--memory '16GB' is not a Kubernetes quantity"):
        dataclasses.replace(job, workers=kubernetes.Placement(memory="16GB"))


def test_without_kubectl_the_launcher_says_so(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(LaunchError, match="kubectl not found on PATH"):
        kubernetes.run(parse(["-n", "1"]))


# ------------------------------------------------------------------------ --dry-run
def documents(text):
    """The objects of a to_yaml stream, read as a YAML reader would (JSON if PyYAML is missing)."""
    assert text.startswith("# ")
    try:
        import yaml
    except ImportError:
        return [json.loads(doc) for doc in text.split("\n---\n")[1:]]
    return [doc for doc in yaml.safe_load_all(text) if doc is not None]


def test_dry_run_prints_the_objects_as_yaml_documents(capsys):
    args = parse(["-n", "4", "-s", "2", "--dry-run"])
    assert kubernetes.run(args) == 0
    assert documents(capsys.readouterr().out) == kubernetes.render(kubernetes.job_from_args(args))


def test_dry_run_shows_each_roles_placement(capsys):
    args = parse(["-n", "2", "-s", "1", "--dry-run", "--node-selector", "server:pool=cpu",
                  "--node-selector", "worker:pool=gpu", "--cpu", "server:4",
                  "--memory", "worker:16Gi", "--gpus", "1"])
    assert kubernetes.run(args) == 0
    jobs = {o["metadata"]["name"]: o for o in documents(capsys.readouterr().out)
            if o["kind"] == "Job"}
    assert placement(jobs["digits-scheduler"]) == ({"pool": "cpu"}, None)
    assert placement(jobs["digits-server"]) == (
        {"pool": "cpu"}, {"requests": {"cpu": "4"}, "limits": {"cpu": "4"}})
    assert placement(jobs["digits-worker"]) == (
        {"pool": "gpu"}, {"requests": {"memory": "16Gi"},
                          "limits": {"memory": "16Gi", "nvidia.com/gpu": "1"}})


def test_dry_run_through_the_command_line(capsys):
    argv = ["--launcher", "kubernetes", "--image", IMAGE, "--name", "digits", "-n", "2",
            "--dry-run"] + WORKER_CMD
    assert cli.main(argv) == 0
    objects = documents(capsys.readouterr().out)
    assert [(o["kind"], o["metadata"]["name"]) for o in objects] == [
        ("Service", "digits-scheduler"), ("Job", "digits-scheduler"), ("Job", "digits-server"),
        ("Job", "digits-worker")]


# ------------------------------------------------------------ reading a job's state
def test_the_job_goes_on_while_nodes_run_or_start():
    assert kubectl.outcome(fakes.running_job("digits", 2, 2)) is None
    starting = fakes.listing(fakes.job("digits", "worker"),
                             fakes.pod("digits", "worker", 0, "Pending",
                                       waiting="ContainerCreating"))
    assert kubectl.outcome(starting) is None
    assert kubectl.outcome(fakes.listing()) is None


def test_complete_workers_end_the_job_with_status_0():
    assert kubectl.outcome(fakes.finished_job("digits", 2, 3)) == (0, "the workers finished")


def test_the_first_failed_node_fails_the_job_with_its_exit_code():
    code, what = kubectl.outcome(fakes.failed_job("digits", 2, 4, 2, 3))
    assert code == 3 and what.startswith("worker 2 (pod digits-worker-2-x7k2p) exited with code 3")
    early = fakes.pod("digits", "server", 1, "Failed", 137, "OOMKilled",
                      finished_at="2026-11-28T06:00:30Z")
    code, what = kubectl.outcome(fakes.listing(*fakes.failed_job(
        "digits", 2, 4, 2, 3)["items"], early))
    assert code == 137 and what.startswith("server 1 (pod digits-server-1-x7k2p) was killed by "
                                           "SIGKILL: OOMKilled")


def test_a_node_that_cannot_start_fails_the_job():
    stuck = fakes.pod("digits", "worker", 1, "Pending", waiting="ImagePullBackOff",
                      message="Back-off pulling image")
    code, what = kubectl.outcome(fakes.listing(*fakes.running_job("digits", 1, 1)["items"],
                                                  stuck))
    assert code == 1 and "worker 1" in what and "ImagePullBackOff: Back-off pulling image" in what


def test_a_failed_job_without_a_failed_pod_fails_the_job():
    listing = fakes.listing(fakes.job("digits", "server", ("Failed", "True", "DeadlineExceeded")))
    code, what = kubectl.outcome(listing)
    assert code == 1 and "Job digits-server failed: DeadlineExceeded" in what


def test_progress_names_what_the_launcher_waits_for():
    listing = fakes.listing(fakes.pod("digits", "scheduler"),
                            fakes.pod("digits", "worker", 0),
                            fakes.pod("digits", "worker", 1, "Pending",
                                      waiting="ContainerCreating"))
    states = kubectl.pod_states(listing)
    assert [s.label for s in states] == ["scheduler", "worker 0", "worker 1"]
    assert kubectl.describe_progress(states, 2, 3) == (
        "scheduler Running; servers 2 not created yet; workers 1 Running, "
        "1 Pending (ContainerCreating), 1 not created yet")


# ------------------------------------------------------------------ elastic workers
ELASTIC = ["-n", "4", "-s", "2", "--min-workers", "3", "--max-restarts", "2"]


@pytest.mark.parametrize("version", ("1.29", API_VERSIONS[-1]))   # backoffLimitPerIndex: 1.29+
def test_elastic_workers_restart_per_index_in_valid_objects(validator, version):
    service, jobs = by_kind(rendered(ELASTIC))
    for obj in [service, *jobs.values()]:
        assert validator.validate(obj, version, strict=True) == version, obj["kind"]
    spec = jobs["worker"]["spec"]
    assert (spec["backoffLimitPerIndex"], spec["maxFailedIndexes"]) == (2, 1)
    assert "backoffLimit" not in spec and spec["completionMode"] == "Indexed"
    ignore, fail = spec["podFailurePolicy"]["rules"]
    assert ignore == {"action": "Ignore",
                      "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]}
    codes = fail["onExitCodes"]["values"]
    assert fail["action"] == "FailJob" and fail["onExitCodes"]["containerName"] == "worker"
    assert 1 in codes and 3 in codes and 75 not in codes and 137 not in codes
    for role in ("scheduler", "server"):            # never elastic
        assert jobs[role]["spec"]["backoffLimit"] == 0
        assert "backoffLimitPerIndex" not in jobs[role]["spec"]
    for role in ("scheduler", "server", "worker"):
        assert node_env(jobs[role], index=0)["BYTEPS_MIN_WORKERS"] == "3"


def test_elastic_jobs_end_by_the_workers_job_not_by_a_lost_worker():
    lost = fakes.pod("digits", "worker", 2, "Failed", 137, finished_at="2026-11-28T06:00:30Z")
    # a lost worker (killed) does not end the job: Kubernetes restarts its index
    going = fakes.listing(*fakes.running_job("digits", 2, 4)["items"], lost)
    assert kubectl.outcome(going, elastic=True) is None
    assert kubectl.outcome(going)[0] == 137                      # (not elastic: it does)
    # the servers finished: the training is over, whatever restarted pod still starts
    over = fakes.listing(fakes.job("digits", "server", ("Complete", "True")), lost)
    assert kubectl.outcome(over, elastic=True) == (
        0, "the training is over (the servers finished); lost: worker 2")
    # every index ended, one failed: within the minimum
    within = fakes.listing(fakes.job("digits", "worker", ("Failed", "True", "FailedIndexes")),
                           lost)
    assert kubectl.outcome(within, elastic=True)[0] == 0
    # below the minimum, and a program's own status (FailJob, the others then terminated)
    below = fakes.listing(fakes.job("digits", "worker",
                                    ("Failed", "True", "MaxFailedIndexesExceeded")), lost)
    code, what = kubectl.outcome(below, elastic=True)
    assert code == 137 and "MaxFailedIndexesExceeded" in what and "lost: worker 2" in what
    own = fakes.listing(fakes.job("digits", "worker", ("Failed", "True", "PodFailurePolicy")),
                        fakes.pod("digits", "worker", 1, "Failed", 3,
                                  finished_at="2026-11-28T06:00:40Z"),
                        fakes.pod("digits", "worker", 0, "Failed", 143,
                                  finished_at="2026-11-28T06:00:41Z"))
    assert kubectl.outcome(own, elastic=True)[0] == 3


def test_elastic_options_on_kubernetes(capsys):
    assert parse(ELASTIC).min_workers == 3
    with pytest.raises(SystemExit):
        parse(["-n", "4", "--min-workers", "3", "--max-workers", "5"])
    assert "not for --launcher kubernetes" in capsys.readouterr().err
