"""Helpers for tests on the emulated network: the skip rule, and an sshd in each host namespace."""
import os
import shutil
import subprocess
import time

import pytest

from kvstore_byteps.launcher import netns
from kvstore_byteps.launcher.plan import LaunchError
from tests.support.procs import wait_until

SSHD = "/usr/sbin/sshd"


def netns_unavailable_reason():
    """Why namespace tests cannot run here, or None."""
    try:
        netns.check_privileges()
    except LaunchError as exc:
        return str(exc)
    return None


requires_netns = pytest.mark.skipif(netns_unavailable_reason() is not None,
                                    reason="emulated network unavailable: %s"
                                    % netns_unavailable_reason())


def our_namespaces(pid=None):
    """Namespaces named by a launcher (of ``pid``, or of any)."""
    prefix = "%s%s-" % (netns.NAME_PREFIX, "" if pid is None else pid)
    return [n for n in netns.namespaces() if n.startswith(prefix)]


def sshd_unavailable_reason():
    if netns_unavailable_reason():
        return netns_unavailable_reason()
    if not os.path.exists(SSHD) or shutil.which("ssh") is None or shutil.which("ssh-keygen") is None:
        return ("openssh-server/openssh-client are not installed (.ci/run installs them when it "
                "runs as root)")
    return None


class SshCluster:
    """An sshd (key login as root, on port 22) in each host namespace of ``net``."""

    def __init__(self, net, workdir):
        self.net, self.dir = net, str(workdir)
        self.procs = []
        self.key = os.path.join(self.dir, "client_key")
        for name in ("host_key", "client_key"):
            subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f",
                            os.path.join(self.dir, name)], check=True, timeout=30)
        shutil.copy(self.key + ".pub", os.path.join(self.dir, "authorized_keys"))
        os.makedirs("/run/sshd", exist_ok=True)  # sshd's privilege-separation directory

    def start(self, sshd_on=None):
        """An sshd on each host (``sshd_on``: {host: extra config lines}, only those hosts)."""
        sshd_on = sshd_on if sshd_on is not None else {h: [] for h in range(self.net.num_hosts)}
        for host, extra in sorted(sshd_on.items()):
            config = os.path.join(self.dir, "sshd_%d.conf" % host)
            with open(config, "w") as f:
                f.write("\n".join([
                    "Port 22", "ListenAddress %s" % self.net.address(host),
                    "HostKey %s/host_key" % self.dir,
                    "AuthorizedKeysFile %s/authorized_keys" % self.dir,
                    "PermitRootLogin prohibit-password", "PasswordAuthentication no",
                    "KbdInteractiveAuthentication no", "UsePAM no", "StrictModes no",
                    "PidFile %s/sshd_%d.pid" % (self.dir, host), "LogLevel ERROR"] + extra + [""]))
            self.procs.append(subprocess.Popen(
                self.net.exec_argv(host) + [SSHD, "-D", "-e", "-f", config],
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE))
        for host in sshd_on:
            wait_until(lambda: self._answers(host), 20, "sshd on %s" % self.net.address(host))
        return self

    def _answers(self, host):
        probe = subprocess.run(self.net.exec_argv(host) + ["ssh"] + self.ssh_args()
                               + ["-o", "BatchMode=yes", self.net.address(host), "true"],
                               stdin=subprocess.DEVNULL, capture_output=True, timeout=20)
        if probe.returncode != 0:
            time.sleep(0.1)
        return probe.returncode == 0

    def ssh_args(self):
        return ["-i", self.key, "-o", "StrictHostKeyChecking=no", "-o",
                "UserKnownHostsFile=/dev/null", "-o", "LogLevel=ERROR"]

    def stop(self):
        for proc in self.procs:
            proc.terminate()
        for proc in self.procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
