"""What every launcher engine's run does with the parsed command line (``cli.parse_args``):
plan the nodes it asks for on the engine's hosts, list them for ``--dry-run``, say what the
launcher does, and run the job under supervision."""
import shlex
import sys
from typing import List, Sequence

from ..config import Env, Role
from .job import Job, NodeStarter
from .plan import (Host, JobShape, LaunchError, ProcSpec, SchedulerProgram, ServerProgram,
                   parse_hostfile, plan_job, scheduler_argv, server_program)


def plan(args, hosts: Sequence[Host], root_port: int, scheduler_host: int = 0,
         first_host: int = 0) -> List[ProcSpec]:
    """The nodes the parsed command line asks for, on ``hosts``."""
    server_argv, server_env = server_program(ServerProgram(args.server), args.python)
    shape = JobShape(args.num_workers, args.num_servers, tuple(hosts), root_port,
                     scheduler_host, first_host, args.local_groups)
    return plan_job(shape, args.command,
                    scheduler_cmd=args.scheduler_cmd or scheduler_argv(
                        SchedulerProgram(args.scheduler), args.python),
                    server_cmd=args.server_cmd or server_argv, server_env=server_env,
                    env_all=args.env_all, env_server=args.env_server, env_worker=args.env_worker)


def print_dry_run(specs: Sequence[ProcSpec], hosts: Sequence[Host]) -> None:
    for spec in specs:
        assignments = " ".join("%s=%s" % (k, shlex.quote(v)) for k, v in sorted(spec.env.items()))
        print("[%s] on %s: %s %s" % (spec.label, hosts[spec.host].name, assignments,
                                     shlex.join(spec.argv)))


def say(text: str) -> None:
    print("[launch] " + text, file=sys.stderr, flush=True)


def join_command(specs: Sequence[ProcSpec], rank: int) -> str:
    """The shell command that starts one more worker, of rank ``rank``, into the job of
    ``specs`` (a growing elastic job, ``--max-workers``): the last worker's settings but its
    rank and local place."""
    last = [spec for spec in specs if spec.role is Role.WORKER][-1]
    env = {k: v for k, v in last.env.items() if not k.startswith("BYTEPS_LOCAL_")}
    env[Env.WORKER_ID] = str(rank)
    return " ".join(["%s=%s" % (k, shlex.quote(v)) for k, v in sorted(env.items())]
                    + [shlex.join(last.argv)])


def run_job(args, specs, starter: NodeStarter) -> int:
    grows = getattr(args, "max_workers", 0) or 0
    if grows > args.num_workers:
        say("the job grows to %d workers (--max-workers): start one more, on this machine "
            "or a host of the job, with: %s" % (grows, join_command(specs, args.num_workers)))
    return Job(specs, starter=starter, timeout=args.timeout, grace=args.grace,
               log_dir=args.log_dir, min_workers=getattr(args, "min_workers", 0),
               max_restarts=getattr(args, "max_restarts", 0) or 0).run()


def read_hostfile(path: str) -> List[Host]:
    try:
        with open(path) as f:
            text = f.read()
    except OSError as exc:
        raise LaunchError("cannot read hostfile %s: %s" % (path, exc.strerror)) from None
    return parse_hostfile(text, path)
