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
from typing import List, Optional, Sequence

import kvstore_byteps

from ..config import Env, Role
from ..ports import free_port
from . import mpi, netns, slurm, ssh
from .job import EXIT_SPAWN_FAILED, STOP_SIGNALS, Job, NodeStarter
from .plan import (JobShape, Launcher, LaunchError, ProcSpec, SchedulerProgram, ServerProgram,
                   LOCALHOST, describe_placement, local_hosts, parse_env_options, parse_hostfile,
                   plan_job, scheduler_argv, server_program, worker_command, Host)

PROG = "kvstore-byteps-launch"
#: The scheduler's port inside an emulated network (fresh namespaces: nothing else is bound there).
NETNS_ROOT_PORT = 9091
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
    p.add_argument("--log-dir", metavar="DIR",
                   help="also write each node's output to DIR/scheduler.log, "
                        "DIR/server-<rank>.log and DIR/worker-<rank>.log")
    p.add_argument("--timeout", type=_positive(float), metavar="SECONDS",
                   help="stop everything and fail after this long")
    p.add_argument("--grace", type=_nonnegative_float, default=30.0, metavar="SECONDS",
                   help="how long scheduler and servers may take to exit after the workers")
    p.add_argument("--dry-run", action="store_true", help="print the nodes, start none")
    p.add_argument("command", nargs=argparse.REMAINDER, metavar="CMD",
                   help="the worker program and its arguments")
    return p


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
    return args


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


def _read_hostfile(path: str) -> List[Host]:
    try:
        with open(path) as f:
            text = f.read()
    except OSError as exc:
        raise LaunchError("cannot read hostfile %s: %s" % (path, exc.strerror)) from None
    return parse_hostfile(text, path)


def _scheduler_index(hosts: Sequence[Host], wanted: Optional[str]) -> int:
    if wanted is None:
        return 0
    if wanted.isdigit() and int(wanted) < len(hosts):
        return int(wanted)
    names = [h.name for h in hosts] + [h.address for h in hosts]
    if wanted in names:
        return names.index(wanted) % len(hosts)
    raise LaunchError("--scheduler-host %s is not in the hostfile (%s)"
                      % (wanted, ", ".join(h.name for h in hosts)))


def plan(args: argparse.Namespace, hosts: Sequence[Host], root_port: int,
         scheduler_host: int = 0, first_host: int = 0) -> List[ProcSpec]:
    """The nodes the parsed command line asks for, on ``hosts``."""
    server_argv, server_env = server_program(ServerProgram(args.server), args.python)
    shape = JobShape(args.num_workers, args.num_servers, tuple(hosts), root_port,
                     scheduler_host, first_host, args.local_groups)
    return plan_job(shape, args.command,
                    scheduler_cmd=args.scheduler_cmd or scheduler_argv(
                        SchedulerProgram(args.scheduler), args.python),
                    server_cmd=args.server_cmd or server_argv, server_env=server_env,
                    env_all=args.env_all, env_server=args.env_server, env_worker=args.env_worker)


def _print_dry_run(specs: Sequence[ProcSpec], hosts: Sequence[Host]) -> None:
    for spec in specs:
        assignments = " ".join("%s=%s" % (k, shlex.quote(v)) for k, v in sorted(spec.env.items()))
        print("[%s] on %s: %s %s" % (spec.label, hosts[spec.host].name, assignments,
                                     shlex.join(spec.argv)))


def _say(text: str) -> None:
    print("[launch] " + text, file=sys.stderr, flush=True)


def _run_job(args, specs, starter: NodeStarter) -> int:
    return Job(specs, starter=starter, timeout=args.timeout, grace=args.grace,
               log_dir=args.log_dir).run()


def run_local(args) -> int:
    """All nodes on this machine, on 127.0.0.1."""
    hosts = local_hosts()
    specs = plan(args, hosts, args.port or free_port())
    if args.dry_run:
        _print_dry_run(specs, hosts)
        return 0
    return _run_job(args, specs, NodeStarter(args.python))


def run_netns(args) -> int:
    """Every host a network namespace on one bridge, links shaped to --link-rate."""
    num_nodes = 1 + args.num_servers + args.num_workers
    count = args.hosts or num_nodes
    # With a host per node the scheduler gets host 0 to itself; otherwise place as over ssh.
    first = 1 if count == num_nodes else 0
    hosts = [Host(netns.EmulatedNetwork.address(i)) for i in range(count)]
    specs = plan(args, hosts, args.port or NETNS_ROOT_PORT, 0, first)
    if args.dry_run:
        _print_dry_run(specs, hosts)
        return 0
    net = netns.EmulatedNetwork(count, args.rate)
    try:
        net.create()
        _say("emulated network: %d hosts on %s links, 198.18.0.1-%d; %s"
             % (count, netns.describe_rate(args.rate) if args.rate else "unshaped", count,
                "; ".join(describe_placement(specs, hosts))))
        return _run_job(args, specs, netns.NetnsStarter(net, args.python))
    finally:
        net.destroy()


def run_ssh(args) -> int:
    """Nodes on the hostfile's hosts over ssh, after a preflight of every host."""
    hosts = _read_hostfile(args.hostfile)
    sched = _scheduler_index(hosts, args.scheduler_host)
    if args.dry_run:
        _print_dry_run(plan(args, hosts, args.port or NETNS_ROOT_PORT, sched), hosts)
        return 0
    port = ssh.preflight(hosts, args.python, args.workdir, kvstore_byteps.__version__, sched,
                         args.port, args.ssh_args)
    specs = plan(args, hosts, port, sched)
    _say("%d hosts passed the preflight; scheduler on %s:%d; %s"
         % (len(hosts), hosts[sched].address, port, "; ".join(describe_placement(specs, hosts))))
    return _run_job(args, specs, ssh.SshStarter(hosts, args.python, args.workdir, args.ssh_args))


def run_slurm(args) -> int:
    """Every node a job step on the allocation's nodes, placed as over ssh."""
    found = slurm.allocation(os.environ)
    slurm.check_size(found, args.num_servers, args.num_workers)
    hosts = slurm.hosts_of(found, slurm.node_addresses(found.nodes))
    # On the scheduler's node (an sbatch script) a port free now; elsewhere (salloc on a login
    # node) one derived from the job's id.
    on_first = os.environ.get("SLURMD_NODENAME") == found.nodes[0]
    port = args.port or (free_port("") if on_first else slurm.job_port(os.environ))
    specs = plan(args, hosts, port)
    if args.dry_run:
        _print_dry_run(specs, hosts)
        return 0
    starter = slurm.SrunStarter(found.nodes, args.python, args.srun_args)
    _say("Slurm job %s: %d tasks on %s; scheduler on %s:%d; %s"
         % (found.job_id, found.total_tasks, ",".join(found.nodes), hosts[0].address, port,
            "; ".join(describe_placement(specs, hosts))))
    return _run_job(args, specs, starter)


def run_mpi(args) -> int:
    """One mpirun of 1 + S + W ranks; each rank's kvstore-byteps-node takes its role."""
    starter = mpi.find_starter(args.mpirun)
    kind = mpi.flavor(starter)
    hosts = _read_hostfile(args.hostfile) if args.hostfile else None
    root = hosts[0].address if hosts else LOCALHOST
    port = args.port or free_port("" if hosts else LOCALHOST)
    options = ["--scheduler", args.scheduler, "--server", args.server]
    if args.scheduler_cmd:
        options += ["--scheduler-cmd", shlex.join(args.scheduler_cmd)]
    if args.server_cmd:
        options += ["--server-cmd", shlex.join(args.server_cmd)]
    for option, values in (("--env-server", args.env_server), ("--env-worker", args.env_worker)):
        for name, value in values.items():
            options += [option, "%s=%s" % (name, value)]
    node = mpi.node_command(args.python, args.num_servers, args.num_workers, root, port,
                            args.command, None if hosts else LOCALHOST, options)
    env = dict(args.env_all, PYTHONUNBUFFERED="1")
    argv = mpi.mpirun_argv(starter, kind, 1 + args.num_servers + args.num_workers, node,
                           mpi.exported_names(os.environ, env), args.hostfile, args.mpirun_args,
                           mpi.is_root())
    if args.dry_run:
        print(" ".join("%s=%s" % (k, shlex.quote(v)) for k, v in sorted(env.items())),
              shlex.join(argv))
        return 0
    _say("%s: %d ranks (rank 0 the scheduler on %s:%d, 1-%d servers, the rest workers)"
         % (kind.value, 1 + args.num_servers + args.num_workers, root, port, args.num_servers))
    spec = ProcSpec(Role.WORKER, None, tuple(argv), env, title="mpirun", prefixed=False)
    return _run_job(args, [spec], NodeStarter(args.python))


def run_kubernetes(args) -> int:
    """The job as Kubernetes objects, applied with kubectl and followed (:mod:`.kubernetes`)."""
    from . import kubernetes  # only this launcher needs it
    return kubernetes.run(args)


def _raise_stopped(signum, _frame):
    raise _Stopped(signal.Signals(signum).name)


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Command-line entry point; returns the exit status."""
    args = parse_args(argv)
    run = {Launcher.LOCAL: run_local, Launcher.NETNS: run_netns, Launcher.SSH: run_ssh,
           Launcher.SLURM: run_slurm, Launcher.MPI: run_mpi,
           Launcher.KUBERNETES: run_kubernetes}[args.launcher]
    # Until the job supervises (it handles these itself), a stop signal unwinds set-up cleanly,
    # so a network half made is still removed.
    previous = {s: signal.signal(s, _raise_stopped) for s in STOP_SIGNALS}
    try:
        return run(args)
    except LaunchError as exc:
        _say(str(exc))
        return EXIT_SPAWN_FAILED
    except _Stopped as exc:
        _say("received %s during set-up; stopped" % exc)
        return 128 + signal.Signals[str(exc)].value
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def console_main() -> None:
    """The ``kvstore-byteps-launch`` console script."""
    sys.exit(main())


if __name__ == "__main__":
    console_main()
