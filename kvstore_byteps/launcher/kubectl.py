"""The kubernetes launcher's side that talks to a cluster, through kubectl: read the state of a
job's Jobs and pods (pure: :func:`outcome`, :func:`describe_progress`), stream each pod's output
with the ``[worker 0]`` prefixes of the other launchers, poll until the job is over, delete it.

Every kubectl call has a deadline (a subprocess timeout, and ``--request-timeout`` for kubectl
itself) and a message that names what it was for. :mod:`.kubernetes` makes the objects with
the labels below, by which this module finds them.
"""
import contextlib
import dataclasses
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from typing import IO, Dict, List, Mapping, Optional, Sequence, Tuple

from kvstore_byteps.config import Role
from kvstore_byteps.errors import EXIT_LEFT

from .job import (EXIT_TIMEOUT, STOP_SIGNALS, OutputCopy, describe_exit,
                  log_file_name)
from .plan import LaunchError, node_label

LABEL_APP, APP = "app.kubernetes.io/name", "kvstore-byteps"
LABEL_JOB = "kvstore-byteps/job"
LABEL_ROLE = "kvstore-byteps/role"
#: An Indexed Job's pod carries its index here (a worker's rank, a server's number).
COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"
POLL_INTERVAL_S = 2.0
KUBECTL_TIMEOUT_S = 60        # one kubectl call (it also gets --request-timeout)
DELETE_TIMEOUT_S = 120        # deleting, including waiting for the pods to be gone
LOG_DRAIN_S = 5.0             # after the end, how long the log streams get to finish
MAX_POLL_FAILURES = 5
#: exit statuses a worker's program chooses (sys.exit(N), an uncaught error: 1), which end an
#: elastic job as they end any other; EXIT_LEFT (taken for lost) and 128 + N (a signal's) are
#: losses, restarted
PROGRAM_STATUSES = [code for code in range(1, 128) if code != EXIT_LEFT]
#: A container waiting for one of these will not start without someone changing something.
STUCK_REASONS = ("ImagePullBackOff", "ErrImageNeverPull", "InvalidImageName",
                 "CreateContainerConfigError", "CreateContainerError")
_KLOG_LINE = re.compile(r"^[IWEF]\d{4} \d\d:\d\d:\d\d")


def selector(job_name: str) -> str:
    """The label selector of every object of the job."""
    return "%s=%s" % (LABEL_JOB, job_name)


@contextlib.contextmanager
def stop_signals_held():
    """Holds Ctrl-C, SIGTERM and SIGHUP until the block is done (then they arrive): for a child
    that must not be started and left untracked, or a creation that must not be cut in half."""
    signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)


def say(text: str) -> None:
    """A launcher message, on stderr, as the other launchers write them."""
    print("[launch] " + text, file=sys.stderr, flush=True)


@dataclasses.dataclass(frozen=True)
class PodState:
    """What the launcher needs of one pod: which node it is and how its container is doing."""

    name: str
    role: Role
    index: Optional[int]
    phase: str
    started: bool                     # its container runs or ran: it has output to follow
    exit_code: Optional[int] = None   # set once its container terminated
    reason: str = ""                  # why it terminated, or why it waits
    message: str = ""
    finished_at: str = ""

    @property
    def label(self) -> str:
        """``scheduler``, ``server 1``, ``worker 0``, as the other launchers name nodes."""
        return node_label(self.role, self.index)


def pod_states(listing: Mapping) -> List[PodState]:
    """Our pods in a ``kubectl get ... -o json`` listing (other kinds are skipped)."""
    states = []
    for item in listing.get("items", []):
        meta = item.get("metadata", {})
        role_name = meta.get("labels", {}).get(LABEL_ROLE, "")
        if item.get("kind") != "Pod" or role_name.upper() not in Role.__members__:
            continue
        index = meta.get("annotations", {}).get(COMPLETION_INDEX)
        status = item.get("status", {})
        container = (status.get("containerStatuses") or [{}])[0].get("state", {})
        done, waiting = container.get("terminated"), container.get("waiting") or {}
        states.append(PodState(
            meta.get("name", "?"), Role[role_name.upper()],
            int(index) if index is not None else None,
            status.get("phase", "Unknown"), bool(done or container.get("running")),
            done.get("exitCode") if done else None,
            (done or waiting).get("reason", ""), (done or waiting).get("message", ""),
            done.get("finishedAt", "") if done else ""))
    order = (Role.SCHEDULER, Role.SERVER, Role.WORKER)
    return sorted(states, key=lambda s: (order.index(s.role), s.index or 0, s.name))


def _job_conditions(listing: Mapping) -> Dict[str, Tuple[str, Dict[str, dict]]]:
    """Each role's Job: its name and its conditions that hold, by type (``Complete``, ...)."""
    jobs = {}
    for item in listing.get("items", []):
        meta = item.get("metadata", {})
        if item.get("kind") == "Job" and LABEL_ROLE in meta.get("labels", {}):
            jobs[meta["labels"][LABEL_ROLE]] = (meta.get("name", "?"), {
                c.get("type"): c for c in item.get("status", {}).get("conditions") or []
                if c.get("status") == "True"})
    return jobs


def outcome(listing: Mapping, elastic: bool = False) -> Optional[Tuple[int, str]]:
    """``(exit status, what happened)`` once the job is over, else None. Pure.

    The first node whose container failed (the earliest to finish) fails the job with its exit
    code; so does a container that cannot start; the workers' Job complete means success.
    With ``elastic`` workers a worker's failure is a loss the workers' Job handles (it
    restarts the index, or goes on without it): their Job decides (:func:`_elastic_end`).
    """
    states = pod_states(listing)
    failed = sorted((s for s in states if s.phase == "Failed" or s.exit_code not in (None, 0)
                     if not (elastic and s.role is Role.WORKER)),
                    key=lambda s: s.finished_at or "~")
    if failed:
        first = failed[0]
        code = first.exit_code or 1
        how = describe_exit(code) if first.exit_code else "failed"
        return code, "%s (pod %s) %s%s" % (first.label, first.name, how, _why(first))
    for state in states:
        if state.reason in STUCK_REASONS:
            return 1, "%s (pod %s) cannot start%s" % (state.label, state.name, _why(state))
    jobs = _job_conditions(listing)
    if "Complete" in jobs.get(Role.WORKER.name.lower(), ("", {}))[1]:
        return 0, "the workers finished"
    if elastic:
        return _elastic_end(jobs, states)
    for name, conditions in jobs.values():
        if "Failed" in conditions:
            return 1, "Job %s failed: %s: %s" % (name, conditions["Failed"].get("reason"),
                                                 conditions["Failed"].get("message", ""))
    return None


def _elastic_end(jobs: Mapping, states: Sequence[PodState]) -> Optional[Tuple[int, str]]:
    """An elastic job's end (the workers' Job not complete): the servers finished (the
    workers passed their final barrier: restarted ones still starting never joined), or the
    workers' Job failed: because indexes failed, by a worker's own status, or below the
    minimum."""
    servers = jobs.get(Role.SERVER.name.lower(), ("", {}))[1]
    name, conditions = jobs.get(Role.WORKER.name.lower(), ("", {}))
    lost = sorted({s.index for s in states if s.role is Role.WORKER and s.phase == "Failed"
                   and s.index is not None})
    what = "; lost: worker %s" % ", ".join(map(str, lost)) if lost else ""
    if "Complete" in servers:
        return 0, "the training is over (the servers finished)%s" % what
    failed = conditions.get("Failed")
    if failed is None:
        return None
    reason = failed.get("reason", "")
    if reason == "FailedIndexes":       # every index ended, some failed: within the minimum
        return 0, "the workers finished%s" % what
    # a program's own status (FailJob) first: the Job then stopped the others (SIGTERM)
    ended = sorted((s for s in states if s.role is Role.WORKER and s.exit_code),
                   key=lambda s: (s.exit_code not in PROGRAM_STATUSES, s.finished_at or "~"))
    code = ended[0].exit_code if ended else 1
    return code, "Job %s failed: %s: %s%s" % (name, reason, failed.get("message", ""), what)


def _why(state: PodState) -> str:
    """``: OOMKilled: message`` (what Kubernetes said about the container), or nothing."""
    said = [t for t in (state.reason, state.message.strip()) if t]
    return ": " + ": ".join(said) if said else ""


def describe_progress(states: Sequence[PodState], num_servers: int, num_workers: int) -> str:
    """What the pods are doing, by role, e.g. ``scheduler Running; servers 2 Running; workers
    3 Running, 1 Pending (ContainerCreating)``: what the launcher waits for."""
    parts = []
    for role, expected in ((Role.SCHEDULER, 1), (Role.SERVER, num_servers),
                           (Role.WORKER, num_workers)):
        mine = [s for s in states if s.role is role]
        counts: Dict[str, int] = {}
        for s in mine:
            key = s.phase + (" (%s)" % s.reason if s.phase == "Pending" and s.reason else "")
            counts[key] = counts.get(key, 0) + 1
        if len(mine) < expected:
            counts["not created yet"] = expected - len(mine)
        name = role.name.lower() + ("s" if role is not Role.SCHEDULER else "")
        parts.append("%s %s" % (name, ", ".join(
            ("%d %s" % (n, k)) if role is not Role.SCHEDULER else k for k, n in counts.items())))
    return "; ".join(parts)


# --------------------------------------------------------------------------- kubectl
class Kubectl:
    """Runs kubectl (in the job's namespace), every call bounded by a timeout."""

    def __init__(self, namespace: Optional[str] = None):
        self.path = shutil.which("kubectl")
        if self.path is None:
            raise LaunchError("kubectl not found on PATH (--launcher kubernetes creates and "
                              "follows the job with it; --dry-run prints the objects without it)")
        self.namespace = namespace

    def argv(self, *args: str) -> List[str]:
        namespace = ["--namespace", self.namespace] if self.namespace else []
        return [self.path] + namespace + list(args)

    def call(self, what: str, *args: str, stdin: Optional[str] = None,
             timeout: float = KUBECTL_TIMEOUT_S) -> str:
        """kubectl's output; LaunchError naming ``what`` if it fails or outlives ``timeout``."""
        argv = self.argv("--request-timeout=%ds" % min(timeout, KUBECTL_TIMEOUT_S), *args)
        try:
            done = subprocess.run(argv, input=stdin, capture_output=True, text=True,
                                  timeout=timeout)
        except subprocess.TimeoutExpired:
            raise LaunchError("kubectl did not %s within %d s" % (what, timeout)) from None
        if done.returncode != 0:
            # kubectl's own summary lines, without client-go's log lines ("E1128 06:52:55 ...")
            said = [line.strip() for line in done.stderr.splitlines()
                    if line.strip() and not _KLOG_LINE.match(line)]
            raise LaunchError("kubectl could not %s: %s" % (
                what, "; ".join(said) or "exit status %d" % done.returncode))
        return done.stdout


class LogStreams:
    """``kubectl logs -f`` of each pod once it has started, each line prefixed ``[worker 0]``
    (and, with a log folder, also written to ``worker-0.log`` there, as the other launchers do)."""

    def __init__(self, kubectl: Kubectl, log_dir: Optional[str] = None):
        self.kubectl, self.log_dir = kubectl, log_dir
        if log_dir:
            os.makedirs(log_dir, exist_ok=True)
        self.streams: Dict[str, Tuple[subprocess.Popen, OutputCopy]] = {}
        self.logs: List[IO[bytes]] = []

    def follow(self, states: Sequence[PodState]) -> None:
        """Start following the pods that have started and are not followed yet."""
        for state in states:
            if state.started and state.name not in self.streams:
                log = open(os.path.join(self.log_dir, log_file_name(state)), "wb") \
                    if self.log_dir else None
                if log is not None:
                    self.logs.append(log)
                # Held, so close() knows every stream to stop (the copying thread inherits the
                # mask: stop signals go to the main thread)
                with stop_signals_held():
                    proc = subprocess.Popen(
                        self.kubectl.argv("logs", "-f", "pod/" + state.name,
                                          "-c", state.role.name.lower()),
                        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                        stderr=subprocess.STDOUT)
                    copy = OutputCopy(proc.stdout, "[%s] " % state.label, sys.stdout.buffer, log)
                    self.streams[state.name] = (proc, copy)

    def close(self, drain_s: float = 0.0) -> None:
        """Let the streams finish for up to ``drain_s`` seconds, then stop what is left."""
        deadline = time.monotonic() + drain_s
        for _, copy in self.streams.values():
            copy.thread.join(max(0.0, deadline - time.monotonic()))
        for proc, copy in self.streams.values():
            if proc.poll() is None:
                proc.kill()
            proc.wait(timeout=5)
            copy.thread.join(5)
        for log in self.logs:
            log.close()


def follow(kubectl: Kubectl, job_name: str, num_servers: int, num_workers: int,
           timeout_s: Optional[float], streams: LogStreams, elastic: bool = False) -> int:
    """Poll the job until it is over, following each pod's output as it starts; the exit
    status: 0 when the workers' Job is complete, a failed node's exit code, 124 at the timeout."""
    deadline = time.monotonic() + timeout_s if timeout_s else None
    shown, failures = "", 0
    while True:
        try:
            listing = json.loads(kubectl.call("read the job's Jobs and pods", "get", "jobs,pods",
                                              "-l", selector(job_name), "-o", "json"))
            failures = 0
        except (LaunchError, ValueError) as exc:
            failures += 1
            if failures >= MAX_POLL_FAILURES:
                raise
            say("%s (try %d of %d)" % (exc, failures, MAX_POLL_FAILURES))
            listing = None
        if listing is not None:
            states = pod_states(listing)
            streams.follow(states)
            progress = describe_progress(states, num_servers, num_workers)
            if progress != shown:
                say("pods: " + progress)
                shown = progress
            result = outcome(listing, elastic)
            if result is not None:
                code, what = result
                say(what if code == 0 else "%s; stopping the job (exit status %d)" % (what, code))
                return code
        if deadline is not None and time.monotonic() >= deadline:
            say("timeout after %g s; stopping the job" % timeout_s)
            return EXIT_TIMEOUT
        pause = POLL_INTERVAL_S if deadline is None else min(POLL_INTERVAL_S,
                                                              deadline - time.monotonic())
        time.sleep(max(0.0, pause))


def delete(kubectl: Kubectl, job_name: str) -> None:
    """Delete the job's Jobs (and so their pods) and Service, and wait until the pods are gone;
    if that fails, say how to do it by hand."""
    say("deleting job %s's Jobs, pods and Service" % job_name)
    try:
        kubectl.call("delete the job's objects", "delete", "jobs,services",
                     "-l", selector(job_name), "--ignore-not-found", "--cascade=foreground",
                     "--wait=true", "--timeout=%ds" % (DELETE_TIMEOUT_S - 10),
                     timeout=DELETE_TIMEOUT_S)
        say("deleted: nothing of job %s is left running" % job_name)
    except LaunchError as exc:
        say("%s; to delete what is left: kubectl delete jobs,services -l %s%s"
            % (exc, selector(job_name),
               " --namespace " + kubectl.namespace if kubectl.namespace else ""))
