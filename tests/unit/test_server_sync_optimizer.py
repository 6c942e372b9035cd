"""BytePSServer in synchronous training once the workers sent an optimizer (kController, as
MXNet's dist_sync workers do with update_on_kvstore), through a recording responder (no
sockets): each key's complete round goes through the optimizer before any pull reads it, the
round's answer is the new weights, a plain pull reads them too; a failing update refuses every
pull of its round; before the optimizer, rounds are sums as always."""
import pickle

import mxnet as mx      # at collection: importing it inside a test trips the unit-purity guard
import numpy as np

from kvstore_byteps.mxproto import RequestType, ServerCommand
from kvstore_byteps.serving.byteps import BytePSServer
from kvstore_byteps.serving.rounds import FailedRound, KeyRounds
from tests.support.server_fakes import WORKER0, WORKER1, FakeServer, command, pull, push

BP = RequestType.BYTEPS


def bpush(sender, key, value, pull_too=False):
    return push(sender, key, np.full(4, value, np.float32), pull=pull_too, rtype=BP)


class HalfStep:
    """SGD with learning rate 0.5 that records the indices it was called with."""

    def __init__(self):
        self.indices = []

    def __call__(self, index, grad, weight):
        self.indices.append(index)
        return weight - 0.5 * grad


def server(updater):
    srv = BytePSServer(2, summing_threads=2, updater_loader=lambda body: updater)
    fake = FakeServer()
    srv.handle_request(bpush(WORKER0, 1, 10.0), fake)           # rank 0 initialises: 10
    return srv, fake


def values(fake, req):
    return fake.values_of(req)


def round_of(srv, fake, a, b):
    reqs = [bpush(WORKER0, 1, a, pull_too=True), bpush(WORKER1, 1, b, pull_too=True)]
    for req in reqs:
        srv.handle_request(req, fake)
    return [values(fake, req) for req in reqs]


def test_rounds_are_sums_until_the_optimizer_then_the_weights_after_each_round():
    step = HalfStep()
    srv, fake = server(step)
    with srv:
        assert round_of(srv, fake, 1.0, 2.0) == [[3.0] * 4] * 2          # a sum: no optimizer
        srv.handle_command(command(WORKER0, ServerCommand.CONTROLLER, b"sgd"), fake)
        assert round_of(srv, fake, 1.0, 3.0) == [[8.0] * 4] * 2          # 10 - 0.5 * 4
        assert round_of(srv, fake, 2.0, 2.0) == [[6.0] * 4] * 2          # 8 - 0.5 * 4
        read = pull(WORKER1, 1, np.float32)                              # a plain pull
        srv.handle_request(read, fake)
        assert values(fake, read) == [6.0] * 4
        # the state of ps key 1 is kept under -1 - 1, never under an MXNet key
        assert set(step.indices) == {-2}


def test_a_pull_after_the_round_completed_reads_the_updated_weights_too():
    srv, fake = server(HalfStep())
    with srv:
        srv.handle_command(command(WORKER0, ServerCommand.CONTROLLER, b"sgd"), fake)
        a, b = bpush(WORKER0, 1, 2.0), bpush(WORKER1, 1, 2.0)
        srv.handle_request(a, fake)
        srv.handle_request(b, fake)
        fake.wait_for(a), fake.wait_for(b)
        pulls = [pull(s, 1, np.float32, rtype=BP) for s in (WORKER0, WORKER1)]
        for req in pulls:
            srv.handle_request(req, fake)
        assert [values(fake, req) for req in pulls] == [[8.0] * 4] * 2


def test_a_failing_update_refuses_every_pull_of_its_round_and_the_server_goes_on():
    def broken(index, grad, weight):
        raise ValueError("optimizer exploded")
    srv, fake = server(broken)
    with srv:
        srv.handle_command(command(WORKER0, ServerCommand.CONTROLLER, b"sgd"), fake)
        reqs = [bpush(WORKER0, 1, 1.0, pull_too=True), bpush(WORKER1, 1, 1.0, pull_too=True)]
        for req in reqs:
            srv.handle_request(req, fake)
        for req in reqs:
            error = fake.wait_for(req).error
            assert "update of ps key" in error and "optimizer exploded" in error, error


def test_a_rounds_finish_runs_before_any_pull_can_read_it_and_its_failure_is_the_answer():
    rounds = KeyRounds(7, 2, 3, np.float32)
    for sender in (9, 11):
        rounds.begin_push(sender)
    assert rounds.request_pull(9, "early") is None
    assert rounds.accumulate(0, np.ones(3, np.float32), lambda total: None) == ([], None)
    tokens, answer = rounds.accumulate(0, np.ones(3, np.float32), lambda total: "no luck")
    assert tokens == ["early"] and answer == FailedRound("no luck")
    assert rounds.request_pull(11, "late") == FailedRound("no luck")
    # the next round starts clean
    for sender in (9, 11):
        rounds.begin_push(sender)
    rounds.accumulate(1, np.ones(3, np.float32))

    def times_ten(total):
        total *= 10
    tokens, answer = rounds.accumulate(1, np.ones(3, np.float32), times_ten)
    assert list(answer) == [20.0] * 3


def test_mxnets_momentum_sgd_updates_the_servers_weights_in_place_as_on_copies():
    """The real optimizer, in place on the server's own copy of the weights, gives what MXNet's
    updater gives on copies, round after round (its momentum kept per partition)."""
    sgd = mx.optimizer.SGD(learning_rate=0.1, momentum=0.9, wd=0.01, rescale_grad=0.5)
    srv, fake = BytePSServer(2, summing_threads=2), FakeServer()
    reference = mx.optimizer.get_updater(pickle.loads(pickle.dumps(sgd, 0)))
    weight = mx.nd.full(4, 10.0)
    with srv:
        srv.handle_request(bpush(WORKER0, 1, 10.0), fake)
        srv.handle_command(command(WORKER0, ServerCommand.CONTROLLER, pickle.dumps(sgd, 0)), fake)
        for step in range(4):
            got = round_of(srv, fake, 1.0 + step, 2.0)
            reference(0, mx.nd.full(4, 3.0 + step), weight)
            assert np.allclose(got[0], weight.asnumpy(), rtol=1e-6) and got[0] == got[1]
