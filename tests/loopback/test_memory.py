"""The allocator keeps freed message buffers (kvstore_byteps.memory)."""
import platform
import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc only")

# Page faults of the second of two 8 MB buffers, allocated after the first was freed.
_PROBE = r"""
import resource, sys
import numpy as np
if sys.argv[1] == "keep":
    from kvstore_byteps.memory import keep_freed_memory
    assert keep_freed_memory()
def touch():
    buffer = np.empty(8 << 20, np.uint8)
    buffer.fill(1)
touch()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
touch()
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def _faults_of_second_buffer(mode: str) -> int:
    out = subprocess.run([sys.executable, "-c", _PROBE, mode], capture_output=True, text=True,
                         timeout=60, check=True).stdout
    return int(out.split()[-1])


def test_a_freed_buffer_is_reused_without_faulting_its_pages_in_again():
    default = _faults_of_second_buffer("default")     # glibc gave the first one back
    kept = _faults_of_second_buffer("keep")
    assert default >= 16 and kept * 4 < default, (default, kept)
