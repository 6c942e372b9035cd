"""MPI as the process starter: one ``mpirun`` of 1 + S + W ranks, each running ``kvstore-byteps-node``.

As MXNet's own launcher, MPI only starts the processes (no MPI library is linked): each rank
takes its role from its MPI rank (:mod:`.rankrole`), rank 0 being the scheduler on the first
host of the hostfile (this machine, 127.0.0.1, without one). Open MPI's ``mpirun`` and MPICH's
(Hydra) ``mpiexec`` are told apart by their ``--version``. ``--launcher mpi`` runs a job so
(:func:`run`).
"""
import enum
import os
import shlex
import shutil
import subprocess
from typing import List, Mapping, Optional, Sequence

from kvstore_byteps.config import Role

from ..ports import free_port
from .job import NodeStarter
from .plan import LOCALHOST, LaunchError, ProcSpec
from .runs import read_hostfile, run_job, say

VERSION_TIMEOUT_S = 20
NODE_MODULE = "kvstore_byteps.launcher.node"


class Flavor(enum.Enum):
    """Which MPI's starter: their options differ."""

    OPEN_MPI = "Open MPI"
    MPICH = "MPICH"


def find_starter(wanted: Optional[str]) -> str:
    """``wanted`` (a path or a name on PATH), else mpirun, else mpiexec."""
    for name in ([wanted] if wanted else ["mpirun", "mpiexec"]):
        found = shutil.which(name)
        if found:
            return found
    missing = "%s not found" % wanted if wanted else "neither mpirun nor mpiexec was found"
    raise LaunchError("%s on PATH: --launcher mpi needs an MPI's starter (Debian: apt-get "
                      "install openmpi-bin)" % missing)


def flavor_of(version_text: str) -> Optional[Flavor]:
    """The MPI that printed ``version_text`` (``mpirun --version``), or None."""
    text = version_text.lower()
    if "open mpi" in text or "open-mpi" in text or "openrte" in text:
        return Flavor.OPEN_MPI
    if "hydra" in text or "mpich" in text:
        return Flavor.MPICH
    return None


def flavor(starter: str) -> Flavor:
    """Ask ``starter --version``; LaunchError if it is neither Open MPI's nor MPICH's."""
    try:
        done = subprocess.run([starter, "--version"], stdin=subprocess.DEVNULL,
                              capture_output=True, text=True, timeout=VERSION_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise LaunchError("cannot ask %s --version: %s" % (starter, exc)) from None
    found = flavor_of(done.stdout + done.stderr)
    if found is None:
        raise LaunchError("%s is neither Open MPI's mpirun nor MPICH's mpiexec (its --version "
                          "says %r); pass one with --mpirun" % (starter, done.stdout.strip()[:80]))
    return found


def mpirun_argv(starter: str, kind: Flavor, num_procs: int, node_argv: Sequence[str],
                exported: Sequence[str], hostfile: Optional[str] = None,
                extra: Sequence[str] = (), as_root: bool = False) -> List[str]:
    """The whole command line: ``num_procs`` ranks of ``node_argv``, variables ``exported``
    to every rank (their values are the starter's own environment's: never on the command
    line, where ``ps`` shows them)."""
    argv = [starter, "-np", str(num_procs)]
    if kind is Flavor.OPEN_MPI:
        if as_root:
            argv.append("--allow-run-as-root")  # Open MPI refuses root without it
        if hostfile:
            argv += ["--hostfile", hostfile]
        else:
            # One machine: all ranks here even past its cores (the nodes mostly wait).
            argv += ["--host", "localhost:%d" % num_procs]
        for name in exported:
            argv += ["-x", name]
    else:
        if hostfile:
            argv += ["-f", hostfile]
        if exported:
            argv += ["-genvlist", ",".join(exported)]
    return argv + list(extra) + list(node_argv)


def node_command(python: str, num_servers: int, num_workers: int, root_uri: str, port: int,
                 command: Sequence[str], node_host: Optional[str] = None,
                 options: Sequence[str] = ()) -> List[str]:
    """What every rank runs: ``kvstore-byteps-node`` with the job's shape and address."""
    argv = [python, "-m", NODE_MODULE, "-s", str(num_servers), "-n", str(num_workers),
            "--root-uri", root_uri, "--port", str(port), "--python", python]
    if node_host:
        argv += ["--node-host", node_host]
    return argv + list(options) + ["--"] + list(command)


def exported_names(environ: Mapping[str, str], env_all: Mapping[str, str]) -> List[str]:
    """Variables every rank needs from the starter: ``--env``'s, and those a Python program's
    behaviour here depends on (PATH, PYTHONPATH, the virtualenv)."""
    names = list(env_all)
    names += [n for n in ("PATH", "PYTHONPATH", "VIRTUAL_ENV", "LD_LIBRARY_PATH")
              if n in environ and n not in names]
    return names


def is_root() -> bool:
    return os.geteuid() == 0


def run(args) -> int:
    """One mpirun of 1 + S + W ranks; each rank's kvstore-byteps-node takes its role."""
    starter = find_starter(args.mpirun)
    kind = flavor(starter)
    hosts = read_hostfile(args.hostfile) if args.hostfile else None
    root = hosts[0].address if hosts else LOCALHOST
    port = args.port or free_port("" if hosts else LOCALHOST)
    node = node_command(args.python, args.num_servers, args.num_workers, root, port,
                        args.command, None if hosts else LOCALHOST, _node_options(args))
    env = dict(args.env_all, PYTHONUNBUFFERED="1")
    argv = mpirun_argv(starter, kind, 1 + args.num_servers + args.num_workers, node,
                       exported_names(os.environ, env), args.hostfile, args.mpirun_args,
                       is_root())
    if args.dry_run:
        print(" ".join("%s=%s" % (k, shlex.quote(v)) for k, v in sorted(env.items())),
              shlex.join(argv))
        return 0
    say("%s: %d ranks (rank 0 the scheduler on %s:%d, 1-%d servers, the rest workers)"
        % (kind.value, 1 + args.num_servers + args.num_workers, root, port, args.num_servers))
    spec = ProcSpec(Role.WORKER, None, tuple(argv), env, title="mpirun", prefixed=False)
    return run_job(args, [spec], NodeStarter(args.python))


def _node_options(args) -> List[str]:
    """The launcher's options every rank's kvstore-byteps-node passes on to its node."""
    options = ["--scheduler", args.scheduler, "--server", args.server]
    if args.scheduler_cmd:
        options += ["--scheduler-cmd", shlex.join(args.scheduler_cmd)]
    if args.server_cmd:
        options += ["--server-cmd", shlex.join(args.server_cmd)]
    for option, values in (("--env-server", args.env_server), ("--env-worker", args.env_worker)):
        for name, value in values.items():
            options += [option, "%s=%s" % (name, value)]
    return options
