"""CPU seconds and network bytes per role of a running job, sampled from ``/proc``.

The benchmark marks its job's processes with an environment variable (``JOB_MARK``, inherited
through ``launch.py`` by every scheduler, server and worker, ours or MXNet's); a thread reads
``/proc`` every ``period`` seconds: each marked process's role (``DMLC_ROLE``), its CPU seconds
(user + system, all threads), how long its main thread was ready to run but waited for a core
(the kernel's run-queue wait, ``/proc/<pid>/schedstat``: on a worker the main thread is the
training loop, so this is what busy cores cost the step directly) and the bytes of its network
namespace's ``eth0`` (on the emulated network every node has a namespace of its own, so those
are the node's link; on loopback there is none and bytes are not reported).
:meth:`RoleUsage.per_step` then gives, per role, what its processes used between two
wall-clock times (the workers' measured steps), per node and step: CPU and waits summed over
the role's processes (a node may be two, ``launch.py``'s guard and the program) over its node
count, bytes per namespace. MXNet's C++ servers are measured exactly as ours.

Linux only; processes this user may not read are skipped.
"""
import os
import threading
import time
from typing import Dict, List, NamedTuple, Optional, Tuple

#: the environment variable that marks a benchmark job's processes
JOB_MARK = "KVSTORE_BENCH_JOB"
_TICKS = os.sysconf("SC_CLK_TCK")


def _environ(pid: str) -> Dict[str, str]:
    with open("/proc/%s/environ" % pid, "rb") as f:
        pairs = f.read().split(b"\0")
    return dict(p.decode(errors="replace").split("=", 1) for p in pairs if b"=" in p)


def _machine_ticks() -> Tuple[int, int]:
    """(busy, all) CPU ticks of the whole machine so far (``/proc/stat``; idle and iowait are
    not busy)."""
    with open("/proc/stat") as f:
        ticks = [int(t) for t in f.readline().split()[1:9]]
    return sum(ticks) - ticks[3] - ticks[4], sum(ticks)


def _cpu_seconds(pid: str) -> Tuple[float, float]:
    """(CPU seconds, of which in the kernel) of the process so far."""
    with open("/proc/%s/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICKS, int(fields[12]) / _TICKS


def _main_thread_wait(pid: str) -> Optional[float]:
    """Seconds the process's main thread spent ready to run, waiting for a core (None where
    the kernel keeps no scheduler statistics)."""
    try:
        with open("/proc/%s/schedstat" % pid) as f:
            return int(f.read().split()[1]) / 1e9
    except (FileNotFoundError, IndexError, ValueError):
        return None


def _link_bytes(pid: str) -> Optional[Tuple[str, int, int]]:
    """(namespace, received, sent bytes) of ``eth0`` in the process's network namespace, if
    it has one."""
    with open("/proc/%s/net/dev" % pid) as f:
        for line in f:
            name, _, counters = line.partition(":")
            if name.strip() == "eth0":
                fields = counters.split()
                return os.readlink("/proc/%s/ns/net" % pid), int(fields[0]), int(fields[8])
    return None


class ProcessSample(NamedTuple):
    """What one sample saw of one process."""

    role: str
    cpu_s: float                              # user + kernel CPU seconds so far
    link: Optional[Tuple[str, int, int]]      # (namespace, rx, tx bytes) of eth0, if any
    main_wait_s: Optional[float]              # main thread's run-queue wait, if reported
    kernel_s: float                           # CPU seconds in the kernel so far


class RoleUsage:
    """Samples the marked processes of one job until :meth:`stop`."""

    def __init__(self, mark: str, period: float = 0.2):
        self.mark, self.period = mark, period
        #: (wall time, {pid: ProcessSample})
        self.samples: List[Tuple[float, Dict[str, ProcessSample]]] = []
        #: (wall time, machine's (busy, all) ticks), taken with each sample
        self.machine: List[Tuple[float, Tuple[int, int]]] = []
        self._roles: Dict[str, Optional[str]] = {}     # pid -> role (None: not ours)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="role-usage")

    def __enter__(self) -> "RoleUsage":
        self._thread.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self._stop.set()
        self._thread.join()

    def _role(self, pid: str) -> Optional[str]:
        if pid not in self._roles:
            try:
                env = _environ(pid)
            except OSError:
                return None          # gone, or not ours to read: asked again next time
            self._roles[pid] = env.get("DMLC_ROLE") if env.get(JOB_MARK) == self.mark else None
        return self._roles[pid]

    def _run(self) -> None:
        while not self._stop.wait(self.period):
            now, seen = time.time(), {}
            for pid in os.listdir("/proc"):
                if not pid.isdigit():
                    continue
                role = self._role(pid)
                if role is None:
                    continue
                try:
                    seconds, kernel = _cpu_seconds(pid)
                    seen[pid] = ProcessSample(role, seconds, _link_bytes(pid),
                                              _main_thread_wait(pid), kernel)
                except OSError:
                    continue
            self.samples.append((now, seen))
            self.machine.append((now, _machine_ticks()))


    def machine_busy(self, start: float, end: float) -> Optional[float]:
        """The fraction of the machine's CPU time (all cores) that was busy between ``start``
        and ``end`` (wall clock): near 1.0, the CPU was what bound the job."""
        if not self.machine:
            return None
        busy0, all0 = _nearest(self.machine, start)
        busy1, all1 = _nearest(self.machine, end)
        return (busy1 - busy0) / (all1 - all0) if all1 > all0 else None

    def per_step(self, start: float, end: float, steps: int,
                 nodes: Dict[str, int]) -> Dict[str, Dict[str, float]]:
        """Per role: CPU seconds per node and step between ``start`` and ``end`` (wall clock;
        ``nodes``: the role's node count), how many of them in the kernel (``kernel_s``), the
        seconds per node and step its main threads waited for a core (``main_wait_s``, where
        the kernel reports it) and, where nodes have links, MB received and sent per node and
        step."""
        if not self.samples or steps <= 0:
            return {}
        first, last = _nearest(self.samples, start), _nearest(self.samples, end)
        cpu: Dict[str, float] = {}
        kernel: Dict[str, float] = {}
        waits: Dict[str, float] = {}
        links: Dict[str, Dict[str, Tuple[int, int]]] = {}
        for pid, now in last.items():
            was = first.get(pid)
            if was is None:
                continue
            role = now.role
            cpu[role] = cpu.get(role, 0.0) + now.cpu_s - was.cpu_s
            kernel[role] = kernel.get(role, 0.0) + now.kernel_s - was.kernel_s
            if now.main_wait_s is not None and was.main_wait_s is not None:
                waits[role] = waits.get(role, 0.0) + now.main_wait_s - was.main_wait_s
            link, link0 = now.link, was.link
            if link is not None and link0 is not None and link[0] == link0[0]:
                links.setdefault(role, {})[link[0]] = (link[1] - link0[1], link[2] - link0[2])
        out = {}
        for role, seconds in sorted(cpu.items()):
            count = nodes.get(role) or 1
            usage = {"cpu_s": seconds / count / steps, "kernel_s": kernel[role] / count / steps}
            if role in waits:
                usage["main_wait_s"] = waits[role] / count / steps
            moved = list(links.get(role, {}).values())
            if moved:
                usage["rx_mb"] = sum(m[0] for m in moved) / len(moved) / steps / 1e6
                usage["tx_mb"] = sum(m[1] for m in moved) / len(moved) / steps / 1e6
            out[role] = usage
        return out


def _nearest(samples: List[tuple], when: float):
    """What the ``(wall time, what)`` sample nearest to wall time ``when`` holds."""
    return min(samples, key=lambda sample: abs(sample[0] - when))[1]
