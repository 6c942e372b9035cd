"""``--launcher kubernetes``: the job as core Kubernetes objects, created with kubectl and followed.

:func:`render` turns a :class:`KubeJob` into plain dicts, with no kubectl and no I/O:

* a headless Service ``<name>-scheduler`` (``clusterIP: None``) selecting the scheduler's pod;
  ``publishNotReadyAddresses`` makes its DNS name answer as soon as the pod has an address;
* Jobs ``<name>-scheduler`` (one pod), ``<name>-server`` and ``<name>-worker``, Indexed Jobs of
  S and W pods, one node per pod. ``backoffLimit: 0`` and ``restartPolicy: Never``: a
  parameter-server node cannot rejoin a running job, so a node that fails fails its Job.
  Elastic workers (``--min-workers N``, ``--max-restarts K``) are the exception: the workers'
  Job restarts a failed worker's index up to K times (``backoffLimitPerIndex``, Kubernetes
  1.29+; its pod has the same index, so the same rank, and takes its place back at the
  others' next commit), goes on while at most W - N indexes failed (``maxFailedIndexes``),
  does not count a preempted or evicted pod (``DisruptionTarget``) and fails at once where
  a worker's program exits with a status of its own (``podFailurePolicy``), as
  ``launch.py``'s local supervision does.

Placement: each role's :class:`Placement` (``--node-selector``, ``--cpu``, ``--memory``, each
``[server:|worker:]VALUE``) goes on that role's pod template only; the scheduler's pod gets the
servers' node selector and no resources; ``--gpus`` is the workers' alone.

Addresses: servers and workers reach the scheduler at the Service's name, ``<name>-scheduler``
(``DMLC_PS_ROOT_URI``), which resolves inside the job's namespace whatever the cluster's domain.
ZeroMQ resolves a name when it connects and retries, so a node that starts before the name exists
waits for it. The scheduler itself gets its pod IP there instead: it binds its socket to
``DMLC_PS_ROOT_URI`` verbatim (van/zmq/van.py), and a DNS name cannot be bound. Every node
announces its pod IP (``DMLC_NODE_HOST``, from the downward API); a worker's rank
(``DMLC_WORKER_ID``) is its pod's completion index; a pod is a host with one worker
(``BYTEPS_LOCAL_RANK`` 0 of ``BYTEPS_LOCAL_SIZE`` 1).

:func:`run` creates the objects with ``kubectl create``, streams every node's output with the
usual ``[worker 0]`` prefixes, and polls the Jobs and pods (:mod:`.kubectl`) until the
workers' Job is complete (exit 0) or a node fails (its exit code), the timeout passes (124) or a
signal arrives (128+N). Whatever happens after creation, it then deletes the job's objects and
waits until their pods are gone.
"""
import dataclasses
import json
import math
import random
import re
import signal
import string
import sys
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

from kvstore_byteps.config import Env, Role

from . import kubectl as cluster
from .job import EXIT_TIMEOUT, STOP_SIGNALS
from .kubectl import (APP, COMPLETION_INDEX, LABEL_APP, LABEL_JOB, LABEL_ROLE, PROGRAM_STATUSES,
                      Kubectl, say)
from .plan import (LaunchError, SchedulerProgram, ServerProgram, WORKER_ID, lay_out_workers,
                   role_env, scheduler_argv, server_program, worker_env)

DEFAULT_PORT = 9091           # each pod has its own network namespace: no port to avoid
CONTAINER_PYTHON = "python"   # the image's interpreter, not this machine's sys.executable
GPU_RESOURCE = "nvidia.com/gpu"
#: Leaves room for ``-scheduler`` and ``-worker-<index>`` within a 63-character DNS label (an
#: Indexed Job's pod host name is ``<job>-<index>``).
MAX_NAME_LENGTH = 40
#: Finished Jobs go away on their own an hour later even if the launcher was killed.
TTL_AFTER_FINISHED_S = 3600
#: Past --timeout, the cluster stops the Jobs itself (the launcher may be gone by then).
CLUSTER_DEADLINE_MARGIN_S = 60

_DNS_1035_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")   # Service names
_DNS_1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")  # namespaces
_LABEL_KEY = re.compile(r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
                        r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")
_LABEL_VALUE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?$")
_QUANTITY = re.compile(r"^(\d+(\.\d*)?|\.\d+)([KMGTPE]i|[mkMGTPE]|[eE][+-]?\d+)?$")
#: The role prefixes of --node-selector, --cpu and --memory; without one a value is for both.
ROLE_PREFIXES = {"server": Role.SERVER, "worker": Role.WORKER}


@dataclasses.dataclass(frozen=True)
class Placement:
    """Where one role's pods run and what their containers get: a nodeSelector, and CPU and
    memory (each both the request and the limit; None: unset)."""

    node_selector: Mapping[str, str] = dataclasses.field(default_factory=dict)
    cpu: Optional[str] = None
    memory: Optional[str] = None


@dataclasses.dataclass(frozen=True)
class KubeJob:
    """Everything :func:`render` needs; checked on construction (LaunchError quotes the value)."""

    name: str
    image: str
    num_workers: int
    num_servers: int
    worker_argv: Tuple[str, ...]
    scheduler_argv: Tuple[str, ...]
    server_argv: Tuple[str, ...]
    server_env: Mapping[str, str] = dataclasses.field(default_factory=dict)
    env_all: Mapping[str, str] = dataclasses.field(default_factory=dict)
    env_server: Mapping[str, str] = dataclasses.field(default_factory=dict)
    env_worker: Mapping[str, str] = dataclasses.field(default_factory=dict)
    namespace: Optional[str] = None
    port: int = DEFAULT_PORT
    servers: Placement = dataclasses.field(default_factory=Placement)
    workers: Placement = dataclasses.field(default_factory=Placement)
    gpus: Optional[int] = None   # per worker: servers and the scheduler get none
    local_groups: bool = False
    timeout_s: Optional[float] = None
    min_workers: int = 0      # elastic workers: the workers' Job restarts a failed index
    max_restarts: int = 0

    def __post_init__(self):
        if len(self.name) > MAX_NAME_LENGTH or not _DNS_1035_LABEL.match(self.name):
            raise LaunchError("--name %r: expected at most %d lower-case letters, digits and '-', "
                              "starting with a letter and not ending with '-' (it names "
                              "Kubernetes objects)" % (self.name, MAX_NAME_LENGTH))
        if self.namespace is not None and (len(self.namespace) > 63
                                           or not _DNS_1123_LABEL.match(self.namespace)):
            raise LaunchError("--namespace %r is not a namespace name (lower-case letters, digits "
                              "and '-')" % self.namespace)
        if not self.image or any(c.isspace() for c in self.image):
            raise LaunchError("--image %r is not an image reference" % self.image)
        for placement in (self.servers, self.workers):
            for option, value in (("--cpu", placement.cpu), ("--memory", placement.memory)):
                if value is not None:
                    _check_quantity(option, value, value)

    @property
    def scheduler_host(self) -> str:
        """The scheduler's address for servers and workers: its Service's name."""
        return self.name + "-scheduler"


def _check_quantity(option: str, text: str, value: str) -> None:
    if not _QUANTITY.match(value):
        raise LaunchError("%s %r is not a Kubernetes quantity (e.g. 4, 3500m, 16Gi)"
                          % (option, text))


def _role_prefix(option: str, text: str, stop: str = "") -> Tuple[Optional[Role], str]:
    """``[server:|worker:]VALUE`` as (the role, or None for both) and VALUE. A ':' after
    ``stop`` is part of VALUE, not a prefix (a label value cannot hold one anyway)."""
    head, sep, rest = text.partition(":")
    if not sep or (stop and stop in head):
        return None, text
    if head not in ROLE_PREFIXES:
        raise LaunchError("%s %r: unknown role %r; expected %s or no prefix (both)"
                          % (option, text, head, " or ".join(r + ":" for r in ROLE_PREFIXES)))
    return ROLE_PREFIXES[head], rest


def _label(text: str, label: str) -> Tuple[str, str]:
    """``LABEL=VALUE`` (``label``, from the option ``text``) as (name, value)."""
    key, sep, value = label.partition("=")
    if not sep or not _LABEL_KEY.match(key) or len(key.rpartition("/")[0]) > 253 \
            or not _LABEL_VALUE.match(value):
        raise LaunchError("--node-selector %r: expected [server:|worker:]LABEL=VALUE with a "
                          "Kubernetes label name and value, e.g. kubernetes.io/arch=amd64" % text)
    return key, value


def parse_node_selector(options: Sequence[str]) -> Dict[str, str]:
    """``--node-selector LABEL=VALUE`` options (no role prefix) as a nodeSelector; LaunchError
    on a bad one."""
    return dict(_label(text, text) for text in options)


def parse_placements(node_selector: Sequence[str] = (), cpu: Sequence[str] = (),
                     memory: Sequence[str] = ()) -> Dict[Role, Placement]:
    """The servers' and the workers' :class:`Placement` from ``--node-selector``, ``--cpu`` and
    ``--memory`` options, each ``[server:|worker:]VALUE``. A value without a prefix is for both
    roles; one with a prefix is added to (a label) or replaces (CPU, memory) it for that role
    only, wherever it stands on the command line. Among equals the last one wins, as with any
    repeated option. LaunchError, quoting the option as written, on a bad one."""
    selectors = {None: {}, Role.SERVER: {}, Role.WORKER: {}}
    sizes = {who: {} for who in selectors}
    for text in node_selector:
        role, label = _role_prefix("--node-selector", text, stop="=")
        key, value = _label(text, label)
        selectors[role][key] = value
    for option, field, values in (("--cpu", "cpu", cpu), ("--memory", "memory", memory)):
        for text in values:
            role, value = _role_prefix(option, text)
            _check_quantity(option, text, value)
            sizes[role][field] = value
    return {role: Placement(node_selector={**selectors[None], **selectors[role]},
                            **{**sizes[None], **sizes[role]})
            for role in (Role.SERVER, Role.WORKER)}


def random_name() -> str:
    """``kvstore-byteps-`` and 6 random lower-case letters and digits."""
    alphabet = string.ascii_lowercase + string.digits
    return "kvstore-byteps-" + "".join(random.choice(alphabet) for _ in range(6))


def job_from_args(args) -> KubeJob:
    """The :class:`KubeJob` a parsed command line (``cli.parse_args``) asks for."""
    server_argv, server_env = server_program(ServerProgram(args.server), CONTAINER_PYTHON)
    placements = parse_placements(args.node_selector, args.cpu, args.memory)
    return KubeJob(
        name=random_name() if args.name is None else args.name, image=args.image,
        num_workers=args.num_workers, num_servers=args.num_servers,
        worker_argv=tuple(args.command),
        scheduler_argv=tuple(args.scheduler_cmd or scheduler_argv(
            SchedulerProgram(args.scheduler), CONTAINER_PYTHON)),
        server_argv=tuple(args.server_cmd or server_argv), server_env=server_env,
        env_all=args.env_all, env_server=args.env_server, env_worker=args.env_worker,
        namespace=args.namespace, port=args.port or DEFAULT_PORT,
        servers=placements[Role.SERVER], workers=placements[Role.WORKER], gpus=args.gpus,
        local_groups=args.local_groups, timeout_s=args.timeout,
        min_workers=args.min_workers or 0, max_restarts=args.max_restarts or 0)


# ------------------------------------------------------------------------------- render
def _literal(text: str) -> str:
    """``text`` as Kubernetes passes it on: it expands ``$(NAME)`` in commands and variables and
    reduces ``$$`` to ``$``, so doubling every ``$`` keeps the text exactly as the user wrote it."""
    return text.replace("$", "$$")


def _env_list(values: Mapping[str, str], fields: Mapping[str, str]) -> List[dict]:
    """Container variables: ``values`` as text, ``fields`` (name: field path) from the pod."""
    entries = [{"name": k, "value": _literal(v)} for k, v in values.items() if k not in fields]
    return entries + [{"name": k, "valueFrom": {"fieldRef": {"fieldPath": path}}}
                      for k, path in fields.items()]


def _labels(job: KubeJob, role: Optional[Role] = None) -> Dict[str, str]:
    labels = {LABEL_APP: APP, LABEL_JOB: job.name}
    if role is not None:
        labels[LABEL_ROLE] = role.name.lower()
    return labels


def _metadata(job: KubeJob, name: str, role: Optional[Role]) -> dict:
    metadata = {"name": name, "labels": _labels(job, role)}
    if job.namespace:
        metadata["namespace"] = job.namespace
    return metadata


def _placement(job: KubeJob, role: Role) -> Placement:
    """What ``role``'s pods get. The scheduler is a small CPU process, as the servers are, so its
    pod goes where theirs go (with plain --node-selector options only: every pod, as before) and
    not onto the workers' GPU nodes. It gets no CPU or memory, as before: it only passes
    control messages, and --cpu and --memory size the servers and workers."""
    if role is Role.WORKER:
        return job.workers
    if role is Role.SERVER:
        return job.servers
    return Placement(node_selector=job.servers.node_selector)


def _container(job: KubeJob, role: Role, argv: Sequence[str], env: List[dict]) -> dict:
    container = {"name": role.name.lower(), "image": job.image, "imagePullPolicy": "IfNotPresent",
                 "command": [_literal(a) for a in argv], "env": env}
    if role is Role.SCHEDULER:
        container["ports"] = [{"name": "scheduler", "containerPort": job.port, "protocol": "TCP"}]
        return container
    placement = _placement(job, role)
    sizes = {k: v for k, v in (("cpu", placement.cpu), ("memory", placement.memory))
             if v is not None}
    limits = dict(sizes)
    if role is Role.WORKER and job.gpus:
        limits[GPU_RESOURCE] = str(job.gpus)
    if limits:
        container["resources"] = {"limits": limits, **({"requests": sizes} if sizes else {})}
    return container


def _job(job: KubeJob, role: Role, pods: int, container: dict) -> dict:
    pod_spec = {"restartPolicy": "Never", "containers": [container],
                # a node's environment is what we set, not one variable per Service in the namespace
                "enableServiceLinks": False, "terminationGracePeriodSeconds": 10}
    selector = _placement(job, role).node_selector
    if selector:
        pod_spec["nodeSelector"] = dict(selector)
    spec = {"backoffLimit": 0, "completions": pods, "parallelism": pods,
            "ttlSecondsAfterFinished": TTL_AFTER_FINISHED_S,
            "template": {"metadata": {"labels": _labels(job, role)}, "spec": pod_spec}}
    if role is not Role.SCHEDULER:
        spec["completionMode"] = "Indexed"
    if role is Role.WORKER and job.min_workers:
        spec.update(_elastic_workers(job))
        del spec["backoffLimit"]       # (the index's limit counts, not the Job's)
    if job.timeout_s:
        spec["activeDeadlineSeconds"] = math.ceil(job.timeout_s) + CLUSTER_DEADLINE_MARGIN_S
    name = "%s-%s" % (job.name, role.name.lower())
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": _metadata(job, name, role),
            "spec": spec}


def _elastic_workers(job: KubeJob) -> dict:
    """The workers' Job's settings for elastic workers (see the module)."""
    return {"backoffLimitPerIndex": job.max_restarts,
            "maxFailedIndexes": job.num_workers - job.min_workers,
            "podFailurePolicy": {"rules": [
                {"action": "Ignore",
                 "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]},
                {"action": "FailJob", "onExitCodes": {
                    "containerName": Role.WORKER.name.lower(), "operator": "In",
                    "values": PROGRAM_STATUSES}}]}}


def _service(job: KubeJob) -> dict:
    return {"apiVersion": "v1", "kind": "Service",
            "metadata": _metadata(job, job.scheduler_host, Role.SCHEDULER),
            "spec": {"clusterIP": "None", "publishNotReadyAddresses": True,
                     "selector": _labels(job, Role.SCHEDULER),
                     "ports": [{"name": "scheduler", "port": job.port, "targetPort": job.port,
                                "protocol": "TCP"}]}}


def render(job: KubeJob) -> List[dict]:
    """The job's Kubernetes objects: the scheduler's Service, then the scheduler's, the servers'
    and the workers' Jobs. Pure: plain dicts, ready for :func:`to_yaml`."""
    # One worker per pod, so each pod is a worker host of its own: both layouts give the same
    # counts, and --local-groups only says so (BYTEPS_LOCAL_GROUPS=1).
    num_workers, places = lay_out_workers(list(range(job.num_workers)), job.local_groups)
    pod_ip = {Env.NODE_HOST: "status.podIP"}

    def env(role, *layers, fields=pod_ip):
        extra = {}
        for layer in layers:
            extra.update(layer)
        return _env_list(role_env(role, None, num_workers, job.num_servers, job.scheduler_host,
                                  job.port, None, extra), fields)

    scheduler_env = env(Role.SCHEDULER, job.env_all,
                        fields={**pod_ip, Env.ROOT_URI: "status.podIP"})
    server_env = env(Role.SERVER, job.env_all, job.env_server, job.server_env)
    worker_fields = {**pod_ip, WORKER_ID: "metadata.annotations['%s']" % COMPLETION_INDEX}
    worker_vars = env(Role.WORKER, job.env_all, job.env_worker,
                      worker_env(places[0], job.local_groups), fields=worker_fields)
    return [_service(job),
            _job(job, Role.SCHEDULER, 1, _container(job, Role.SCHEDULER, job.scheduler_argv,
                                                    scheduler_env)),
            _job(job, Role.SERVER, job.num_servers, _container(job, Role.SERVER, job.server_argv,
                                                               server_env)),
            _job(job, Role.WORKER, job.num_workers, _container(job, Role.WORKER, job.worker_argv,
                                                               worker_vars))]


def to_yaml(objects: Sequence[dict], title: str = "kvstore-byteps job") -> str:
    """The objects as a YAML stream: a comment line, then one JSON document per object.

    JSON is YAML, so no YAML library is needed. The leading comment matters: kubectl reads a
    stream that starts with ``{`` as a JSON stream, which ``---`` separators would break.
    """
    return "# %s\n" % title + "".join(
        "---\n" + json.dumps(obj, indent=2, ensure_ascii=False) + "\n" for obj in objects)


# ------------------------------------------------------------------------------- run
class _Interrupted(Exception):
    """A stop signal arrived while the job ran."""


def _raise_interrupted(signum, _frame):
    raise _Interrupted(signum)


def run(args) -> int:
    """``--launcher kubernetes`` for a parsed command line (``cli.parse_args``): with
    ``--dry-run`` print the objects; otherwise create, follow and delete them. The exit status."""
    job = job_from_args(args)
    text = to_yaml(render(job), "kvstore-byteps job %s: a scheduler, servers: %d, workers: %d"
                   % (job.name, job.num_servers, job.num_workers))
    if args.dry_run:
        sys.stdout.write(text)
        return 0
    kubectl = Kubectl(job.namespace)
    existing = kubectl.call("look for objects of job %s" % job.name, "get", "jobs,services",
                            "-l", cluster.selector(job.name), "-o", "name").split()
    if existing:   # never follow, then delete, someone else's job of the same name
        raise LaunchError("job %s already has objects (%s): choose another --name, or delete "
                          "them with kubectl delete jobs,services -l %s"
                          % (job.name, ", ".join(existing), cluster.selector(job.name)))
    previous = {s: signal.signal(s, _raise_interrupted) for s in STOP_SIGNALS}
    streams = cluster.LogStreams(kubectl, args.log_dir)
    try:
        # create, not apply: apply would take over an unlabelled object of the same name. Not
        # cut short by a signal: an object still being created could outlive the deletion.
        with cluster.stop_signals_held():
            kubectl.call("create the job's objects", "create", "-f", "-", stdin=text)
        say("created job %s%s: Service %s; Jobs %s-scheduler, -server (%d pods), -worker (%d)"
            % (job.name, " in namespace " + job.namespace if job.namespace else "",
               job.scheduler_host, job.name, job.num_servers, job.num_workers))
        code = cluster.follow(kubectl, job.name, job.num_servers, job.num_workers, job.timeout_s,
                              streams, elastic=bool(job.min_workers))
        # the last lines of nodes that ended (a failed worker's traceback), unless time is up
        streams.close(0 if code == EXIT_TIMEOUT else cluster.LOG_DRAIN_S)
        return code
    except _Interrupted as exc:
        say("received %s; stopping the job" % signal.Signals(exc.args[0]).name)
        return 128 + exc.args[0]
    finally:
        # From here a stop signal only says that the cleanup is under way (it is bounded).
        for sig in STOP_SIGNALS:
            signal.signal(sig, lambda *_: say("deleting the job's objects first"))
        try:
            streams.close()
            cluster.delete(kubectl, job.name)
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
