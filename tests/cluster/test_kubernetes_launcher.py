"""``--launcher kubernetes`` against a fake kubectl (first on PATH, answering from files, recording
each call): it creates the objects, follows every pod's output, exits with the workers' status or
the failed node's, stops at the timeout and on SIGTERM, and always deletes the job's objects.
No cluster is involved; that the objects are valid Kubernetes objects is tested in tests/unit."""
import json
import os
import signal
import subprocess
import sys

import pytest

from kvstore_byteps.launcher import cli, kubernetes
from kvstore_byteps.launcher.plan import LaunchError
from tests.support import kubernetes_fakes as fakes
from tests.support.paths import REPO
from tests.support.procs import free_ports, wait_until

pytestmark = pytest.mark.timeout(60)

NAME = "digits"
OPTIONS = ["--launcher", "kubernetes", "--image", "registry.example.com/kvstore-byteps:0.1",
           "--name", NAME, "-n", "2", "-s", "1"]
COMMAND = ["python", "examples/train_digits.py"]


@pytest.fixture
def kubectl(tmp_path, monkeypatch):
    fake = fakes.FakeKubectl(tmp_path, fakes.finished_job(NAME, 1, 2))
    monkeypatch.setenv("PATH", str(tmp_path) + os.pathsep + os.environ["PATH"])
    return fake


def launch(*options):
    return kubernetes.run(cli.parse_args(OPTIONS + list(options) + COMMAND, environ={}))


def test_a_finished_job_is_created_followed_and_deleted(kubectl, capfd):
    assert launch("--namespace", "training") == 0
    verbs = kubectl.verbs()
    assert verbs[:3] == ["get", "create", "get"] and verbs[-1] == "delete"
    assert verbs.count("logs") == 4          # the scheduler, the server and both workers
    calls = kubectl.calls()
    assert all(c["argv"][:2] == ["--namespace", "training"] for c in calls)
    created = [c for c in calls if "create" in c["argv"]][0]["stdin"]
    assert [o["metadata"]["name"] for o in [json.loads(d) for d in created.split("\n---\n")[1:]]] \
        == ["digits-scheduler", "digits-scheduler", "digits-server", "digits-worker"]
    assert "kvstore-byteps/job=digits" in calls[-1]["argv"]
    assert "--cascade=foreground" in calls[-1]["argv"]
    out, err = capfd.readouterr()
    assert "[worker 1] hello from pod/digits-worker-1-x7k2p\n" in out
    assert "[worker 1] second line without a newline\n" in out
    assert "[scheduler] hello from pod/digits-scheduler-x7k2p\n" in out
    assert "the workers finished" in err and "nothing of job digits is left running" in err


def test_a_failed_worker_fails_the_job_with_its_exit_code(kubectl, capfd, tmp_path):
    kubectl.answer(fakes.failed_job(NAME, 1, 2, 1, 7))
    assert launch("--log-dir", str(tmp_path / "logs")) == 7
    assert kubectl.verbs()[-1] == "delete"
    err = capfd.readouterr().err
    assert "worker 1 (pod digits-worker-1-x7k2p) exited with code 7" in err
    assert (tmp_path / "logs" / "worker-1.log").read_text() == (
        "hello from pod/digits-worker-1-x7k2p\nsecond line without a newline\n")
    assert sorted(p.name for p in (tmp_path / "logs").iterdir()) == [
        "scheduler.log", "server-0.log", "worker-0.log", "worker-1.log"]


def test_the_timeout_stops_the_job_with_124(kubectl):
    kubectl.answer(fakes.running_job(NAME, 1, 2))
    assert launch("--timeout", "1") == 124
    assert kubectl.verbs()[-1] == "delete"


def test_a_job_of_the_same_name_is_left_alone(kubectl):
    kubectl.existing(["job.batch/digits-worker"])
    with pytest.raises(LaunchError, match="already has objects.*job.batch/digits-worker"):
        launch()
    assert kubectl.verbs() == ["get"]        # nothing created, nothing deleted


def test_through_the_command_line_a_launch_error_exits_127(kubectl, capfd):
    kubectl.existing(["service/digits-scheduler"])
    assert cli.main(OPTIONS + COMMAND) == 127
    assert "choose another --name" in capfd.readouterr().err


def test_sigterm_stops_the_job_and_deletes_it(kubectl, tmp_path):
    kubectl.answer(fakes.running_job(NAME, 1, 2))
    program = ("import sys; from kvstore_byteps.launcher import cli, kubernetes; "
               "sys.exit(kubernetes.run(cli.parse_args(sys.argv[1:])))")
    launcher = subprocess.Popen([sys.executable, "-c", program] + OPTIONS + COMMAND, cwd=REPO,
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        wait_until(lambda: kubectl.verbs().count("get") >= 2, 20, "the launcher's first poll")
        launcher.send_signal(signal.SIGTERM)
        _, err = launcher.communicate(timeout=20)
    finally:
        launcher.kill()
        launcher.wait(timeout=10)
    assert launcher.returncode == 128 + signal.SIGTERM
    assert "received SIGTERM" in err and "left running" in err
    # deleted last (a log stream's own kubectl, started before, may record its call after the
    # delete's: a CI run saw it under load)
    assert [verb for verb in kubectl.verbs() if verb != "logs"][-1] == "delete"


def test_kubectl_reads_the_dry_run_output(tmp_path, capsys):
    """kubectl's own YAML reader (through kustomize, which needs no cluster) takes the documents
    --dry-run prints (JSON documents after a comment line) as the objects they are."""
    real = subprocess.run(["sh", "-c", "command -v kubectl"], capture_output=True, text=True,
                          timeout=10).stdout.strip()
    if not real:
        pytest.skip("no kubectl on PATH")
    args = cli.parse_args(OPTIONS + ["--dry-run", "--env", "A=$(B)"] + COMMAND, environ={})
    assert kubernetes.run(args) == 0
    (tmp_path / "job.yaml").write_text(capsys.readouterr().out)
    (tmp_path / "kustomization.yaml").write_text("resources:\n- job.yaml\n")
    done = subprocess.run([real, "kustomize", str(tmp_path)], capture_output=True, text=True,
                          timeout=30)
    assert done.returncode == 0, done.stderr
    yaml = pytest.importorskip("yaml")
    def key(obj):
        return obj["kind"], obj["metadata"]["name"]
    objects = kubernetes.render(kubernetes.job_from_args(args))
    assert sorted(yaml.safe_load_all(done.stdout), key=key) == sorted(objects, key=key)


@pytest.mark.timeout(150)
def test_the_rendered_pods_form_a_cluster_and_train(spawn):
    """Each rendered pod's command and environment, run as a local process, as the kubelet would
    start it (fields filled in: every pod IP 127.0.0.1, the workers' completion indexes). The one
    stand-in: the Service's name becomes ``localhost``, a name too (no cluster DNS here), so
    servers and workers still reach the scheduler through name resolution."""
    port = free_ports(1)[0]
    args = cli.parse_args(OPTIONS + ["--port", str(port)] + COMMAND + ["--epochs", "1"],
                          environ={})
    jobs = {o["metadata"]["name"]: o for o in kubernetes.render(kubernetes.job_from_args(args))
            if o["kind"] == "Job"}
    procs = {}
    for role, count in (("scheduler", 1), ("server", 1), ("worker", 2)):
        job = jobs["%s-%s" % (NAME, role)]
        for index in range(count):
            env = fakes.pod_env(job, "127.0.0.1", index)
            if role != "scheduler":
                assert env["DMLC_PS_ROOT_URI"] == "digits-scheduler"
                env["DMLC_PS_ROOT_URI"] = "localhost"
            argv = [fakes.expand(word, env) for word in fakes.the_container(job)["command"]]
            argv = [sys.executable if word == "python" else word for word in argv]
            procs[(role, index)] = spawn(argv, cwd=REPO, env={**os.environ, **env},
                                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                         text=True)
    outputs = {node: proc.communicate(timeout=120)[0] for node, proc in procs.items()}
    for node, proc in procs.items():
        assert proc.returncode == 0, (node, outputs[node][-3000:])
    assert "parameters identical on all 2 workers" in outputs[("worker", 0)]
