"""Process helpers shared by the launcher and the node guard (Linux /proc and prctl)."""
import ctypes
import os

#: What a child exits with when it cannot start (as a shell says "command not found").
EXIT_CANNOT_START = 127
_PR_SET_PDEATHSIG = 1
_LIBC = ctypes.CDLL(None, use_errno=True)  # loaded before any fork


def die_with_parent(signum: int, parent_pid: int) -> None:
    """In a child between fork and exec: get ``signum`` when the parent dies.

    The parent may already have died between the fork and this call, which the kernel does not
    report: then exit at once instead of running on as an orphan.
    """
    try:
        _LIBC.prctl(_PR_SET_PDEATHSIG, signum)
    except AttributeError:  # not Linux: the stdin watch still covers the launcher
        return
    if os.getppid() != parent_pid:
        os._exit(EXIT_CANNOT_START)


def exit_status(returncode: int) -> int:
    """A child's return code as a shell exit status (killed by signal N -> 128 + N)."""
    return 128 - returncode if returncode < 0 else returncode


def pid_alive(pid: int) -> bool:
    """True while ``pid`` is a live process (a zombie counts as dead)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open("/proc/%d/stat" % pid) as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False
