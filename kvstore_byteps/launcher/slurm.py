"""Slurm: the allocation the launcher runs in, and every node started as a job step (``srun``).

``kvstore-byteps-launch --launcher slurm`` runs inside an allocation (``salloc``, or an ``sbatch``
script): the hosts are the allocation's nodes (``SLURM_JOB_NODELIST``, expanded by ``scontrol``),
each with as many worker slots as Slurm gave it tasks; nodes are placed as over ssh, the
scheduler on the first; each node is one job step (``srun --nodes=1 --ntasks=1 --overlap``), so
Slurm accounts for it, signals it, and cleans it up with the allocation. Addresses are the
nodes' ``NodeAddr`` (what ``scontrol show node`` says; the name itself where it says nothing).
``--launcher slurm`` runs a job so (:func:`run`).
"""
import dataclasses
import os
import shutil
import subprocess
from typing import Dict, List, Mapping, Sequence, Tuple

from ..ports import free_port
from .job import NodeStarter, guard_argv
from .plan import Host, LaunchError, ProcSpec, describe_placement
from .rankrole import expand_counts
from .runs import plan, print_dry_run, run_job, say

SCONTROL_TIMEOUT_S = 30
#: Ports derived from the job's id lie here (:func:`job_port`): below 32768, where Linux's
#: ephemeral ports begin, so no outgoing connection holds one.
JOB_PORT_BASE, JOB_PORT_SPAN = 20000, 12000


@dataclasses.dataclass(frozen=True)
class Allocation:
    """The Slurm job the launcher runs in: its id, its nodes and tasks per node."""

    job_id: str
    nodes: Tuple[str, ...]
    tasks: Tuple[int, ...]

    @property
    def total_tasks(self) -> int:
        return sum(self.tasks)


def _scontrol(*args: str) -> str:
    program = shutil.which("scontrol")
    if program is None:
        raise LaunchError("scontrol not found on PATH: --launcher slurm needs Slurm's client "
                          "commands (scontrol, srun)")
    try:
        done = subprocess.run([program, *args], stdin=subprocess.DEVNULL, capture_output=True,
                              text=True, timeout=SCONTROL_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise LaunchError("scontrol %s did not answer within %d s (is slurmctld up?)"
                          % (" ".join(args), SCONTROL_TIMEOUT_S)) from None
    if done.returncode != 0:
        raise LaunchError("scontrol %s failed: %s" % (" ".join(args), done.stderr.strip()))
    return done.stdout


def hostnames(nodelist: str) -> List[str]:
    """Slurm's compressed node list (``node[1-3,7]``) as names, by ``scontrol show hostnames``."""
    return _scontrol("show", "hostnames", nodelist).split()


def node_addresses(names: Sequence[str]) -> Dict[str, str]:
    """Each node's ``NodeAddr`` (its name where Slurm has none)."""
    addresses = {name: name for name in names}
    for line in _scontrol("show", "node", "-o", ",".join(names)).splitlines():
        fields = dict(field.split("=", 1) for field in line.split() if "=" in field)
        if fields.get("NodeName") in addresses and fields.get("NodeAddr"):
            addresses[fields["NodeName"]] = fields["NodeAddr"]
    return addresses


def allocation(environ: Mapping[str, str]) -> Allocation:
    """The allocation of ``environ`` (``SLURM_JOB_ID``, ``SLURM_JOB_NODELIST``, tasks per node);
    LaunchError saying how to get one when there is none."""
    job_id = environ.get("SLURM_JOB_ID")
    nodelist = environ.get("SLURM_JOB_NODELIST") or environ.get("SLURM_NODELIST")
    if not job_id or not nodelist:
        raise LaunchError("--launcher slurm runs inside a Slurm allocation (no SLURM_JOB_ID "
                          "here): salloc -n 1+S+W kvstore-byteps-launch --launcher slurm ..., "
                          "or in an sbatch script (docs/launching.md)")
    nodes = tuple(hostnames(nodelist))
    per_node = environ.get("SLURM_TASKS_PER_NODE")
    tasks = tuple(expand_counts(per_node)) if per_node else (1,) * len(nodes)
    if len(tasks) != len(nodes):
        raise LaunchError("SLURM_TASKS_PER_NODE=%s does not match the %d nodes of %s"
                          % (per_node, len(nodes), nodelist))
    return Allocation(job_id, nodes, tasks)


def check_size(found: Allocation, num_servers: int, num_workers: int) -> None:
    """LaunchError in one line when the allocation has fewer tasks than the job's nodes."""
    wanted = 1 + num_servers + num_workers
    if found.total_tasks < wanted:
        raise LaunchError("Slurm job %s has %d tasks; 1 scheduler + %d servers + %d workers "
                          "need %d (salloc -n %d, or #SBATCH --ntasks=%d)"
                          % (found.job_id, found.total_tasks, num_servers, num_workers, wanted,
                             wanted, wanted))


def workers_left(environ: Mapping[str, str], num_servers: int) -> int:
    """The workers ``-n`` leaves to the allocation: its tasks (``SLURM_TASKS_PER_NODE``, as
    :func:`allocation` counts them) after the scheduler and ``num_servers`` servers."""
    job_id, per_node = environ.get("SLURM_JOB_ID"), environ.get("SLURM_TASKS_PER_NODE")
    if not job_id or not per_node:
        raise LaunchError("-n/--num-workers is required outside a Slurm allocation (no "
                          "SLURM_JOB_ID or SLURM_TASKS_PER_NODE here)")
    tasks = sum(expand_counts(per_node))
    if tasks < 2 + num_servers:
        raise LaunchError("Slurm job %s has %d tasks; 1 scheduler + %d servers leave none for a "
                          "worker (salloc -n %d or more, or give -n)"
                          % (job_id, tasks, num_servers, 2 + num_servers))
    return tasks - 1 - num_servers


def hosts_of(found: Allocation, addresses: Mapping[str, str]) -> List[Host]:
    """The allocation's nodes as launcher hosts: each node's address, as many worker slots as
    it has tasks."""
    return [Host(addresses.get(name, name), slots=count)
            for name, count in zip(found.nodes, found.tasks)]


def job_port(environ: Mapping[str, str]) -> int:
    """A scheduler port every task of one job step derives alike, without talking: from the
    job's and the step's ids (``--port`` chooses one instead)."""
    job = int(environ.get("SLURM_JOB_ID", "0") or 0)
    step = int(environ.get("SLURM_STEP_ID", "0") or 0)
    return JOB_PORT_BASE + (job * 97 + step) % JOB_PORT_SPAN


class SrunStarter(NodeStarter):
    """Starts each node as a one-task job step on its node of the allocation, under the guard
    (its standard input is srun's, so the launcher's pipe still reaches it)."""

    def __init__(self, nodes: Sequence[str], python: str, srun_args: Sequence[str] = ()):
        super().__init__(python)
        self.nodes, self.srun_args = list(nodes), list(srun_args)
        self.srun = shutil.which("srun")
        if self.srun is None:
            raise LaunchError("srun not found on PATH: --launcher slurm needs Slurm's client "
                              "commands")

    def command(self, spec: ProcSpec, base_env: Mapping[str, str]) -> Tuple[List[str], Dict[str, str]]:
        # --overlap: steps share the allocation's CPUs (a scheduler and servers need little);
        # --kill-on-bad-exit: the step's task failing ends the step, and so srun.
        srun = [self.srun, "--nodes=1", "--ntasks=1", "--nodelist=" + self.nodes[spec.host],
                "--overlap", "--kill-on-bad-exit=1", "--quiet",
                "--job-name=kvstore-byteps-" + spec.label.replace(" ", "-")] + self.srun_args
        return srun + guard_argv(self.python, spec.argv), {**base_env, **spec.env}

    def where(self, spec: ProcSpec) -> str:
        return "Slurm node " + self.nodes[spec.host]


def run(args) -> int:
    """Every node a job step on the allocation's nodes, placed as over ssh."""
    found = allocation(os.environ)
    check_size(found, args.num_servers, args.num_workers)
    hosts = hosts_of(found, node_addresses(found.nodes))
    # On the scheduler's node (an sbatch script) a port free now; elsewhere (salloc on a login
    # node) one derived from the job's id.
    on_first = os.environ.get("SLURMD_NODENAME") == found.nodes[0]
    port = args.port or (free_port("") if on_first else job_port(os.environ))
    specs = plan(args, hosts, port)
    if args.dry_run:
        print_dry_run(specs, hosts)
        return 0
    starter = SrunStarter(found.nodes, args.python, args.srun_args)
    say("Slurm job %s: %d tasks on %s; scheduler on %s:%d; %s"
        % (found.job_id, found.total_tasks, ",".join(found.nodes), hosts[0].address, port,
           "; ".join(describe_placement(specs, hosts))))
    return run_job(args, specs, starter)
