"""A private Slurm for cluster tests: munged, slurmctld and one slurmd per node.

One node on 127.0.0.1, or one node per host of an emulated network (each slurmd inside its
host's namespace, the controller on host 0: a Slurm of several machines, on one). Everything
lives in a temporary directory (configuration, munge key and socket, state, logs); the ports
are free ones chosen now (fixed inside fresh namespaces); each node declares more CPUs than the
machine has (``SlurmdParameters=config_overrides``), so a job of 1 + S + W tasks fits on two
cores. No cgroups (``proctrack/linuxproc``, ``task/none``; daemons enter namespaces with
``nsenter``, which keeps /sys/fs/cgroup, not ``ip netns exec``). Clients reach it through
``SLURM_CONF`` (:attr:`SlurmCluster.env`), from :attr:`SlurmCluster.client` (the prefix that
runs a command on host 0). Stopping cancels every job and stops the daemons; nothing is left.
"""
import os
import shutil
import socket
import subprocess
import time

import pytest

from tests.support.procs import free_ports, kill_process_tree

NODE = "kvbnode"
CPUS = 16
#: Inside fresh namespaces nothing else listens: Slurm's usual ports.
NETNS_PORTS = (6817, 6818)
START_TIMEOUT_S = 30
_DAEMONS = ("munged", "slurmctld", "slurmd", "srun", "salloc", "scontrol", "squeue", "nsenter")

_CONF = """\
ClusterName=kvbtest
SlurmctldHost={ctld_host}
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
AuthType=auth/munge
AuthInfo=socket={dir}/munge.sock
CredType=cred/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmUser=root
SlurmdUser=root
StateSaveLocation={dir}/state
SlurmdSpoolDir={dir}/spool-%n
SlurmctldPidFile={dir}/slurmctld.pid
SlurmdPidFile={dir}/slurmd-%n.pid
SlurmctldLogFile={dir}/slurmctld.log
SlurmdLogFile={dir}/slurmd-%n.log
ReturnToService=2
MpiDefault=none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SlurmdParameters=config_overrides
{nodes}PartitionName=test Nodes={names} Default=YES MaxTime=INFINITE State=UP
"""


def missing():
    """Why a private Slurm cannot run here (None if it can)."""
    if os.geteuid() != 0:
        return "a private slurmd runs as root (its SlurmdUser)"
    absent = [name for name in _DAEMONS
              if not (shutil.which(name) or os.path.exists("/usr/sbin/" + name))]
    if absent:
        return ("Slurm is not installed (%s missing): apt-get install slurm-wlm munge"
                % ", ".join(absent))
    return None


def _program(name):
    return shutil.which(name) or "/usr/sbin/" + name


class SlurmCluster:
    """The daemons of one private Slurm, started in ``directory``: one node (``NODE``, on
    127.0.0.1), or with ``net`` (an :class:`EmulatedNetwork`) node ``kvb<i>`` on each host i."""

    def __init__(self, directory, net=None):
        self.dir, self.net = str(directory), net
        os.makedirs(os.path.join(self.dir, "state"))
        if net is None:
            self.nodes, addresses = [NODE], ["127.0.0.1"]
            ctld_port, slurmd_port = free_ports(2)
            ctld_host = "localhost(127.0.0.1)"
        else:
            self.nodes = ["kvb%d" % i for i in range(net.num_hosts)]
            addresses = [net.address(i) for i in range(net.num_hosts)]
            ctld_port, slurmd_port = NETNS_PORTS
            ctld_host = "%s(%s)" % (socket.gethostname(), addresses[0])  # slurmctld checks its name
        for name in self.nodes:
            os.makedirs(os.path.join(self.dir, "spool-" + name))
        nodes = "".join("NodeName=%s NodeAddr=%s CPUs=%d State=UNKNOWN\n" % (name, address, CPUS)
                        for name, address in zip(self.nodes, addresses))
        self.conf = os.path.join(self.dir, "slurm.conf")
        with open(self.conf, "w") as f:
            f.write(_CONF.format(dir=self.dir, ctld_port=ctld_port, slurmd_port=slurmd_port,
                                 ctld_host=ctld_host, nodes=nodes, names=",".join(self.nodes)))
        key = os.path.join(self.dir, "munge.key")
        with open(key, "wb") as f:
            f.write(os.urandom(1024))
        os.chmod(key, 0o400)
        self.env = dict(os.environ, SLURM_CONF=self.conf)
        for name in list(self.env):
            if name.startswith("SLURM_") and name != "SLURM_CONF":
                del self.env[name]  # a test run inside some other allocation must not leak it
        #: the prefix that runs a client command where the controller is (host 0)
        self.client = self.on_host(0)
        self.procs = []
        # munged's socket is a file: one munged serves every namespace.
        self._start([_program("munged"), "--foreground", "--force",
                     "--socket=%s/munge.sock" % self.dir, "--key-file=" + key,
                     "--pid-file=%s/munged.pid" % self.dir, "--log-file=%s/munged.log" % self.dir,
                     "--seed-file=%s/munge.seed" % self.dir])
        self._wait(lambda: os.path.exists(os.path.join(self.dir, "munge.sock")), "munged's socket")
        self._start(self.client + [_program("slurmctld"), "-D", "-i", "-f", self.conf])
        for host, name in enumerate(self.nodes):
            self._start(self.on_host(host) + [_program("slurmd"), "-D", "-f", self.conf, "-N", name])
        self._wait(self._nodes_idle, "the Slurm nodes %s to be idle (see %s/slurmctld.log and "
                   "slurmd-*.log)" % (",".join(self.nodes), self.dir))

    def on_host(self, host):
        """The prefix that runs a command on host ``host`` (nothing on 127.0.0.1)."""
        if self.net is None:
            return []
        return ["nsenter", "--net=/run/netns/" + self.net.namespace(host)]

    def _start(self, argv):
        name = os.path.basename(argv[0] if argv[0] != "nsenter" else argv[2])
        log = open(os.path.join(self.dir, "%s-%d.out" % (name, len(self.procs))), "wb")
        self.procs.append(subprocess.Popen(argv, env=self.env, stdin=subprocess.DEVNULL,
                                           stdout=log, stderr=subprocess.STDOUT,
                                           start_new_session=True))
        log.close()

    def _wait(self, predicate, what):
        deadline = time.monotonic() + START_TIMEOUT_S
        while not predicate():
            dead = [p.args[0] for p in self.procs if p.poll() is not None]
            if dead:
                self.stop()
                pytest.fail("%s exited while waiting for %s" % (", ".join(dead), what))
            if time.monotonic() > deadline:
                self.stop()
                pytest.fail("timed out after %d s waiting for %s" % (START_TIMEOUT_S, what))
            time.sleep(0.2)

    def _nodes_idle(self):
        done = self.run(["sinfo", "-h", "-o", "%D %t"], check=False)
        return done.returncode == 0 and done.stdout.strip() == "%d idle" % len(self.nodes)

    def run(self, argv, timeout=30, check=True):
        """A Slurm client command against this cluster; its CompletedProcess."""
        done = subprocess.run(self.client + list(argv), env=self.env, stdin=subprocess.DEVNULL,
                              capture_output=True, text=True, timeout=timeout)
        if check and done.returncode != 0:
            pytest.fail("%s failed: %s" % (" ".join(argv), done.stderr.strip()))
        return done

    def jobs(self):
        """The ids of jobs and steps Slurm still knows as running or pending."""
        return self.run(["squeue", "-h", "-o", "%i %T"]).stdout.split("\n")[:-1]

    def stop(self):
        """Cancel every job, stop the daemons (SIGTERM, then SIGKILL), reap them."""
        if self.procs and self.procs[-1].poll() is None:
            self.run(["scancel", "--full", "--user", "root"], check=False)
        for proc in reversed(self.procs):
            kill_process_tree(proc)
        for proc in self.procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        self.procs = []
