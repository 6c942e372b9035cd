"""Nodes on remote hosts: the ssh command line of each node, and the preflight run before any starts.

Each node is ``ssh [options] host 'exec env DMLC_...=... PYTHON -m kvstore_byteps.launcher.guard
--cwd DIR -- CMD'``: no terminal, BatchMode (a password prompt would hang), keep-alives so a dead
host is noticed. The remote guard watches the ssh channel: when the launcher or its ssh client dies,
sshd closes the channel and the guard stops the node's whole process group on that host.
``--launcher ssh`` runs a job so (:func:`run`).
"""
import concurrent.futures
import os
import shlex
import subprocess
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

import kvstore_byteps

from .job import NodeStarter, guard_argv
from .netns import NETNS_ROOT_PORT
from .plan import Host, LaunchError, ProcSpec, describe_placement
from .runs import plan, print_dry_run, read_hostfile, run_job, say

CONNECT_TIMEOUT_S = 10
#: The preflight command itself may take this long on top of the connection (a cold Python import).
PREFLIGHT_TIMEOUT_S = CONNECT_TIMEOUT_S + 50
PREFLIGHT_OK = "kvstore-byteps-preflight"

# Runs on each host: prints the project's version, whether the directory exists, and (on the
# scheduler's host) binds the scheduler's port, or picks a free one for port 0.
_PREFLIGHT = """
import os, socket, sys
try:
    import kvstore_byteps
    version = kvstore_byteps.__version__
except Exception as exc:
    print("%s import-error %s" % (sys.argv[1], repr(exc).replace(chr(10), " "))); sys.exit(0)
port = "-"
if sys.argv[3] != "-":
    s = socket.socket()
    try:
        s.bind(("", int(sys.argv[3]))); port = str(s.getsockname()[1])
    except OSError as exc:
        port = "busy:" + exc.strerror.replace(" ", "_")
    finally:
        s.close()
print(sys.argv[1], "ok", version, int(os.path.isdir(sys.argv[2])), port)
"""


def ssh_base(host: Host, ssh_args: Sequence[str] = ()) -> List[str]:
    """``ssh`` with our options up to and including the destination."""
    return (["ssh", "-T", "-o", "BatchMode=yes", "-o", "ConnectTimeout=%d" % CONNECT_TIMEOUT_S,
             "-o", "ServerAliveInterval=5", "-o", "ServerAliveCountMax=3",
             "-p", str(host.ssh_port)] + list(ssh_args) + [host.name])


def remote_command(argv: Sequence[str], env: Mapping[str, str]) -> str:
    """One shell line that runs ``argv`` with ``env`` added (quoted for the remote shell)."""
    assignments = ["%s=%s" % (k, v) for k, v in sorted(env.items())]
    return "exec env " + shlex.join(assignments + list(argv))


class SshStarter(NodeStarter):
    """Starts each node on its host through ssh, under the guard, in ``workdir``."""

    def __init__(self, hosts: Sequence[Host], python: str, workdir: str,
                 ssh_args: Sequence[str] = ()):
        super().__init__(python)
        self.hosts, self.workdir, self.ssh_args = list(hosts), workdir, list(ssh_args)

    def command(self, spec: ProcSpec, base_env: Mapping[str, str]) -> Tuple[List[str], Dict[str, str]]:
        node = guard_argv(self.python, spec.argv, cwd=self.workdir,
                          path_prepend=os.path.dirname(self.python))
        return (ssh_base(self.hosts[spec.host], self.ssh_args) + [remote_command(node, spec.env)],
                dict(base_env))

    def where(self, spec: ProcSpec) -> str:
        return self.hosts[spec.host].name


def preflight(hosts: Sequence[Host], python: str, workdir: str, version: str,
              scheduler_host: int, scheduler_port: int, ssh_args: Sequence[str] = ()) -> int:
    """Check every host before anything starts; return the scheduler's port.

    Each host must answer ssh in BatchMode, import kvstore_byteps at ``version`` with ``python``,
    and have ``workdir``; the scheduler's host must have ``scheduler_port`` free (0: it picks one).
    Raises LaunchError with one line per failing host.
    """
    def check(index: int) -> Tuple[Optional[str], Optional[int]]:
        host = hosts[index]
        port_arg = str(scheduler_port) if index == scheduler_host else "-"
        argv = ssh_base(host, ssh_args) + [shlex.join([python, "-c", _PREFLIGHT, PREFLIGHT_OK,
                                                       workdir, port_arg])]
        try:
            done = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True, timeout=PREFLIGHT_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            return "%s: no answer within %d s (ssh -p %d %s)" % (
                host.name, PREFLIGHT_TIMEOUT_S, host.ssh_port, host.name), None
        return _judge(host, done, python, workdir, version, port_arg)

    with concurrent.futures.ThreadPoolExecutor(max_workers=min(16, len(hosts))) as pool:
        results = list(pool.map(check, range(len(hosts))))
    problems = [problem for problem, _ in results if problem]
    if problems:
        raise LaunchError("preflight failed on %d of %d hosts:\n  %s"
                          % (len(problems), len(hosts), "\n  ".join(problems)))
    return results[scheduler_host][1]


def _judge(host: Host, done: subprocess.CompletedProcess, python: str, workdir: str,
           version: str, port_arg: str) -> Tuple[Optional[str], Optional[int]]:
    """(problem or None, the scheduler port or None) from one host's preflight answer."""
    last_err = (done.stderr.strip().splitlines() or [""])[-1]
    if done.returncode == 255:
        return "%s: not reachable with ssh in BatchMode (port %d): %s" % (
            host.name, host.ssh_port, last_err or "ssh failed"), None
    words = next((line.split() for line in done.stdout.splitlines()
                  if line.startswith(PREFLIGHT_OK)), None)
    if done.returncode != 0 or not words:
        return "%s: cannot run %s there (exit %d): %s" % (
            host.name, python, done.returncode, last_err or "no output"), None
    if words[1] == "import-error":
        return "%s: kvstore_byteps is not importable with %s: %s" % (
            host.name, python, " ".join(words[2:])), None
    there, has_dir, port = words[2], words[3] == "1", words[4]
    if there != version:
        return "%s: kvstore-byteps %s is installed there, %s here" % (host.name, there, version), None
    if not has_dir:
        return "%s: working directory %s does not exist there" % (host.name, workdir), None
    if port.startswith("busy:"):
        return "%s: the scheduler's port %s is not free (%s)" % (
            host.name, port_arg, port[5:].replace("_", " ")), None
    return None, (int(port) if port != "-" else None)


def run(args) -> int:
    """Nodes on the hostfile's hosts over ssh, after a preflight of every host."""
    hosts = read_hostfile(args.hostfile)
    sched = _scheduler_index(hosts, args.scheduler_host)
    if args.dry_run:
        print_dry_run(plan(args, hosts, args.port or NETNS_ROOT_PORT, sched), hosts)
        return 0
    port = preflight(hosts, args.python, args.workdir, kvstore_byteps.__version__, sched,
                     args.port, args.ssh_args)
    specs = plan(args, hosts, port, sched)
    say("%d hosts passed the preflight; scheduler on %s:%d; %s"
        % (len(hosts), hosts[sched].address, port, "; ".join(describe_placement(specs, hosts))))
    return run_job(args, specs, SshStarter(hosts, args.python, args.workdir, args.ssh_args))


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
