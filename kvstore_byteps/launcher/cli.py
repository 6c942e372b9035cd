"""Start a parameter-server job: one scheduler, S servers and N workers running CMD.

    kvstore-byteps-launch -n 2 -s 2 python train.py --kvstore dist_byteps
    kvstore-byteps-launch --launcher ssh -H hosts.txt -n 4 -s 4 python train.py
    kvstore-byteps-launch --launcher netns --link-rate 1gbit -n 4 -s 4 python train.py
    salloc -n 9 kvstore-byteps-launch --launcher slurm -n 4 -s 4 python train.py
    kvstore-byteps-launch --launcher mpi [-H hosts] -n 4 -s 4 python train.py
    kvstore-byteps-launch --launcher kubernetes --image IMAGE -n 4 -s 4 [--dry-run] python train.py

(``python launch.py ...`` from a checkout is the same program.) Every node gets the DMLC
environment that ps-lite, MXNet and BytePS read; workers get their rank as ``DMLC_WORKER_ID``
and their place on their host as ``BYTEPS_LOCAL_RANK`` of ``BYTEPS_LOCAL_SIZE`` (what the
BytePS and Horovod APIs' local_rank() and local_size() say). ``DMLC_NUM_WORKER`` counts
processes, as with MXNet's launcher; with ``--local-groups`` it counts hosts, as with BytePS.
Output lines are prefixed ``[scheduler]``, ``[server 1]``, ``[worker 0]`` (the rank). The first
node that fails stops the whole job and its exit status becomes the launcher's; so do Ctrl-C,
SIGTERM and ``--timeout``. Nodes never outlive the launcher, even one killed with SIGKILL.
"""
import argparse
import os
import shlex
import signal
import sys
from typing import Optional, Sequence

from ..config import Env
from . import local, mpi, netns, slurm, ssh
from .job import EXIT_SPAWN_FAILED, STOP_SIGNALS
from .plan import (Launcher, LaunchError, SchedulerProgram, ServerProgram, parse_env_options,
                   worker_command)
from .runs import say

PROG = "kvstore-byteps-launch"
DEFAULT_LINK_RATE = "1gbit"


class _Stopped(Exception):
    """A stop signal arrived while the network or the preflight was being set up."""


def _positive(kind):
    def parse(text):
        value = kind(text)
        if value <= 0:
            raise argparse.ArgumentTypeError("expected a positive number, got %r" % text)
        return value
    parse.__name__ = kind.__name__  # argparse names the type in its "invalid int value" message
    return parse


def _gpus(text):
    if ":" in text:   # no role prefix, unlike --cpu and --memory
        raise argparse.ArgumentTypeError("%r: GPUs are for workers only; give a number, e.g. "
                                         "--gpus 1" % text)
    return _positive(int)(text)


_gpus.__name__ = "int"  # argparse's "invalid int value" for a word


def _nonnegative_float(text):
    value = float(text)
    if value < 0:
        raise argparse.ArgumentTypeError("expected a non-negative number, got %r" % text)
    return value


def _port(text):
    value = int(text)
    if not 0 <= value < 65536:
        raise argparse.ArgumentTypeError("expected a port in 0-65535, got %r" % text)
    return value


def build_parser() -> argparse.ArgumentParser:
    """The command line (MXNet's tools/launch.py spellings where they exist)."""
    p = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="\n\n".join(__doc__.split("\n\n")[1:]))
    for add_options in (_add_job_options, _add_host_options, _add_engine_options,
                        _add_kubernetes_options, _add_program_options, _add_environment_options,
                        _add_run_options):
        add_options(p)
    return p


def _add_job_options(p: argparse.ArgumentParser) -> None:
    """The job's size and its launcher."""
    p.add_argument("-n", "--num-workers", type=_positive(int),
                   help="number of workers (required, but with --launcher slurm and -s: the "
                        "allocation's tasks after the scheduler and the servers)")
    p.add_argument("-s", "--num-servers", type=_positive(int),
                   help="number of servers (default: as many as workers, as MXNet's launcher)")
    p.add_argument("--launcher", choices=[x.value for x in Launcher], default=Launcher.LOCAL.value,
                   help="local: this machine, 127.0.0.1 (default); ssh: the hosts of -H; netns: "
                        "an emulated cluster of network namespaces with shaped links (root); "
                        "slurm: job steps inside a Slurm allocation (salloc, sbatch); mpi: one "
                        "mpirun (-H: an MPI hostfile); kubernetes: a Service and Indexed Jobs, "
                        "applied with kubectl (--dry-run prints them)")


def _add_host_options(p: argparse.ArgumentParser) -> None:
    """The hosts, the scheduler's place and port, what runs on them (ssh)."""
    p.add_argument("-H", "--hostfile", help="ssh, mpi: hosts, one per line: [user@]host[:ssh_port] "
                                            "[slots=N]")
    p.add_argument("--scheduler-host", metavar="HOST",
                   help="ssh: the hostfile entry (name or 0-based index) that runs the scheduler "
                        "(default: the first)")
    p.add_argument("--port", type=_port, default=0,
                   help="the scheduler's port (default: a free one)")
    p.add_argument("--python", default=sys.executable,
                   help="ssh: the Python that runs our nodes on the hosts (default: this one's "
                        "path); its bin directory also goes first on the workers' PATH")
    p.add_argument("--workdir", default=os.getcwd(),
                   help="ssh: the directory the nodes run in (default: the current one)")
    p.add_argument("--ssh-args", type=shlex.split, default=[], metavar="'ARGS'",
                   help="ssh: extra (shell-quoted) ssh options, e.g. '-i key -F config'")


def _add_engine_options(p: argparse.ArgumentParser) -> None:
    """The netns, slurm and mpi engines' own options."""
    p.add_argument("--hosts", type=_positive(int), metavar="N",
                   help="netns: number of hosts (default: one per node); nodes are placed as "
                        "over ssh")
    p.add_argument("--link-rate", default=DEFAULT_LINK_RATE, metavar="RATE",
                   help="netns: every host's link rate in each direction, e.g. 1gbit, 100mbit; "
                        "'none' leaves links unshaped (default %s)" % DEFAULT_LINK_RATE)
    p.add_argument("--srun-args", type=shlex.split, default=[], metavar="'ARGS'",
                   help="slurm: extra (shell-quoted) srun options for every node's job step")
    p.add_argument("--mpirun", metavar="PROGRAM",
                   help="mpi: the MPI starter (default: mpirun, else mpiexec, on PATH)")
    p.add_argument("--mpirun-args", type=shlex.split, default=[], metavar="'ARGS'",
                   help="mpi: extra (shell-quoted) options for mpirun, e.g. '--mca btl_tcp_if_include eth0'")


def _add_kubernetes_options(p: argparse.ArgumentParser) -> None:
    """The kubernetes engine's objects and their placement."""
    p.add_argument("--image", help="kubernetes: the container image every node runs (it has "
                                   "kvstore-byteps and the training script; see docker/Dockerfile)")
    p.add_argument("--name", help="kubernetes: the job's name, prefix of its objects' names "
                                  "(default: kvstore-byteps-<random>)")
    p.add_argument("--namespace", help="kubernetes: the namespace (default: kubectl's)")
    # --node-selector, --cpu, --memory: [server:|worker:]VALUE, checked by _check_kubernetes
    p.add_argument("--cpu", action="append", default=[], metavar="[ROLE:]N",
                   help="kubernetes: CPU request and limit of each server and worker container, "
                        "e.g. 4 or 3500m; server:N or worker:N for that role only (repeatable)")
    p.add_argument("--memory", action="append", default=[], metavar="[ROLE:]SIZE",
                   help="kubernetes: memory request and limit of each server and worker "
                        "container, e.g. 16Gi; server:SIZE or worker:SIZE for that role only "
                        "(repeatable)")
    p.add_argument("--gpus", type=_gpus, metavar="N",
                   help="kubernetes: GPUs (nvidia.com/gpu) for each worker container")
    p.add_argument("--node-selector", action="append", default=[], metavar="[ROLE:]LABEL=VALUE",
                   help="kubernetes: run pods only on nodes with this label; server:LABEL=VALUE "
                        "or worker:LABEL=VALUE for that role's pods only (the scheduler's go "
                        "with the servers') (repeatable)")


def _add_program_options(p: argparse.ArgumentParser) -> None:
    """The scheduler's and the servers' programs."""
    p.add_argument("--scheduler", choices=[x.value for x in SchedulerProgram],
                   default=SchedulerProgram.BYTEPS.value, help="scheduler program (default byteps)")
    p.add_argument("--server", choices=[x.value for x in ServerProgram],
                   default=ServerProgram.BYTEPS.value,
                   help="server program: byteps (ours, default; it also serves unmodified "
                        "dist_sync workers), mxnet (MXNet's C++ server), byteps-knob (MXNet "
                        "process running ours)")
    p.add_argument("--scheduler-cmd", type=shlex.split, metavar="'CMD ARGS'",
                   help="run this shell-quoted command as the scheduler instead")
    p.add_argument("--server-cmd", type=shlex.split, metavar="'CMD ARGS'",
                   help="run this shell-quoted command as each server instead "
                        "(the --server choice's environment still applies)")


def _add_environment_options(p: argparse.ArgumentParser) -> None:
    """What the nodes' environments get."""
    p.add_argument("--env", action="append", default=[], metavar="NAME[:=]VALUE|NAME",
                   help="set a variable in every node; NAME alone passes this shell's value "
                        "(repeatable)")
    p.add_argument("--env-server", action="append", default=[], metavar="NAME[:=]VALUE|NAME",
                   help="as --env, for servers only")
    p.add_argument("--env-worker", action="append", default=[], metavar="NAME[:=]VALUE|NAME",
                   help="as --env, for workers only")
    p.add_argument("--p3", action="store_true",
                   help="use the P3 van on every node (DMLC_PS_VAN_TYPE=p3), as MXNet's "
                        "launcher's --p3 does")
    p.add_argument("--local-groups", action="store_true",
                   help="for BytePS/Horovod-API scripts: lay workers out as bpslaunch does "
                        "(DMLC_NUM_WORKER counts worker hosts, DMLC_WORKER_ID numbers them; "
                        "local rank 0 of each host is its worker in the cluster and the host's "
                        "other processes reduce through it: one flow per host); every worker "
                        "host needs the same number of workers, and a script that creates its "
                        "own dist_byteps store is refused on local ranks > 0. Default: every "
                        "process is a worker of its own")


def _add_run_options(p: argparse.ArgumentParser) -> None:
    """How the job runs: logs, time limits, a dry run, the workers' command."""
    p.add_argument("--log-dir", metavar="DIR",
                   help="also write each node's output to DIR/scheduler.log, "
                        "DIR/server-<rank>.log and DIR/worker-<rank>.log")
    p.add_argument("--timeout", type=_positive(float), metavar="SECONDS",
                   help="stop everything and fail after this long")
    p.add_argument("--grace", type=_nonnegative_float, default=30.0, metavar="SECONDS",
                   help="how long scheduler and servers may take to exit after the workers")
    p.add_argument("--min-workers", type=_positive(int), metavar="N",
                   help="elastic workers (local, ssh, netns, kubernetes): a worker that is "
                        "lost (killed by a signal, crashed) leaves the job, which goes on "
                        "while at least N workers are left; a worker's own exit status still "
                        "ends the job (sets BYTEPS_MIN_WORKERS on every node; docs/usage.md)")
    p.add_argument("--max-restarts", type=_positive(int), default=0, metavar="K",
                   help="with --min-workers: a lost worker is started again, at most K times, "
                        "and takes its place back at the others' next State.commit() "
                        "(kvstore_byteps.elastic; docs/usage.md)")
    p.add_argument("--max-workers", type=_positive(int), default=0, metavar="M",
                   help="with --min-workers: the job grows to M workers: workers started by "
                        "hand (the command is printed) take the seats beyond -n and join at "
                        "the others' next State.commit() (sets BYTEPS_MAX_WORKERS)")
    p.add_argument("--dry-run", action="store_true", help="print the nodes, start none")
    p.add_argument("command", nargs=argparse.REMAINDER, metavar="CMD",
                   help="the worker program and its arguments")


def parse_args(argv: Optional[Sequence[str]] = None,
               environ: Optional[dict] = None) -> argparse.Namespace:
    """Parse and check the command line; exit with a usage error on bad input."""
    p = build_parser()
    args = p.parse_args(argv)
    environ = os.environ if environ is None else environ
    args.command = worker_command(p, args.command)
    if args.num_workers is None:
        if args.launcher != Launcher.SLURM.value or args.num_servers is None:
            p.error("the following arguments are required: -n/--num-workers")
        try:
            args.num_workers = slurm.workers_left(environ, args.num_servers)
        except LaunchError as exc:
            p.error(str(exc))
    if args.num_servers is None:
        args.num_servers = args.num_workers
    args.launcher = Launcher(args.launcher)
    try:
        args.env_all = parse_env_options(args.env, environ, "--env")
        if args.p3:
            args.env_all.setdefault(Env.VAN_TYPE, "p3")
        args.env_server = parse_env_options(args.env_server, environ, "--env-server")
        args.env_worker = parse_env_options(args.env_worker, environ, "--env-worker")
        args.rate = None
        if args.launcher is Launcher.NETNS and args.link_rate.lower() != "none":
            args.rate = netns.parse_rate(args.link_rate)
    except LaunchError as exc:
        p.error(str(exc))
    k8s = (Launcher.KUBERNETES,)
    for option, needs in (("hostfile", (Launcher.SSH, Launcher.MPI)),
                          ("scheduler_host", (Launcher.SSH,)), ("hosts", (Launcher.NETNS,)),
                          ("srun_args", (Launcher.SLURM,)), ("mpirun", (Launcher.MPI,)),
                          ("mpirun_args", (Launcher.MPI,)), ("image", k8s), ("name", k8s),
                          ("namespace", k8s), ("cpu", k8s), ("memory", k8s), ("gpus", k8s),
                          ("node_selector", k8s)):
        if getattr(args, option) not in (None, []) and args.launcher not in needs:
            p.error("--%s is for --launcher %s" % (option.replace("_", "-"),
                                                   " or ".join(x.value for x in needs)))
    if args.launcher is Launcher.MPI and args.local_groups:
        p.error("--local-groups is not for --launcher mpi (MPI places the ranks; use "
                "--launcher slurm or ssh)")
    if args.launcher is Launcher.KUBERNETES and not args.image:
        p.error("--launcher kubernetes needs --image IMAGE (one with kvstore-byteps and the "
                "training script; docker/Dockerfile builds one)")
    if args.launcher is Launcher.KUBERNETES:
        _check_kubernetes(p, args)
    if args.launcher is Launcher.SSH and not args.hostfile:
        p.error("--launcher ssh needs -H HOSTFILE (one host per line: [user@]host[:port] [slots=N])")
    _check_auth(p, args, environ)
    _check_elastic(p, args, environ)
    return args


def _check_elastic(p: argparse.ArgumentParser, args: argparse.Namespace, environ) -> None:
    """--min-workers (or BYTEPS_MIN_WORKERS given to the nodes): the nodes get it, the job's
    supervision follows it; only where this launcher supervises each worker's process."""
    given = args.min_workers or args.env_all.get(Env.MIN_WORKERS) or environ.get(Env.MIN_WORKERS)
    named = "--min-workers" if args.min_workers else Env.MIN_WORKERS + "="
    try:
        args.min_workers = int(given or 0)
    except ValueError:
        p.error("%s=%r is not a number of workers" % (Env.MIN_WORKERS, given))
    if not args.min_workers:
        if args.max_restarts:
            p.error("--max-restarts restarts the lost workers of an elastic job: give "
                    "--min-workers too")
        if args.max_workers:
            p.error("--max-workers grows an elastic job: give --min-workers too")
        return
    if args.max_workers and args.max_workers < args.num_workers:
        p.error("--max-workers %d is fewer than the job's %d workers"
                % (args.max_workers, args.num_workers))
    if args.min_workers > args.num_workers:
        p.error("%s%d is more than the job's %d workers"
                % (named if named.endswith("=") else named + " ", args.min_workers,
                   args.num_workers))
    if args.local_groups:
        p.error("--min-workers (elastic workers) does not take --local-groups yet: run one "
                "process a worker")
    supervised = (Launcher.LOCAL, Launcher.SSH, Launcher.NETNS, Launcher.KUBERNETES)
    if args.launcher not in supervised:
        p.error("--min-workers (elastic workers) is for --launcher %s: %s ends the whole job "
                "when one worker's process ends" % (", ".join(x.value for x in supervised),
                                                    args.launcher.value))
    if args.launcher is Launcher.KUBERNETES and args.max_workers:
        p.error("--max-workers is not for --launcher kubernetes (a worker starts by hand into "
                "the job): its workers' Job has -n pods; --max-restarts restarts them")
    args.env_all[Env.MIN_WORKERS] = str(args.min_workers)
    if args.max_workers > args.num_workers:
        args.env_all[Env.MAX_WORKERS] = str(args.max_workers)


def _check_kubernetes(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """A --name, --namespace, --cpu, ... that Kubernetes would refuse, or an unknown role
    prefix (server:, worker:), is a usage error."""
    from . import kubernetes  # only this launcher needs it
    try:
        kubernetes.job_from_args(args)
    except LaunchError as exc:
        p.error(str(exc))


def _check_auth(p: argparse.ArgumentParser, args: argparse.Namespace, environ) -> None:
    """BYTEPS_AUTH_KEY needs our scheduler and servers; over ssh the key is better in a file."""
    names = (Env.AUTH_KEY, Env.AUTH_KEY_FILE)
    given = [n for n in names if environ.get(n) or n in args.env_all or n in args.env_server]
    if not given:
        return
    if args.scheduler == SchedulerProgram.MXNET.value or args.server == ServerProgram.MXNET.value:
        p.error("%s is set, but MXNet's own scheduler and server cannot authenticate: use "
                "--scheduler byteps and --server byteps or byteps-knob (the defaults)" % given[0])
    passed = [n for n in (Env.AUTH_KEY,) if n in args.env_all or n in args.env_server
              or n in args.env_worker]
    if args.launcher is Launcher.SSH and passed:
        print("launch.py: warning: --env %s puts the key on the ssh command line, where other "
              "users of the remote hosts can see it (ps); prefer %s=PATH to a file (mode 600) "
              "on every host" % (Env.AUTH_KEY, Env.AUTH_KEY_FILE), file=sys.stderr)


def _engine(launcher: Launcher):
    """The module of ``launcher``'s engine: its ``run(args)`` owns the job's run."""
    if launcher is Launcher.KUBERNETES:
        from . import kubernetes  # only this launcher needs it
        return kubernetes
    return {Launcher.LOCAL: local, Launcher.NETNS: netns, Launcher.SSH: ssh,
            Launcher.SLURM: slurm, Launcher.MPI: mpi}[launcher]


def _raise_stopped(signum, _frame):
    raise _Stopped(signal.Signals(signum).name)


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Command-line entry point; returns the exit status."""
    args = parse_args(argv)
    run = _engine(args.launcher).run
    # Until the job supervises (it handles these itself), a stop signal unwinds set-up cleanly,
    # so a network half made is still removed.
    previous = {s: signal.signal(s, _raise_stopped) for s in STOP_SIGNALS}
    try:
        return run(args)
    except LaunchError as exc:
        say(str(exc))
        return EXIT_SPAWN_FAILED
    except _Stopped as exc:
        say("received %s during set-up; stopped" % exc)
        return 128 + signal.Signals[str(exc)].value
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def console_main() -> None:
    """The ``kvstore-byteps-launch`` console script."""
    sys.exit(main())


if __name__ == "__main__":
    console_main()
