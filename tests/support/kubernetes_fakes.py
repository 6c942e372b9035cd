"""What a Kubernetes cluster would do, for the kubernetes launcher's tests: the environment a pod
gets from a rendered container (its variables expanded and its fields filled in as the kubelet
does), Job and Pod objects as ``kubectl get -o json`` prints them (the unit tests validate them
against the API schemas, so their shape is the real one), and a fake ``kubectl`` program that
answers from files and records every call."""
import json
import os
import re
import stat
import sys

from kvstore_byteps.launcher.kubectl import COMPLETION_INDEX, LABEL_JOB, LABEL_ROLE

START = "2026-11-28T06:00:00Z"


def the_container(job_object):
    """The only container of a rendered Job's pods."""
    (only,) = job_object["spec"]["template"]["spec"]["containers"]
    return only


def expand(text, defined):
    """What Kubernetes makes of a command word or a variable's value (its expansion rules:
    ``$$`` is ``$``, ``$(NAME)`` is NAME's value when NAME is defined, anything else stays)."""
    def one(match):
        if match.group(0) == "$$":
            return "$"
        return defined.get(match.group(1), match.group(0))
    return re.sub(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_]*)\)", one, text)


def pod_env(job_object, pod_ip, index=None):
    """The variables a pod of a rendered Job gets, with its IP and completion index filled in."""
    fields = {"status.podIP": pod_ip,
              "metadata.annotations['%s']" % COMPLETION_INDEX: str(index)}
    env = {}
    for entry in the_container(job_object)["env"]:
        env[entry["name"]] = (expand(entry["value"], env) if "value" in entry
                              else fields[entry["valueFrom"]["fieldRef"]["fieldPath"]])
    return env


def listing(*items):
    """A ``kubectl get jobs,pods -o json`` answer."""
    return {"apiVersion": "v1", "kind": "List", "metadata": {"resourceVersion": ""},
            "items": list(items)}


def job(job_name, role, *conditions):
    """The role's Job with status conditions, e.g. ``("Complete", "True")``."""
    return {"apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": "%s-%s" % (job_name, role),
                         "labels": {LABEL_JOB: job_name, LABEL_ROLE: role}},
            "status": {"conditions": [{"type": kind, "status": status, "reason": reason,
                                       "message": "%s: %s" % (kind, reason),
                                       "lastTransitionTime": START}
                                      for kind, status, reason in
                                      (c + ("Done",) if len(c) == 2 else c for c in conditions)]}}


def pod(job_name, role, index=None, phase="Running", exit_code=None, reason="", message="",
        finished_at="2026-11-28T06:01:00Z", waiting=None):
    """One of the job's pods; ``exit_code`` makes its container terminated, ``waiting`` a reason
    why it has not started (``phase`` Pending)."""
    if exit_code is not None:
        state = {"terminated": {"exitCode": exit_code, "reason": reason or (
            "Completed" if exit_code == 0 else "Error"), "message": message,
            "startedAt": START, "finishedAt": finished_at}}
    elif waiting is not None:
        state = {"waiting": {"reason": waiting, "message": message}}
    else:
        state = {"running": {"startedAt": START}}
    name = "%s-%s-%s%s" % (job_name, role, "" if index is None else "%d-" % index, "x7k2p")
    meta = {"name": name, "labels": {LABEL_JOB: job_name, LABEL_ROLE: role}}
    if index is not None:
        meta["annotations"] = {COMPLETION_INDEX: str(index)}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta,
            "status": {"phase": phase, "containerStatuses": [{
                "name": role, "image": "registry.example.com/kvstore-byteps:0.1", "imageID": "",
                "ready": phase == "Running", "restartCount": 0, "state": state}]}}


def running_job(job_name, num_servers, num_workers):
    """Every node running, nothing finished."""
    return listing(job(job_name, "scheduler"), job(job_name, "server"), job(job_name, "worker"),
                   pod(job_name, "scheduler"),
                   *[pod(job_name, "server", i) for i in range(num_servers)],
                   *[pod(job_name, "worker", i) for i in range(num_workers)])


def finished_job(job_name, num_servers, num_workers):
    """The workers' Job complete; scheduler and servers still running."""
    return listing(job(job_name, "scheduler"), job(job_name, "server"),
                   job(job_name, "worker", ("Complete", "True")),
                   pod(job_name, "scheduler"),
                   *[pod(job_name, "server", i) for i in range(num_servers)],
                   *[pod(job_name, "worker", i, "Succeeded", 0) for i in range(num_workers)])


def failed_job(job_name, num_servers, num_workers, rank, code):
    """Worker ``rank`` exited with ``code``; its Job failed."""
    return listing(job(job_name, "scheduler"), job(job_name, "server"),
                   job(job_name, "worker", ("Failed", "True", "BackoffLimitExceeded")),
                   pod(job_name, "scheduler"),
                   *[pod(job_name, "server", i) for i in range(num_servers)],
                   *[pod(job_name, "worker", i, "Failed", code) if i == rank
                     else pod(job_name, "worker", i) for i in range(num_workers)])


FAKE_KUBECTL = r'''#!{python}
"""A fake kubectl: records each call in calls.jsonl beside it, answers from listing.json."""
import json, os, sys
here = os.path.dirname(os.path.abspath(__file__))
args = sys.argv[1:]
stdin = sys.stdin.read() if "create" in args else None
with open(os.path.join(here, "calls.jsonl"), "a") as log:
    log.write(json.dumps({{"argv": args, "stdin": stdin}}) + "\n")
words, namespace = [], None
while args:
    word = args.pop(0)
    if word == "--namespace":
        namespace = args.pop(0)
    elif not word.startswith("--request-timeout"):
        words.append(word)
verb = words[0]
if verb == "get" and words[-2:] == ["-o", "name"]:
    existing = os.path.join(here, "existing.txt")
    print(open(existing).read() if os.path.exists(existing) else "", end="")
elif verb == "get":
    print(open(os.path.join(here, "listing.json")).read())
elif verb == "create":
    print("service/x created")
elif verb == "logs":
    print("hello from %s" % words[2])
    print("second line without a newline", end="")
elif verb == "delete":
    print("job.batch/x deleted")
else:
    print("fake kubectl: unexpected %r" % words, file=sys.stderr)
    sys.exit(2)
'''


class FakeKubectl:
    """A fake ``kubectl`` in ``folder`` (put it first on PATH) answering ``listing``."""

    def __init__(self, folder, answer):
        self.folder = str(folder)
        path = os.path.join(self.folder, "kubectl")
        with open(path, "w") as script:
            script.write(FAKE_KUBECTL.format(python=sys.executable))
        os.chmod(path, os.stat(path).st_mode | stat.S_IXUSR)
        self.answer(answer)

    def answer(self, listing_object):
        """What ``kubectl get jobs,pods -o json`` prints from now on."""
        with open(os.path.join(self.folder, "listing.json"), "w") as out:
            json.dump(listing_object, out)

    def existing(self, names):
        """What ``kubectl get jobs,services -o name`` prints (objects already there)."""
        with open(os.path.join(self.folder, "existing.txt"), "w") as out:
            out.write("".join(n + "\n" for n in names))

    def calls(self):
        """Every call so far: ``{"argv": [...], "stdin": text or None}``."""
        try:
            with open(os.path.join(self.folder, "calls.jsonl")) as log:
                return [json.loads(line) for line in log]
        except FileNotFoundError:
            return []

    def verbs(self):
        """The verb of each call (``get``, ``create``, ``logs``, ``delete``)."""
        return [next(a for a in c["argv"] if not a.startswith("--") and a not in
                     self._namespaces(c["argv"])) for c in self.calls()]

    @staticmethod
    def _namespaces(argv):
        return [argv[i + 1] for i, a in enumerate(argv[:-1]) if a == "--namespace"]
