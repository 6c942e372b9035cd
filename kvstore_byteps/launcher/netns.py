"""An emulated cluster on this machine: one Linux network namespace per host, shaped links.

    switch namespace:  bridge br0 --- veth h0 ---- eth0 in host namespace 0 (198.18.0.1/24)
                                 \\-- veth h1 ---- eth0 in host namespace 1 (198.18.0.2/24) ...

Every host's link is shaped to the same rate in both directions with tc ``tbf``: the host's
``eth0`` egress (its upload) and the switch port's egress (its download). This kernel has no
``netem``, so there is no added delay or loss; what the nodes get is real TCP through links of a
chosen speed. Addresses come from 198.18.0.0/15, the range reserved for benchmarking, and live
only inside namespaces made here. Everything is named ``kvbps<launcher pid>-...`` and removed on
exit (processes first, then namespaces, which takes their links along); namespaces left by a
launcher that was SIGKILLed are removed by the next one. Needs root (CAP_NET_ADMIN).
``--launcher netns`` runs a job in one (:func:`run`).
"""
import dataclasses
import os
import re
import select
import shutil
import signal
import subprocess
import sys
import threading
import time
from typing import Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from .job import NodeStarter, guard_argv
from .plan import Host, LaunchError, ProcSpec, describe_placement
from .procs import pid_alive
from .runs import plan, print_dry_run, run_job, say

#: The scheduler's port inside an emulated network (fresh namespaces: nothing else is bound there).
NETNS_ROOT_PORT = 9091
NAME_PREFIX = "kvbps"
SUBNET = "198.18.0"
PREFIX_LEN = 24
MAX_HOSTS = 250
#: tbf queue bound: enough for TCP to fill the link at this machine's sub-millisecond RTTs.
TBF_LATENCY = "20ms"
#: tbf bucket: 2 ms of traffic, at least 64 KiB (one GSO segment must fit).
TBF_BURST_S = 0.002
TBF_MIN_BURST = 64 * 1024
COMMAND_TIMEOUT_S = 20.0
_RATE = re.compile(r"^(\d+(?:\.\d+)?)\s*([kmgt]?)bit$", re.IGNORECASE)
_SCALE = {"": 1, "k": 10 ** 3, "m": 10 ** 6, "g": 10 ** 9, "t": 10 ** 12}
_OWNED = re.compile(r"^%s(\d+)-" % NAME_PREFIX)
_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def parse_rate(text: str) -> int:
    """``1gbit``, ``100mbit``, ``2.5gbit``, ``500kbit`` -> bits per second (tc's spelling).

    Byte units are refused on purpose: tc reads ``1gbps`` as gigabytes per second.
    """
    match = _RATE.match(text.strip())
    if not match or float(match.group(1)) <= 0:
        raise LaunchError("link rate %r: expected a rate in bits per second such as 1gbit, "
                          "100mbit or 500kbit" % text)
    bits = int(float(match.group(1)) * _SCALE[match.group(2).lower()])
    if bits < 8000:
        raise LaunchError("link rate %r: below 8kbit is too slow to carry a cluster" % text)
    return bits


def describe_rate(bits_per_s: int) -> str:
    """1000000000 -> '1 Gbit/s (125.0 MB/s)'."""
    for scale, unit in ((10 ** 9, "Gbit/s"), (10 ** 6, "Mbit/s"), (10 ** 3, "kbit/s")):
        if bits_per_s >= scale:
            return "%g %s (%.1f MB/s)" % (bits_per_s / scale, unit, bits_per_s / 8e6)
    return "%d bit/s" % bits_per_s


def tbf_args(bits_per_s: int) -> List[str]:
    """The ``tbf`` parameters of one shaped direction."""
    burst = max(TBF_MIN_BURST, int(bits_per_s / 8 * TBF_BURST_S))
    return ["tbf", "rate", "%dbit" % bits_per_s, "burst", str(burst), "latency", TBF_LATENCY]


@dataclasses.dataclass
class EmulatedNetwork:
    """``num_hosts`` namespaces on one bridge, each link shaped to ``rate`` (bit/s, None: unshaped).

    Use as a context manager, or call ``create()`` and ``destroy()`` (idempotent) yourself.
    """

    num_hosts: int
    rate: Optional[int] = None
    owner_pid: int = dataclasses.field(default_factory=os.getpid)
    created: List[str] = dataclasses.field(default_factory=list)

    def __post_init__(self):
        if not 1 <= self.num_hosts <= MAX_HOSTS:
            raise LaunchError("an emulated network has 1 to %d hosts, not %d"
                              % (MAX_HOSTS, self.num_hosts))

    # ---- names --------------------------------------------------------------------------
    @property
    def switch(self) -> str:
        return "%s%d-sw" % (NAME_PREFIX, self.owner_pid)

    def namespace(self, host: int) -> str:
        """The network namespace of host ``host``."""
        return "%s%d-h%d" % (NAME_PREFIX, self.owner_pid, host)

    @staticmethod
    def address(host: int) -> str:
        """Host ``host``'s address: 198.18.0.<host + 1>."""
        return "%s.%d" % (SUBNET, host + 1)

    def exec_argv(self, host: int) -> List[str]:
        """Prefix that runs a command inside host ``host``'s namespace."""
        return ["ip", "netns", "exec", self.namespace(host)]

    # ---- life cycle ---------------------------------------------------------------------
    def __enter__(self) -> "EmulatedNetwork":
        self._restore_signals = _exit_through_python()
        try:
            self.create()
        except BaseException:
            self._restore_signals()
            raise
        return self

    def __exit__(self, *_exc) -> None:
        try:
            self.destroy()
        finally:
            self._restore_signals()

    def create(self) -> None:
        """Make the switch, the hosts and their shaped links; undo everything on failure."""
        check_privileges()
        remove_stale_namespaces()
        try:
            self._add_namespace(self.switch)
            _run(["ip", "-n", self.switch, "link", "add", "br0", "type", "bridge"])
            _run(["ip", "-n", self.switch, "link", "set", "br0", "up"])
            for host in range(self.num_hosts):
                self._add_host(host)
        except BaseException:
            self.destroy()
            raise

    def _add_namespace(self, name: str) -> None:
        _run(["ip", "netns", "add", name])
        self.created.append(name)
        _run(["ip", "-n", name, "link", "set", "lo", "up"])

    def _add_host(self, host: int) -> None:
        ns, port = self.namespace(host), "h%d" % host
        self._add_namespace(ns)
        _run(["ip", "-n", self.switch, "link", "add", port, "type", "veth",
              "peer", "name", "eth0", "netns", ns])
        _run(["ip", "-n", self.switch, "link", "set", port, "master", "br0", "up"])
        _run(["ip", "-n", ns, "addr", "add", "%s/%d" % (self.address(host), PREFIX_LEN),
              "dev", "eth0"])
        _run(["ip", "-n", ns, "link", "set", "eth0", "up"])
        if self.rate is not None:
            _run(["tc", "-n", ns, "qdisc", "add", "dev", "eth0", "root"] + tbf_args(self.rate))
            _run(["tc", "-n", self.switch, "qdisc", "add", "dev", port, "root"]
                 + tbf_args(self.rate))

    def destroy(self) -> None:
        """Kill every process in our namespaces, then delete them (links go with them).

        Stop signals wait until it is done (a second Ctrl-C must not leave half a network);
        they are delivered right after.
        """
        blocked = signal.pthread_sigmask(signal.SIG_BLOCK, _STOP_SIGNALS)
        try:
            for name in reversed(self.created):
                _delete_namespace(name)
            self.created.clear()
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, blocked)


def _exit_through_python() -> Callable[[], None]:
    """While a ``with EmulatedNetwork(...)`` block runs in the main thread, SIGTERM and SIGHUP
    that nothing else handles raise SystemExit, so the block's exit removes the network (their
    default action ended the process at once and left the namespaces until the next launcher's
    clean-up; a benchmark stopped by ``kill`` did). Returns what puts the defaults back."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None
    taken = [signum for signum in (signal.SIGTERM, signal.SIGHUP)
             if signal.getsignal(signum) is signal.SIG_DFL]

    def leave(signum, _frame):
        raise SystemExit(128 + signum)
    for signum in taken:
        signal.signal(signum, leave)

    def restore() -> None:
        for signum in taken:
            signal.signal(signum, signal.SIG_DFL)
    return restore


def check_privileges() -> None:
    """LaunchError unless ``ip`` and ``tc`` exist and we may manage network namespaces."""
    missing = [tool for tool in ("ip", "tc") if shutil.which(tool) is None]
    if missing:
        raise LaunchError("--launcher netns needs %s (Debian: apt-get install iproute2)"
                          % " and ".join(missing))
    if os.geteuid() != 0:
        raise LaunchError("--launcher netns needs root (CAP_NET_ADMIN) to create network "
                          "namespaces and shape links; run it as root, or use --launcher local")


def namespaces() -> List[str]:
    """Names of the network namespaces that exist now."""
    out = _run(["ip", "netns", "list"])
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def remove_stale_namespaces() -> List[str]:
    """Delete namespaces of ours whose launcher is gone (it was SIGKILLed); return their names."""
    stale = [name for name in namespaces()
             if _OWNED.match(name) and not pid_alive(int(_OWNED.match(name).group(1)))]
    for name in stale:
        _delete_namespace(name)
    return stale


def _delete_namespace(name: str) -> None:
    pids = _run(["ip", "netns", "pids", name], check=False).split()
    for pid in pids:
        try:
            os.kill(int(pid), 9)
        except (ProcessLookupError, ValueError):
            pass
    deadline = time.monotonic() + COMMAND_TIMEOUT_S
    while pids and time.monotonic() < deadline:
        pids = _run(["ip", "netns", "pids", name], check=False).split()
        time.sleep(0.02)
    _run(["ip", "netns", "delete", name], check=False)


def _run(argv: Sequence[str], check: bool = True) -> str:
    try:
        done = subprocess.run(list(argv), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, timeout=COMMAND_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise LaunchError("%s did not finish within %g s" % (" ".join(argv), COMMAND_TIMEOUT_S))
    if check and done.returncode != 0:
        detail = done.stderr.strip() or "exit code %d" % done.returncode
        if "Operation not permitted" in detail:
            detail += " (needs root / CAP_NET_ADMIN)"
        raise LaunchError("%s failed: %s" % (" ".join(argv), detail))
    return done.stdout


# ---- measuring a link ----------------------------------------------------------------------
_RECEIVER = """
import socket, sys, time
srv = socket.socket(); srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
srv.bind((sys.argv[1], int(sys.argv[2]))); srv.listen(1); srv.settimeout(float(sys.argv[3]))
print("ready", flush=True)
conn, _ = srv.accept(); conn.settimeout(float(sys.argv[3]))
buf = bytearray(1 << 20); total = 0; first = None
while True:
    n = conn.recv_into(buf)
    if not n:
        break
    if first is None:
        first = time.perf_counter()
    total += n
print(total, time.perf_counter() - first, flush=True)
"""
_SENDER = """
import socket, sys
sock = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=float(sys.argv[4]))
chunk = bytes(1 << 20); left = int(sys.argv[3])
while left > 0:
    sock.sendall(chunk[:min(left, len(chunk))]); left -= len(chunk)
sock.close()
"""


def measure_link_rate(net: EmulatedNetwork, sender: int, receiver: int, nbytes: int,
                      timeout: float = 60.0, port: int = 5201) -> float:
    """Bytes per second of one TCP bulk transfer of ``nbytes`` from host ``sender`` to ``receiver``.

    The receiver times from its first byte to end-of-file, so connection set-up is not counted.
    """
    target = net.address(receiver)
    recv = subprocess.Popen(net.exec_argv(receiver) + [sys.executable, "-c", _RECEIVER, target,
                                                        str(port), str(timeout)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        ready, _, _ = select.select([recv.stdout], [], [], timeout)
        if not ready or recv.stdout.readline().strip() != "ready":
            recv.kill()
            raise LaunchError("link measurement: the receiver on %s did not start within %g s: "
                              "%s" % (target, timeout, recv.communicate()[1].strip()))
        subprocess.run(net.exec_argv(sender) + [sys.executable, "-c", _SENDER, target, str(port),
                                                 str(nbytes), str(timeout)],
                       check=True, timeout=timeout, stdin=subprocess.DEVNULL)
        out, err = recv.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        raise LaunchError("link measurement %s -> %s took longer than %g s"
                          % (net.address(sender), target, timeout)) from None
    finally:
        if recv.poll() is None:
            recv.kill()
            recv.wait()
    total, seconds = out.split()
    if int(total) != nbytes:
        raise LaunchError("link measurement: %s of %d bytes arrived (%s)" % (total, nbytes, err))
    return int(total) / float(seconds)


class NetnsStarter(NodeStarter):
    """Starts each node under the guard inside its host's namespace of ``net``."""

    def __init__(self, net: EmulatedNetwork, python: str = sys.executable):
        super().__init__(python)
        self.net = net

    def command(self, spec: ProcSpec, base_env: Mapping[str, str]) -> Tuple[List[str], Dict[str, str]]:
        return (self.net.exec_argv(spec.host) + guard_argv(self.python, spec.argv),
                {**base_env, **spec.env})

    def where(self, spec: ProcSpec) -> str:
        return "%s (%s)" % (self.net.namespace(spec.host), self.net.address(spec.host))


def run(args) -> int:
    """Every host a network namespace on one bridge, links shaped to --link-rate."""
    num_nodes = 1 + args.num_servers + args.num_workers
    count = args.hosts or num_nodes
    # With a host per node the scheduler gets host 0 to itself; otherwise place as over ssh.
    first = 1 if count == num_nodes else 0
    hosts = [Host(EmulatedNetwork.address(i)) for i in range(count)]
    specs = plan(args, hosts, args.port or NETNS_ROOT_PORT, 0, first)
    if args.dry_run:
        print_dry_run(specs, hosts)
        return 0
    net = EmulatedNetwork(count, args.rate)
    try:
        net.create()
        say("emulated network: %d hosts on %s links, 198.18.0.1-%d; %s"
            % (count, describe_rate(args.rate) if args.rate else "unshaped", count,
               "; ".join(describe_placement(specs, hosts))))
        return run_job(args, specs, NetnsStarter(net, args.python))
    finally:
        net.destroy()
