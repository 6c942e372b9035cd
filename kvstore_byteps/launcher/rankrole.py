"""Which node a process is, from the rank an engine gave it (pure: no processes, no sockets).

When Slurm's ``srun`` or ``mpirun`` starts the 1 + S + W processes of a job itself, each process
learns only its rank and the job's size from its environment. The rule is MXNet's: rank 0 is the
scheduler, ranks 1..S the servers, the rest the workers (worker rank = rank - 1 - S). Local ranks
(``BYTEPS_LOCAL_RANK`` of ``BYTEPS_LOCAL_SIZE``) number the workers on one host; they assume the
engine placed consecutive ranks on each host (Slurm's block distribution and Open MPI's
``--map-by slot``, both the defaults).
"""
import dataclasses
import re
from typing import List, Mapping, Optional, Tuple

from kvstore_byteps.config import Role

from .plan import LaunchError, node_label


@dataclasses.dataclass(frozen=True)
class EngineRank:
    """What an engine says of this process: its rank of ``size``, and its place on its host
    (``local_rank`` of ``local_size``; None where the engine does not say)."""

    engine: str
    rank: int
    size: int
    local_rank: Optional[int] = None
    local_size: Optional[int] = None


#: (engine, rank, size, local rank, local size) variables, the most specific first: mpirun under
#: Slurm sets both MPI's and Slurm's, and MPI's are the ranks of this job.
_ENGINES: Tuple[Tuple[str, str, str, str, Optional[str]], ...] = (
    ("Open MPI", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
     "OMPI_COMM_WORLD_LOCAL_SIZE"),
    ("MPICH", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"),
    ("Slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", None),
)
_COUNTS = re.compile(r"^(\d+)(?:\(x(\d+)\))?$")


def expand_counts(text: str) -> List[int]:
    """Slurm's compressed per-node counts: ``"2(x3),1"`` -> ``[2, 2, 2, 1]``."""
    counts: List[int] = []
    for part in text.split(","):
        match = _COUNTS.match(part.strip())
        if not match:
            raise LaunchError("cannot read Slurm's per-node count %r (expected e.g. '2(x3),1')"
                              % text)
        counts += [int(match.group(1))] * int(match.group(2) or 1)
    return counts


def _integer(environ: Mapping[str, str], name: str) -> int:
    try:
        return int(environ[name])
    except ValueError:
        raise LaunchError("%s=%r is not a number" % (name, environ[name])) from None


def engine_rank(environ: Mapping[str, str]) -> EngineRank:
    """This process's rank from ``environ``; LaunchError naming the variables looked for."""
    for engine, rank, size, local_rank, local_size in _ENGINES:
        if rank not in environ or size not in environ:
            continue
        local = _integer(environ, local_rank) if local_rank in environ else None
        count = _integer(environ, local_size) if local_size and local_size in environ else None
        if engine == "Slurm":
            if environ.get("SLURM_DISTRIBUTION", "block").split(":")[0] not in ("block", ""):
                raise LaunchError("srun -m %s places ranks out of order on the hosts; "
                                  "kvstore-byteps-node needs the default block distribution "
                                  "(consecutive ranks on a host)" % environ["SLURM_DISTRIBUTION"])
            per_node = environ.get("SLURM_STEP_TASKS_PER_NODE") or environ.get("SLURM_TASKS_PER_NODE")
            if per_node and "SLURM_NODEID" in environ:
                counts = expand_counts(per_node)
                node = _integer(environ, "SLURM_NODEID")
                count = counts[node] if node < len(counts) else None
        found = EngineRank(engine, _integer(environ, rank), _integer(environ, size), local, count)
        if not 0 <= found.rank < found.size:
            raise LaunchError("%s says rank %d of %d" % (engine, found.rank, found.size))
        return found
    raise LaunchError("no rank in the environment: kvstore-byteps-node runs as one task of "
                      "srun or mpirun (looked for %s)"
                      % ", ".join(rank for _, rank, _, _, _ in _ENGINES))


@dataclasses.dataclass(frozen=True)
class NodeRole:
    """The node a rank runs: its role, its rank in that role (None for the scheduler), and for a
    worker its place among the workers on its host."""

    role: Role
    rank: Optional[int]
    num_workers: int
    local_rank: int = 0
    local_size: int = 1

    @property
    def label(self) -> str:
        """``scheduler``, ``server 1``, ``worker 0``, as the launcher names nodes."""
        return node_label(self.role, self.rank)


def minimum_size(num_servers: int, num_workers: int = 1) -> int:
    """Processes a job of ``num_servers`` servers and ``num_workers`` workers needs."""
    return 1 + num_servers + num_workers


def node_role(found: EngineRank, num_servers: int, num_workers: Optional[int] = None) -> NodeRole:
    """Rank 0 the scheduler, 1..S servers, the rest workers. ``num_workers``, if given, must be
    what the size leaves; LaunchError saying how many processes the job needs otherwise."""
    workers = found.size - 1 - num_servers
    if workers < 1 or (num_workers is not None and workers != num_workers):
        wanted = minimum_size(num_servers, num_workers or 1)
        raise LaunchError(
            "%s started %d processes; 1 scheduler + %d servers + %s need %s%d (srun -n / "
            "mpirun -np)" % (found.engine, found.size, num_servers,
                             "%d workers" % num_workers if num_workers else "at least 1 worker",
                             "" if num_workers else "at least ", wanted))
    if found.rank == 0:
        return NodeRole(Role.SCHEDULER, None, workers)
    if found.rank <= num_servers:
        return NodeRole(Role.SERVER, found.rank - 1, workers)
    rank = found.rank - 1 - num_servers
    if found.local_rank is None or found.local_size is None:
        return NodeRole(Role.WORKER, rank, workers)
    # Consecutive ranks share a host: this host holds ranks first .. first + local_size - 1,
    # and its workers are those of them past the servers.
    first = found.rank - found.local_rank
    first_worker = max(first, 1 + num_servers)
    return NodeRole(Role.WORKER, rank, workers, found.rank - first_worker,
                    first + found.local_size - first_worker)
