"""The local group of one host (mxnet_patch.localgroup) over a real Unix socket, with a fake
store in place of the cluster: sums, rounds matched by name and use, deadlines, lost members."""
import os
import threading

import numpy as np
import pytest

from kvstore_byteps.errors import DeadlineError, PeerError
from mxnet_patch.localgroup import LocalMember, LocalRoot, group_address

pytestmark = pytest.mark.timeout(60)


class SumStore:
    """``reduce_host`` as the host's worker does it, for one worker: the sum of the inputs."""

    def reduce_host(self, key, inputs, out, priority, on_done):
        np.copyto(out, np.sum(inputs, axis=0, dtype=out.dtype))
        on_done(None)


class Outcome:
    """A ``done`` callback that records its error and can be waited for."""

    def __init__(self):
        self.event, self.error = threading.Event(), "not called"

    def __call__(self, error=None):
        self.error = error
        self.event.set()

    def wait(self, timeout=10):
        assert self.event.wait(timeout), "done was not called"
        return self.error


@pytest.fixture
def address(request):
    return group_address("127.0.0.1", str(os.getpid()), request.node.name)


def group(address, size, timeout=10.0):
    root = LocalRoot(address, size, SumStore(), timeout, {"rank": 1, "workers": 2})
    members = [LocalMember(address, rank, timeout) for rank in range(1, size)]
    root.wait_members(5)
    return root, members


def test_members_and_root_sum_each_name_whatever_order_they_use_names_in(address):
    root, members = group(address, 3)
    try:
        assert members[0].welcome == {"rank": 1, "workers": 2}
        names = ["a", "b", "a"]                 # "a" is used twice: two rounds of it
        outs = {}
        for rank, member in enumerate(members, 1):
            order = list(enumerate(names)) if rank == 1 else list(enumerate(names))[::-1]
            for index, name in order:
                seq = names[:index].count(name)
                out, done = np.zeros(4, np.float32), Outcome()
                member.reduce(name, seq, np.full(4, rank * 10 + index, np.float32), out, done)
                outs[(rank, index)] = (out, done)
        for index, name in enumerate(names):
            seq = names[:index].count(name)
            out, done = np.zeros(4, np.float32), Outcome()
            root.reduce(7, name, seq, np.full(4, index, np.float32), out, 0, done)
            assert done.wait() is None
            want = index + 10 + index + 20 + index
            assert list(out) == [want] * 4
            outs[(0, index)] = (out, done)
        for (rank, index), (out, done) in outs.items():
            assert done.wait() is None and out[0] == 3 * index + 30, (rank, index, out)
    finally:
        for member in members:
            member.close()
        root.close()


def test_a_round_missing_a_member_fails_at_the_deadline_naming_it(address):
    root, members = group(address, 3, timeout=1.0)
    try:
        out, done = np.zeros(2, np.float32), Outcome()
        member_done = Outcome()
        members[0].reduce("w", 0, np.ones(2, np.float32), np.zeros(2, np.float32), member_done)
        root.reduce(1, "w", 0, np.ones(2, np.float32), out, 0, done)
        error = done.wait()
        assert isinstance(error, DeadlineError) and "local rank(s) [2]" in str(error)
        assert "local rank(s) [2]" in str(member_done.wait())     # told as well
    finally:
        for member in members:
            member.close()
        root.close()


def test_a_member_that_dies_fails_the_rounds_waiting_for_it(address):
    root, members = group(address, 2)
    try:
        out, done = np.zeros(2, np.float32), Outcome()
        root.reduce(1, "w", 0, np.ones(2, np.float32), out, 0, done)
        members[0]._closed = True
        members[0]._link.close()                 # no goodbye: the process died
        error = done.wait()
        assert isinstance(error, PeerError) and "local rank 1 went away" in str(error)
    finally:
        root.close()


def test_mismatched_parts_are_refused_naming_the_tensor(address):
    root, members = group(address, 2)
    try:
        member_done, done = Outcome(), Outcome()
        members[0].reduce("t", 0, np.ones(3, np.float64), np.zeros(3, np.float64), member_done)
        root.reduce(1, "t", 0, np.ones(2, np.float32), np.zeros(2, np.float32), 0, done)
        assert "tensor 't': local rank 1 sent 24 bytes of float64" in str(done.wait())
        assert "tensor 't'" in str(member_done.wait())
    finally:
        for member in members:
            member.close()
        root.close()
