"""Asynchronous training on the server (serving/asynchronous.py): each key counts the changes
that altered its weights and the count each worker last read, so a worker that ends with weights
older than the servers' is told (BYTEPS_STALE). A push of zeros (a worker reading the weights)
changes nothing and counts nothing. Through a recording responder: no sockets."""
import numpy as np

from kvstore_byteps.mxproto import RequestType, ServerCommand
from kvstore_byteps.serving.byteps import BytePSServer
from tests.support.server_fakes import WORKER0, WORKER1, FakeServer, command, pull, push


def bpush(sender, key, value, pull_too=False):
    return push(sender, key, np.full(4, value, np.float32), pull=pull_too,
                rtype=RequestType.BYTEPS)


def stale(srv, fake, sender):
    req = command(sender, ServerCommand.BYTEPS_STALE)
    srv.handle_command(req, fake)
    return fake.wait_for(req).body


def test_a_worker_is_stale_until_it_reads_every_change():
    with BytePSServer(2, summing_threads=1, enable_async=True) as srv:
        fake = FakeServer()
        srv.handle_request(bpush(WORKER0, 4, 1.0), fake)          # initialises
        for sender in (WORKER0, WORKER1):
            req = bpush(sender, 4, 0.5, pull_too=True)
            srv.handle_request(req, fake)
            fake.wait_for(req)
        assert stale(srv, fake, WORKER0) == b"1/1"                # missed worker 1's change
        assert stale(srv, fake, WORKER1) == b"0/1"
        zeros = bpush(WORKER1, 4, 0.0, pull_too=True)             # a read: no change
        srv.handle_request(zeros, fake)
        fake.wait_for(zeros)
        read = pull(WORKER0, 4)                                   # a plain pull reads too
        srv.handle_request(read, fake)
        fake.wait_for(read)
        assert stale(srv, fake, WORKER0) == stale(srv, fake, WORKER1) == b"0/1"


def test_summed_rounds_have_no_stale_weights():
    with BytePSServer(2, summing_threads=1) as srv:
        assert stale(srv, FakeServer(), WORKER0) == b"0/0"
