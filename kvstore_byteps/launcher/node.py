"""``kvstore-byteps-node``: one process of a job that ``srun`` or ``mpirun`` started, all 1 + S + W.

    srun -n 6 --kill-on-bad-exit=1 kvstore-byteps-node -s 2 python train.py
    mpirun -np 6 kvstore-byteps-node -s 2 --root-uri host1 --port 9091 python train.py

Each process takes its role from its rank (rank 0 the scheduler, 1..S the servers, the rest the
workers, as MXNet's launcher numbers them: :mod:`.rankrole`), sets the DMLC environment the
launcher would set, and runs the scheduler, its server, or the worker's command. Under Slurm the
scheduler's address is the first node of the step (``scontrol``'s ``NodeAddr``) and its port is
derived from the job's and step's ids unless ``--port`` says; under MPI ``--root-uri`` (the host
that runs rank 0) and ``--port`` are needed (``--launcher mpi`` passes both). A node that
fails says which node it was; the exit status is the node's.
"""
import argparse
import os
import shlex
import signal
import subprocess
import sys
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

from kvstore_byteps.config import Env, Role

from . import slurm
from .guard import Guard
from .job import READER_JOIN_S, OutputCopy
from .plan import (LaunchError, SchedulerProgram, ServerProgram, WorkerPlace, parse_env_options,
                   role_env, scheduler_argv, server_program, worker_command, worker_env)
from .procs import EXIT_CANNOT_START, die_with_parent
from .rankrole import EngineRank, NodeRole, engine_rank, node_role

PROG = "kvstore-byteps-node"
EXIT_USAGE = 2


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="\n\n".join(__doc__.split("\n\n")[1:]))
    p.add_argument("-s", "--num-servers", type=int, required=True)
    p.add_argument("-n", "--num-workers", type=int,
                   help="check that the engine started exactly 1 + S + N processes")
    p.add_argument("--root-uri", metavar="HOST", help="the scheduler's address: the host of "
                   "rank 0 (default under Slurm: the step's first node)")
    p.add_argument("--port", type=int, default=0, help="the scheduler's port (default under "
                   "Slurm: one derived from the job's id)")
    p.add_argument("--node-host", metavar="HOST", help="the address every node announces "
                   "(default under Slurm: its node's NodeAddr; else ps-lite's rule: "
                   "DMLC_INTERFACE or the first non-loopback interface)")
    p.add_argument("--python", default=sys.executable,
                   help="the Python that runs the scheduler and servers (default: this one)")
    p.add_argument("--scheduler", choices=[x.value for x in SchedulerProgram],
                   default=SchedulerProgram.BYTEPS.value)
    p.add_argument("--server", choices=[x.value for x in ServerProgram],
                   default=ServerProgram.BYTEPS.value)
    p.add_argument("--scheduler-cmd", type=shlex.split, metavar="'CMD ARGS'")
    p.add_argument("--server-cmd", type=shlex.split, metavar="'CMD ARGS'")
    for option, whom in (("--env", "every node"), ("--env-server", "servers"),
                         ("--env-worker", "workers")):
        p.add_argument(option, action="append", default=[], metavar="NAME[:=]VALUE|NAME",
                       help="set a variable in %s (repeatable)" % whom)
    p.add_argument("--no-prefix", action="store_true",
                   help="leave the node's output lines as they are (default: prefixed with "
                        "[scheduler], [server 1], [worker 0], as the launcher does)")
    p.add_argument("command", nargs=argparse.REMAINDER, metavar="CMD")
    return p


def _say(text: str) -> None:
    print("[%s] %s" % (PROG, text), file=sys.stderr, flush=True)


def _addresses(args, found: EngineRank, environ: Mapping[str, str]) -> Tuple[str, Optional[str]]:
    """The scheduler's address and this node's (None: ps-lite's rule picks it): the options',
    else under Slurm the NodeAddr of the step's first node and of this one (one scontrol
    question for both)."""
    root_uri, node_host = args.root_uri, args.node_host
    nodelist = environ.get("SLURM_STEP_NODELIST") or environ.get("SLURM_JOB_NODELIST")
    first = slurm.hostnames(nodelist)[0] if not root_uri and found.engine == "Slurm" \
        and nodelist else None
    mine = environ.get("SLURMD_NODENAME") if not node_host else None
    wanted = [name for name in (first, mine) if name]
    addresses = slurm.node_addresses(wanted) if wanted else {}
    root_uri = root_uri or addresses.get(first)
    if not root_uri:
        raise LaunchError("%s gives no scheduler address: pass --root-uri HOST (the host that "
                          "runs rank 0) and --port PORT" % found.engine)
    return root_uri, node_host or addresses.get(mine)


def _port(args, found: EngineRank, environ: Mapping[str, str]) -> int:
    if args.port:
        return args.port
    if found.engine == "Slurm" and "SLURM_JOB_ID" in environ:
        return slurm.job_port(environ)
    raise LaunchError("%s gives no scheduler port: pass --port PORT" % found.engine)


def node_environment(args, place: NodeRole, root_uri: str, port: int,
                     node_host: Optional[str], environ: Mapping[str, str]) -> Dict[str, str]:
    """The variables this node adds to its environment (what the launcher would give it)."""
    layers = [parse_env_options(args.env, environ, "--env")]
    if place.role is Role.SERVER:
        layers.append(parse_env_options(args.env_server, environ, "--env-server"))
        layers.append(server_program(ServerProgram(args.server), args.python)[1])
    if place.role is Role.WORKER:
        layers.append(parse_env_options(args.env_worker, environ, "--env-worker"))
        layers.append(worker_env(WorkerPlace(place.rank, place.rank, place.local_rank,
                                             place.local_size), False))
    extra: Dict[str, str] = {}
    for layer in layers:
        extra.update(layer)
    return role_env(place.role, place.rank, place.num_workers, args.num_servers, root_uri, port,
                    node_host, extra)


def node_argv(args, place: NodeRole) -> List[str]:
    """What this node runs."""
    if place.role is Role.SCHEDULER:
        return args.scheduler_cmd or scheduler_argv(SchedulerProgram(args.scheduler), args.python)
    if place.role is Role.SERVER:
        return args.server_cmd or server_program(ServerProgram(args.server), args.python)[0]
    return args.command


def main(argv: Optional[Sequence[str]] = None, environ: Optional[Mapping[str, str]] = None) -> int:
    """Entry point; returns the node's exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    environ = os.environ if environ is None else environ
    args.command = worker_command(parser, args.command)
    if args.num_servers < 1 or (args.num_workers is not None and args.num_workers < 1):
        parser.error("-s and -n need at least 1")
    found = None
    try:
        found = engine_rank(environ)
        place = node_role(found, args.num_servers, args.num_workers)
        root_uri, node_host = _addresses(args, found, environ)
        port = _port(args, found, environ)
        env = node_environment(args, place, root_uri, port, node_host, environ)
    except LaunchError as exc:
        # Every task finds the same problem: one line (rank 0's) says it for the whole job.
        if found is None or found.rank == 0:
            _say(str(exc))
        return EXIT_USAGE
    # Whatever started us (mpirun, orted, slurmstepd) may be killed before it stops its ranks:
    # its death stops this node too (the guard passes the SIGTERM on to the node's group).
    die_with_parent(signal.SIGTERM, os.getppid())
    where = "%s rank %d of %d" % (found.engine, found.rank, found.size)
    if place.role is Role.SCHEDULER:
        _say("%s: the scheduler, at %s:%d; %d servers, %d workers"
             % (where, root_uri, port, args.num_servers, place.num_workers))
    command = node_argv(args, place)
    try:
        guard = Guard(command, env={**environ, **env},
                      output=None if args.no_prefix else subprocess.PIPE)
    except OSError as exc:
        _say("%s (%s) cannot start %s: %s" % (place.label, where, command[0], exc))
        return EXIT_CANNOT_START
    copies = [] if args.no_prefix else [
        OutputCopy(guard.proc.stdout, "[%s] " % place.label, sys.stdout.buffer, None),
        OutputCopy(guard.proc.stderr, "[%s] " % place.label, sys.stderr.buffer, None)]
    code = guard.run(None)
    for copy in copies:  # a grandchild holding the pipes open must not keep us here
        copy.thread.join(READER_JOIN_S)
    if code != 0 and guard.signalled is None:
        _say("%s (%s, on %s) exited with code %d"
             % (place.label, where, env.get(Env.NODE_HOST) or os.uname().nodename, code))
    return code


def console_main() -> None:
    """The ``kvstore-byteps-node`` console script."""
    sys.exit(main())


if __name__ == "__main__":
    console_main()
