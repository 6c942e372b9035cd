"""``bpslaunch``: BytePS's launch command, for jobs written for BytePS.

Run on every node with BytePS's environment, as BytePS's own ``bpslaunch``::

    DMLC_ROLE=scheduler|server|worker DMLC_NUM_WORKER=W DMLC_NUM_SERVER=S \\
    DMLC_PS_ROOT_URI=host DMLC_PS_ROOT_PORT=port [DMLC_WORKER_ID=i] bpslaunch [COMMAND ...]

* ``worker``: COMMAND runs once per local device, each process with ``BYTEPS_LOCAL_RANK`` and
  ``BYTEPS_LOCAL_SIZE``. The local size is ``BYTEPS_LOCAL_SIZE``, else the number of devices in
  ``NVIDIA_VISIBLE_DEVICES``, else 1. As in BytePS, local rank 0 is the host's worker in the
  cluster and the others reduce through it (``mxnet_patch.localgroup``): one flow per host
  (``BYTEPS_LOCAL_GROUPS=1``: ``DMLC_NUM_WORKER`` counts hosts).
* ``scheduler`` / ``server``: our scheduler or server (``DMLC_NUM_WORKER`` counts hosts).
* One worker host and no ``BYTEPS_FORCE_DISTRIBUTED`` (``1``, ``true``, ``yes`` or ``on``, as
  every flag is read; BytePS then needs no servers): the
  worker role (the default then) starts a scheduler and a server on this machine itself, so
  ``bpslaunch python train.py`` trains on one machine as it does with BytePS; the other roles
  have nothing to do.

Output lines are prefixed by node, and the first process that fails stops the others (the
launcher's job supervision, :mod:`.job`). ``bpslaunch --grace SECONDS COMMAND ...`` (ours, not
BytePS's): how long a scheduler and server that this bpslaunch started along with workers may
take to exit after those workers finished (default 30). A bpslaunch that started no workers
(the scheduler and server roles) has no such deadline: it lives as long as its node does.
"""
import os
import sys
from typing import Callable, List, Mapping, Optional, Sequence, Tuple

from ..config import Env, Role, env_flag, env_int
from ..errors import ConfigError
from ..words import count
from ..ports import free_port
from .job import Job, NodeStarter
from .plan import ProcSpec, SchedulerProgram, scheduler_argv

__all__ = ["local_size", "plan_bpslaunch", "main", "console_main"]

PROG = "bpslaunch"
#: how long a scheduler and server started with workers (one worker host) may take to exit
#: after those workers finished (``--grace``)
DEFAULT_GRACE_S = 30.0


class UsageError(Exception):
    """The environment or command line cannot start a node."""


def local_size(environ: Mapping[str, str]) -> int:
    """Processes per worker host: BYTEPS_LOCAL_SIZE, else NVIDIA_VISIBLE_DEVICES' count, else 1."""
    size = _int(environ, Env.LOCAL_SIZE, None, minimum=1)
    if size is not None:
        return size
    devices = environ.get(Env.VISIBLE_DEVICES, "").strip()
    return len(devices.split(",")) if devices else 1


def _int(environ: Mapping[str, str], name: str, default: Optional[int],
         minimum: int = 0) -> Optional[int]:
    """``name`` of ``environ`` read as Config reads it; UsageError quotes a bad value."""
    try:
        return env_int(environ, name, default, minimum)
    except ConfigError as exc:
        raise UsageError(str(exc)) from None


def _required_int(environ: Mapping[str, str], name: str, minimum: int = 0) -> int:
    value = _int(environ, name, None, minimum)
    if value is None:
        raise UsageError("%s is not set (bpslaunch reads BytePS's environment)" % name)
    return value


def single_host(environ: Mapping[str, str]) -> bool:
    """One worker host and no BYTEPS_FORCE_DISTRIBUTED: BytePS would run without servers."""
    try:
        forced = env_flag(environ, Env.FORCE_DISTRIBUTED, False)
    except ConfigError as exc:
        raise UsageError(str(exc)) from None
    return _int(environ, Env.NUM_WORKER, 1, minimum=1) == 1 and not forced


def plan_bpslaunch(environ: Mapping[str, str], command: Sequence[str],
                   python: str = sys.executable,
                   port_of: Callable[[], int] = free_port) -> Tuple[str, List[ProcSpec]]:
    """``(what, specs)``: what this node runs (a line that starts with its role), and the
    processes (each with the variables it adds to ``environ``); ``port_of()`` picks the
    scheduler's port of a one-host job."""
    role_name = environ.get(Env.ROLE, "").strip().lower()
    alone = single_host(environ)
    if not role_name and alone:
        role_name = "worker"      # one machine: the worker is the only command to run
    if role_name not in ("scheduler", "server", "worker"):
        raise UsageError("DMLC_ROLE must be scheduler, server or worker, got %r%s"
                         % (role_name, "" if role_name else " (it is unset, and the job is "
                            "distributed: DMLC_NUM_WORKER > 1 or BYTEPS_FORCE_DISTRIBUTED)"))
    role, size = Role[role_name.upper()], local_size(environ)
    title = role_name if environ.get(Env.ROLE, "").strip() else "worker (DMLC_ROLE unset)"
    if alone:
        if role is not Role.WORKER:
            return ("%s: nothing to do (one worker host and no BYTEPS_FORCE_DISTRIBUTED: that "
                    "host's bpslaunch starts a scheduler and a server)" % title), []
        return _single_host(title, size, command, python, port_of())
    hosts = _required_int(environ, Env.NUM_WORKER, minimum=1)   # a distributed job says how many
    if role is Role.SCHEDULER:
        return "%s: our scheduler, for %s" % (title, count(hosts, "worker host")), [ProcSpec(
            role, None, tuple(scheduler_argv(SchedulerProgram.BYTEPS, python)), {})]
    if role is Role.SERVER:
        return "%s: our server, for %s" % (title, count(hosts, "worker host")), [ProcSpec(
            role, None, (python, "-m", "kvstore_byteps.server"), {})]
    host = _int(environ, Env.WORKER_ID, 0)
    return "%s: %s" % (title, _describe_host(host, hosts, size)), \
        _workers(host, size, command, {})


def _workers(host: int, size: int, command: Sequence[str],
             common: Mapping[str, str]) -> List[ProcSpec]:
    """The ``size`` processes of worker host ``host``, labelled by the rank users know
    (host x local size + local rank), with their host and local rank as detail."""
    if not command:
        raise UsageError("a worker needs the command to run: bpslaunch python train.py ...")
    return [ProcSpec(Role.WORKER, host * size + local, tuple(command),
                     dict(common, **{Env.LOCAL_RANK: str(local), Env.LOCAL_SIZE: str(size),
                                     Env.WORKER_ID: str(host), Env.LOCAL_GROUPS: "1"}),
                     detail="worker host %d, local rank %d" % (host, local))
            for local in range(size)]


def _describe_host(host: int, hosts: int, size: int) -> str:
    """``worker host 1 of 2: 2 processes, ranks 2-3 of 4``: hosts and processes both, as
    DMLC_NUM_WORKER counts hosts while size() counts processes."""
    first, last = host * size, host * size + size - 1
    ranks = "rank %d" % first if size == 1 else "ranks %d-%d" % (first, last)
    processes = count(size, "process", "processes")
    return "worker host %d of %d: %s, %s of %d" % (host, hosts, processes, ranks, hosts * size)


def _single_host(title: str, size: int, command: Sequence[str], python: str, port: int):
    """Scheduler, one server and ``size`` workers on this machine, on 127.0.0.1."""
    common = {Env.NUM_WORKER: "1", Env.NUM_SERVER: "1", Env.ROOT_URI: "127.0.0.1",
              Env.ROOT_PORT: str(port), Env.NODE_HOST: "127.0.0.1"}
    workers = _workers(0, size, command, dict(common, **{Env.ROLE: "worker"}))
    specs = [ProcSpec(Role.SCHEDULER, None, tuple(scheduler_argv(SchedulerProgram.BYTEPS,
                                                                 python)),
                      dict(common, **{Env.ROLE: "scheduler"})),
             ProcSpec(Role.SERVER, 0, (python, "-m", "kvstore_byteps.server"),
                      dict(common, **{Env.ROLE: "server"}))]
    return ("%s: %s, with a scheduler and a server on this machine"
            % (title, _describe_host(0, 1, size)), specs + workers)


def split_options(argv: Sequence[str]) -> Tuple[float, List[str]]:
    """``(grace, command)`` from ``[--grace SECONDS] [--] COMMAND ...``: our one option, which
    BytePS's bpslaunch does not have (a command never starts with ``--``)."""
    argv, grace = list(argv), DEFAULT_GRACE_S
    if argv[:1] == ["--grace"]:
        text = argv[1] if len(argv) > 1 else ""
        try:
            grace = float(text)
        except ValueError:
            grace = -1.0
        if not grace >= 0:      # also NaN
            raise UsageError("--grace takes a number of seconds >= 0, got %r" % text)
        argv = argv[2:]
    return grace, argv[1:] if argv[:1] == ["--"] else argv


def main(argv: Optional[Sequence[str]] = None,
         environ: Optional[Mapping[str, str]] = None) -> int:
    """Command-line entry point; returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    environ = dict(os.environ if environ is None else environ)
    if argv[:1] in (["-h"], ["--help"]):
        print(__doc__)
        return 0
    try:
        grace, argv = split_options(argv)
        what, specs = plan_bpslaunch(environ, argv)
    except UsageError as exc:
        print("[%s] %s" % (PROG, exc), file=sys.stderr)
        return 2
    print("[%s] %s" % (PROG, what), file=sys.stderr, flush=True)
    if not specs:
        return 0
    environ.setdefault("PYTHONUNBUFFERED", "1")
    return Job(specs, starter=NodeStarter(sys.executable), grace=grace, base_env=environ).run()


def console_main() -> None:
    """The ``bpslaunch`` console script."""
    sys.exit(main())


if __name__ == "__main__":
    console_main()
