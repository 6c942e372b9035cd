"""A private one-node Slurm for cluster tests: munged, slurmctld and slurmd on 127.0.0.1.

Everything lives in a temporary directory (configuration, munge key and socket, state, logs);
the ports are free ones chosen now; the node declares more CPUs than the machine has
(``SlurmdParameters=config_overrides``), so a job of 1 + S + W tasks fits on two cores. No
cgroups (``proctrack/linuxproc``, ``task/none``): it runs in a container. Clients reach it
through ``SLURM_CONF``, which :attr:`SlurmCluster.env` sets. Stopping cancels every job and
stops the three daemons; nothing is left behind.
"""
import os
import shutil
import subprocess
import time

import pytest

from tests.support.procs import free_ports, kill_process_tree

NODE = "kvbnode"
CPUS = 16
START_TIMEOUT_S = 30
_DAEMONS = ("munged", "slurmctld", "slurmd", "srun", "salloc", "scontrol", "squeue")

_CONF = """\
ClusterName=kvbtest
SlurmctldHost=localhost(127.0.0.1)
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
SlurmdSpoolDir={dir}/spool
SlurmctldPidFile={dir}/slurmctld.pid
SlurmdPidFile={dir}/slurmd.pid
SlurmctldLogFile={dir}/slurmctld.log
SlurmdLogFile={dir}/slurmd.log
ReturnToService=2
MpiDefault=none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SlurmdParameters=config_overrides
NodeName={node} NodeHostname=localhost NodeAddr=127.0.0.1 CPUs={cpus} State=UNKNOWN
PartitionName=test Nodes={node} Default=YES MaxTime=INFINITE State=UP
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
    """The daemons of one private Slurm, started in ``directory``."""

    def __init__(self, directory):
        self.dir = str(directory)
        for sub in ("state", "spool"):
            os.makedirs(os.path.join(self.dir, sub))
        ctld_port, slurmd_port = free_ports(2)
        self.conf = os.path.join(self.dir, "slurm.conf")
        with open(self.conf, "w") as f:
            f.write(_CONF.format(dir=self.dir, ctld_port=ctld_port, slurmd_port=slurmd_port,
                                 node=NODE, cpus=CPUS))
        key = os.path.join(self.dir, "munge.key")
        with open(key, "wb") as f:
            f.write(os.urandom(1024))
        os.chmod(key, 0o400)
        self.env = dict(os.environ, SLURM_CONF=self.conf)
        for name in list(self.env):
            if name.startswith("SLURM_") and name != "SLURM_CONF":
                del self.env[name]  # a test run inside some other allocation must not leak it
        self.procs = []
        self._start([_program("munged"), "--foreground", "--force",
                     "--socket=%s/munge.sock" % self.dir, "--key-file=" + key,
                     "--pid-file=%s/munged.pid" % self.dir, "--log-file=%s/munged.log" % self.dir,
                     "--seed-file=%s/munge.seed" % self.dir])
        self._wait(lambda: os.path.exists(os.path.join(self.dir, "munge.sock")), "munged's socket")
        self._start([_program("slurmctld"), "-D", "-i", "-f", self.conf])
        self._start([_program("slurmd"), "-D", "-f", self.conf, "-N", NODE])
        self._wait(self._node_idle, "the Slurm node %s to be idle (see %s/slurmctld.log and "
                   "slurmd.log)" % (NODE, self.dir))

    def _start(self, argv):
        log = open(os.path.join(self.dir, os.path.basename(argv[0]) + ".out"), "wb")
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

    def _node_idle(self):
        done = self.run(["sinfo", "-h", "-n", NODE, "-o", "%t"], check=False)
        return done.returncode == 0 and done.stdout.strip() == "idle"

    def run(self, argv, timeout=30, check=True):
        """A Slurm client command against this cluster; its CompletedProcess."""
        done = subprocess.run(argv, env=self.env, stdin=subprocess.DEVNULL, capture_output=True,
                              text=True, timeout=timeout)
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
