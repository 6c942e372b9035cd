"""What a job is, before anything starts: hosts, placement, and each node's environment. Pure.

The conventions are MXNet's (``tools/launch.py`` and dmlc's ssh tracker) where they exist:
servers, then workers, placed round-robin over the hosts of a hostfile; ``--env NAME:VALUE``;
``-s`` defaults to ``-n``. A worker's ``DMLC_WORKER_ID`` is its rank: our scheduler honours it
(BytePS reads it as the rank too), so the ``[worker R]`` output prefix is the rank the worker gets.
Every worker also gets its place on its host (``BYTEPS_LOCAL_RANK`` of ``BYTEPS_LOCAL_SIZE``), and
``BYTEPS_LOCAL_GROUPS`` says what ``DMLC_NUM_WORKER`` counts (:func:`lay_out_workers`).
"""
import collections
import dataclasses
import enum
import re
import sys
from typing import Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

from kvstore_byteps.config import Env, Role, ServerKind

#: BytePS's name for a worker's rank, set by the launcher.
WORKER_ID = Env.WORKER_ID
LOCALHOST = "127.0.0.1"
DEFAULT_SSH_PORT = 22
#: Variables the launcher sets itself; ``--env`` may not override them.
RESERVED = (Env.ROLE, Env.NUM_WORKER, Env.NUM_SERVER, Env.ROOT_URI, Env.ROOT_PORT,
            Env.NODE_HOST, WORKER_ID, Env.LOCAL_RANK, Env.LOCAL_SIZE, Env.LOCAL_GROUPS)
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_HOST = re.compile(r"^[A-Za-z0-9_.@\-:]+$")


class LaunchError(Exception):
    """The launcher cannot do what was asked (a bad option or hostfile, a node that won't start)."""


class Launcher(enum.Enum):
    """Where the nodes run."""

    LOCAL = "local"   # processes on this machine, 127.0.0.1
    SSH = "ssh"       # processes on the hosts of a hostfile, started over ssh
    NETNS = "netns"   # processes on this machine, each host a network namespace on a shaped link
    SLURM = "slurm"   # inside a Slurm allocation: every node a job step (srun) on the allocation's nodes
    MPI = "mpi"       # every node a rank of one mpirun; roles from MPI ranks (rankrole)
    KUBERNETES = "kubernetes"  # core Kubernetes objects (Service, Indexed Jobs), applied with kubectl


class SchedulerProgram(enum.Enum):
    """Which program the scheduler runs."""

    BYTEPS = "byteps"
    MXNET = "mxnet"


class ServerProgram(enum.Enum):
    """Which program each server runs: a process of ours, or MXNet's server process, which runs
    the :class:`ServerKind` its knob (``MXNET_KVSTORE_SERVER``) names."""

    BYTEPS = "byteps"            # our server, without MXNet
    MXNET = "mxnet"              # upstream MXNet's C++ server
    BYTEPS_KNOB = "byteps-knob"  # `import mxnet` with MXNET_KVSTORE_SERVER=byteps: our server via the hook


@dataclasses.dataclass(frozen=True)
class Host:
    """One line of a hostfile: where to ssh (``user@name``, port) and how many workers fit."""

    name: str
    ssh_port: int = DEFAULT_SSH_PORT
    slots: Optional[int] = None

    @property
    def address(self) -> str:
        """The address nodes on this host announce and connect to (the name without ``user@``)."""
        return self.name.rsplit("@", 1)[-1]


@dataclasses.dataclass(frozen=True)
class ProcSpec:
    """One node to start: role, rank, the host index it runs on, argv, its own variables, and
    a detail that messages about it add to its label (e.g. its host and local rank)."""

    role: Role
    rank: Optional[int]
    argv: Tuple[str, ...]
    env: Mapping[str, str]
    host: int = 0
    detail: str = ""
    #: what messages call it, when it is not one node (e.g. ``mpirun``, which starts them all)
    title: str = ""
    #: whether the launcher prefixes its output lines with ``[label]`` (mpirun's nodes do that
    #: themselves)
    prefixed: bool = True

    @property
    def label(self) -> str:
        """``scheduler``, ``server 1``, ``worker 0``: how messages and output prefixes name it."""
        return self.title or node_label(self.role, self.rank)


def node_label(role: Role, rank: Optional[int]) -> str:
    """``scheduler``, ``server 1``, ``worker 0``: how every launcher names a node."""
    name = role.name.lower()
    return name if rank is None else "%s %d" % (name, rank)


def worker_command(parser, command: Sequence[str]) -> List[str]:
    """The worker's program from the command line's remainder (a leading ``--`` dropped);
    ``parser`` exits with a usage error when there is none."""
    command = list(command[1:] if command[:1] == ["--"] else command)
    if not command:
        parser.error("missing CMD: the program each worker runs")
    return command


def scheduler_argv(program: SchedulerProgram, python: str = sys.executable) -> List[str]:
    """The scheduler's command line for ``program``."""
    if program is SchedulerProgram.BYTEPS:
        return [python, "-m", "kvstore_byteps.scheduler"]
    return [python, "-c", "import mxnet"]


def server_program(program: ServerProgram,
                   python: str = sys.executable) -> Tuple[List[str], Dict[str, str]]:
    """A server's command line and the extra variables that select its implementation."""
    if program is ServerProgram.BYTEPS:
        return [python, "-m", "kvstore_byteps.server"], {}
    # Set the knob either way so a stray MXNET_KVSTORE_SERVER in our environment can't flip it.
    kind = ServerKind.BYTEPS if program is ServerProgram.BYTEPS_KNOB else ServerKind.MXNET
    return [python, "-c", "import mxnet"], {Env.KVSTORE_SERVER: kind.value}


# ---------------------------------------------------------------------------------- --env
def parse_env_options(options: Sequence[str], environ: Mapping[str, str],
                      option: str = "--env") -> Dict[str, str]:
    """``NAME=VALUE``, ``NAME:VALUE`` (MXNet's spelling) or ``NAME`` (pass this launcher's value).

    Whichever of ``=`` and ``:`` comes first separates name and value, so ``PATH=/a:/b`` and
    ``OMP_NUM_THREADS:3`` both do what they say. Raises LaunchError naming the option on a bad name,
    a reserved name, or a pass-through of a variable the launcher does not have.
    """
    result = {}
    for text in options:
        cut = min((i for i in (text.find("="), text.find(":")) if i >= 0), default=-1)
        name, value = (text, None) if cut < 0 else (text[:cut], text[cut + 1:])
        if not _ENV_NAME.match(name):
            raise LaunchError("%s %r: expected NAME=VALUE, NAME:VALUE or NAME" % (option, text))
        if name in RESERVED:
            raise LaunchError("%s %r: %s is set by the launcher" % (option, text, name))
        if value is None:
            if name not in environ:
                raise LaunchError("%s %s: passes this launcher's %s through, but it is not set"
                                  % (option, name, name))
            value = environ[name]
        result[name] = value
    return result


# ------------------------------------------------------------------------------ hostfiles
def parse_hostfile(text: str, source: str = "hostfile") -> List[Host]:
    """Hosts from a hostfile: one per line, ``[user@]host[:ssh_port] [slots=N]``; ``#`` comments.

    Raises LaunchError naming the file and line of the first bad line, or an empty file.
    """
    hosts = []
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        where = "%s line %d (%r)" % (source, number, raw.strip())
        fields = line.split()
        name, port = _split_host_port(fields[0], where)
        slots = None
        for extra in fields[1:]:
            key, sep, value = extra.partition("=")
            if key not in ("slots", "max_slots") or not sep or not value.isdigit() or int(value) < 1:
                raise LaunchError("%s: expected 'host[:port] [slots=N]' with N >= 1, got %r"
                                  % (where, extra))
            slots = int(value)
        hosts.append(Host(name, port, slots))
    if not hosts:
        raise LaunchError("%s names no hosts (one per line: host[:ssh_port] [slots=N])" % source)
    return hosts


def _split_host_port(field: str, where: str) -> Tuple[str, int]:
    """``name``, ``name:port``, ``user@name:port``, ``[ipv6]:port``."""
    if field.startswith("["):
        close = field.find("]")
        name, rest = field[1:close], field[close + 1:] if close > 0 else ""
        port = rest[1:] if rest.startswith(":") else ("!" if rest or close < 0 else "")
    else:
        name, _, port = field.partition(":")
    if not name or not _HOST.match(name):
        raise LaunchError("%s: %r is not a host name" % (where, name))
    if port and (not port.isdigit() or not 0 < int(port) < 65536):
        raise LaunchError("%s: ssh port %r is not a number in 1-65535" % (where, port))
    return name, int(port) if port else DEFAULT_SSH_PORT


def place_nodes(hosts: Sequence[Host], num_servers: int, num_workers: int,
                scheduler_host: int = 0, first_host: int = 0) -> Tuple[int, List[int], List[int]]:
    """Host indices for the scheduler, each server and each worker.

    As MXNet's ssh launcher: node i of (servers, then workers) goes to host
    ``(first_host + i) % len(hosts)``. A host with ``slots`` takes at most that many workers; the
    next host with room takes the rest.
    """
    if not 0 <= scheduler_host < len(hosts):
        raise LaunchError("scheduler host %d: the hostfile has %d hosts" % (scheduler_host, len(hosts)))
    servers = [(first_host + i) % len(hosts) for i in range(num_servers)]
    capacity = sum(h.slots for h in hosts if h.slots is not None)
    if all(h.slots is not None for h in hosts) and capacity < num_workers:
        raise LaunchError("%d workers do not fit in the hostfile's %d slots" % (num_workers, capacity))
    used = [0] * len(hosts)
    workers, candidate = [], first_host + num_servers
    for _ in range(num_workers):
        while hosts[candidate % len(hosts)].slots is not None and \
                used[candidate % len(hosts)] >= hosts[candidate % len(hosts)].slots:
            candidate += 1
        index = candidate % len(hosts)
        used[index] += 1
        workers.append(index)
        candidate += 1
    return scheduler_host, servers, workers


# ---------------------------------------------------------------------- worker layout
@dataclasses.dataclass(frozen=True)
class WorkerPlace:
    """A worker's numbers: its rank (the output prefix), ``DMLC_WORKER_ID``, and its local rank
    and size on its host."""

    rank: int
    worker_id: int
    local_rank: int
    local_size: int


def lay_out_workers(worker_hosts: Sequence[int],
                    local_groups: bool = False) -> Tuple[int, List[WorkerPlace]]:
    """``(DMLC_NUM_WORKER, places)`` of workers placed on ``worker_hosts`` (a host index per
    worker, in placement order). Local ranks number each host's workers in that order.

    * per process (default, MXNet's meaning): ``DMLC_NUM_WORKER`` counts processes and each
      worker's ``DMLC_WORKER_ID`` is its rank, its place in the placement order;
    * ``local_groups`` (BytePS's meaning, as ``bpslaunch``): ``DMLC_NUM_WORKER`` counts the
      hosts with workers, numbered (``DMLC_WORKER_ID``) in the order of their first worker, and
      rank = worker id x local size + local rank. Every such host must hold the same number of
      workers (BytePS's size() is hosts x local size): LaunchError otherwise.
    """
    sizes = collections.Counter(worker_hosts)
    seen: Dict[int, int] = collections.Counter()
    local_ranks = []
    for host in worker_hosts:
        local_ranks.append(seen[host])
        seen[host] += 1
    if not local_groups:
        return len(worker_hosts), [WorkerPlace(i, i, local, sizes[host]) for i, (host, local)
                                   in enumerate(zip(worker_hosts, local_ranks))]
    hosts = list(dict.fromkeys(worker_hosts))
    if len(set(sizes.values())) > 1:
        raise LaunchError("--local-groups needs the same number of workers on every worker "
                          "host (BytePS's size() is hosts x local size); the placement gives "
                          "%s" % ", ".join("host %d: %d" % (h, sizes[h]) for h in hosts))
    size = sizes[hosts[0]] if hosts else 1
    return len(hosts), [WorkerPlace(hosts.index(host) * size + local, hosts.index(host), local,
                                    size) for host, local in zip(worker_hosts, local_ranks)]


def worker_env(place: WorkerPlace, local_groups: bool) -> Dict[str, str]:
    """The variables a worker gets for its place (besides :func:`role_env`'s)."""
    return {Env.LOCAL_RANK: str(place.local_rank), Env.LOCAL_SIZE: str(place.local_size),
            Env.LOCAL_GROUPS: "1" if local_groups else "0"}


# ------------------------------------------------------------------------- environments
def role_env(role: Role, rank: Optional[int], num_workers: int, num_servers: int,
             root_uri: str, root_port: int, node_host: Optional[str],
             extra: Optional[Mapping[str, str]] = None) -> Dict[str, str]:
    """The variables one node gets on top of its inherited environment."""
    env = dict(extra or {})
    # Unbuffered Python children, so prefixed lines appear as they happen (unless the user chose).
    env.setdefault("PYTHONUNBUFFERED", "1")
    env.update({
        Env.ROLE: role.name.lower(),
        Env.NUM_WORKER: str(num_workers),
        Env.NUM_SERVER: str(num_servers),
        Env.ROOT_URI: root_uri,
        Env.ROOT_PORT: str(root_port),
    })
    if node_host is not None:
        env[Env.NODE_HOST] = node_host
    if role is Role.WORKER:
        env[WORKER_ID] = str(rank)
    return env


@dataclasses.dataclass(frozen=True)
class JobShape:
    """The cluster: sizes, hosts (each with the address its nodes announce) and the root port."""

    num_workers: int
    num_servers: int
    hosts: Tuple[Host, ...]
    root_port: int
    scheduler_host: int = 0
    first_host: int = 0  # where the first server goes (1: the scheduler gets a host of its own)
    #: lay workers out as bpslaunch does (DMLC_NUM_WORKER counts hosts): :func:`lay_out_workers`
    local_groups: bool = False


def plan_job(shape: JobShape, worker_argv: Sequence[str], scheduler_cmd: Sequence[str],
             server_cmd: Sequence[str], server_env: Optional[Mapping[str, str]] = None,
             env_all: Optional[Mapping[str, str]] = None,
             env_server: Optional[Mapping[str, str]] = None,
             env_worker: Optional[Mapping[str, str]] = None) -> List[ProcSpec]:
    """Every node of the job, scheduler first, then servers, then workers by rank, each on its
    host."""
    sched_host, server_hosts, worker_hosts = place_nodes(
        shape.hosts, shape.num_servers, shape.num_workers, shape.scheduler_host, shape.first_host)
    num_workers, places = lay_out_workers(worker_hosts, shape.local_groups)
    root_uri = shape.hosts[sched_host].address

    def spec(role, rank, host, argv, *layers, worker_id=None, detail=""):
        extra = {}
        for layer in layers:
            extra.update(layer or {})
        env = role_env(role, rank if worker_id is None else worker_id, num_workers,
                       shape.num_servers, root_uri, shape.root_port, shape.hosts[host].address,
                       extra)
        return ProcSpec(role, rank, tuple(argv), env, host, detail)

    specs = [spec(Role.SCHEDULER, None, sched_host, scheduler_cmd, env_all)]
    specs += [spec(Role.SERVER, i, h, server_cmd, env_all, env_server, server_env)
              for i, h in enumerate(server_hosts)]
    workers = sorted(zip(places, worker_hosts), key=lambda pair: pair[0].rank)
    specs += [spec(Role.WORKER, p.rank, h, worker_argv, env_all, env_worker,
                   worker_env(p, shape.local_groups), worker_id=p.worker_id,
                   detail="worker host %d, local rank %d" % (p.worker_id, p.local_rank)
                   if shape.local_groups else "")
              for p, h in workers]
    return specs


def local_hosts(count: int = 1, address: str = LOCALHOST) -> Tuple[Host, ...]:
    """``count`` hosts that are all this machine (the local launcher)."""
    return tuple(Host(address) for _ in range(count))


def describe_placement(specs: Iterable[ProcSpec], hosts: Sequence[Host]) -> List[str]:
    """One line per host: which nodes run there (printed by ``--dry-run`` and at start-up)."""
    by_host: Dict[int, List[str]] = {}
    for spec in specs:
        by_host.setdefault(spec.host, []).append(spec.label)
    return ["%s: %s" % (hosts[i].name, ", ".join(labels)) for i, labels in sorted(by_host.items())]
