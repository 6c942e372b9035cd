"""BytePSServer with backup workers (BYTEPS_BACKUP_WORKERS), through a recording responder (no
sockets): the optimizer runs on each round of W - b pushes, scaled by W / c; the late push is
dropped and its pull gets the new weights; absent workers are not waited for; a worker that
trains otherwise is refused at the probe."""
import pickle

import mxnet as mx      # at collection: importing it inside a test trips the unit-purity guard
import numpy as np

from kvstore_byteps.errors import TRAINING_OVER
from kvstore_byteps.mxproto import PROBE_ANSWER, RequestType, ServerCommand
from kvstore_byteps.serving.byteps import BytePSServer
from tests.support.server_fakes import WORKER0, WORKER1, WORKER2, FakeServer, command, pull, push

BP = RequestType.BYTEPS
MODE = b"sync with 1 backup worker"


def bpush(sender, key, value, pull_too=False):
    return push(sender, key, np.full(4, value, np.float32), pull=pull_too, rtype=BP)


def minus_grad(key, grad, weight):
    """SGD with learning rate 1: the new weights (never changes ``weight`` in place)."""
    return weight - grad


def backup_server():
    srv = BytePSServer(3, summing_threads=2, backup_workers=1,
                       updater_loader=lambda body: minus_grad)
    fake = FakeServer()
    srv.handle_command(command(WORKER0, ServerCommand.CONTROLLER, b"sgd"), fake)
    srv.handle_request(bpush(WORKER0, 1, 10.0), fake)          # rank 0 initialises: 10
    return srv, fake


def values(fake, req):
    return fake.values_of(req)


def test_a_round_of_two_of_three_pushes_updates_once_and_the_late_push_joins_the_next():
    srv, fake = backup_server()
    with srv:
        a, b = bpush(WORKER0, 1, 1.0, pull_too=True), bpush(WORKER1, 1, 2.0, pull_too=True)
        srv.handle_request(a, fake)
        assert not fake.answered(a)                             # the round needs 2 pushes
        srv.handle_request(b, fake)
        # (1 + 2) scaled by 3 workers / 2 contributors = 4.5 -> 10 - 4.5
        assert values(fake, a) == values(fake, b) == [5.5] * 4
        late = bpush(WORKER2, 1, 100.0, pull_too=True)          # computed on version 0
        srv.handle_request(late, fake)
        assert values(fake, late) == [5.5] * 4                  # joined round 1; no wait
        on_time = [bpush(s, 1, 1.0, pull_too=True) for s in (WORKER0, WORKER1)]
        for req in on_time:
            srv.handle_request(req, fake)
        # (100 + 1 + 1) scaled by 3 workers / 3 pushes -> 5.5 - 102
        assert values(fake, on_time[0]) == values(fake, on_time[1]) == [-96.5] * 4
        assert srv._keys[1].rounds.joined_late == 1 and srv._keys[1].rounds.dropped == 0
        current = pull(WORKER2, 1)                              # a default pull reads them too
        srv.handle_request(current, fake)
        assert values(fake, current) == [-96.5] * 4


def test_a_worker_left_alone_by_workers_in_a_barrier_hears_the_training_is_over():
    # 3 workers, 1 backup: with two in a barrier no round gathers W - b = 2 gradients, and
    # none is applied with fewer, scaled up (issue 62)
    srv, fake = backup_server()
    with srv:
        srv.handle_command(command(WORKER1, ServerCommand.BYTEPS_ABSENT, b"1"), fake)
        waits = bpush(WORKER0, 1, 1.0, pull_too=True)
        srv.handle_request(waits, fake)
        assert not fake.answered(waits)                         # 2 left: W - b needed
        srv.handle_command(command(WORKER2, ServerCommand.BYTEPS_ABSENT, b"1"), fake)
        assert "training over: 0 of 3 finished training and 2 wait in a barrier" in \
            fake.wait_for(waits).error                           # 1 left: over for it
        srv.handle_command(command(WORKER1, ServerCommand.BYTEPS_ABSENT, b"0"), fake)
        srv.handle_command(command(WORKER2, ServerCommand.BYTEPS_ABSENT, b"0"), fake)
        again = bpush(WORKER0, 1, 1.0, pull_too=True)          # back: rounds close again
        srv.handle_request(again, fake)
        srv.handle_request(bpush(WORKER1, 1, 1.0), fake)
        assert values(fake, again) == [7.0] * 4                 # (1 + 1) x 3 / 2 from 10


def test_the_probe_refuses_a_worker_that_trains_otherwise():
    srv, fake = backup_server()
    with srv:
        same = command(WORKER0, ServerCommand.BYTEPS_PROBE, MODE)
        srv.handle_command(same, fake)
        assert fake.wait_for(same).error is None and fake.wait_for(same).body == PROBE_ANSWER
        other = command(WORKER1, ServerCommand.BYTEPS_PROBE, b"sync")
        srv.handle_command(other, fake)
        assert "this server trains sync with 1 backup worker, the worker sync" in \
            fake.wait_for(other).error


def test_a_partition_takes_its_mxnet_keys_multipliers_with_a_real_optimizer():
    """The servers update partitions (their local keys) but an optimizer finds multipliers by
    MXNet key or name (Module's idx2name: no weight decay on biases), as MXNet's server does."""
    sgd = mx.optimizer.SGD(learning_rate=1.0, wd=0.1, rescale_grad=1.0,
                           param_idx2name={0: "fc_weight", 1: "fc_bias"})
    srv, fake = BytePSServer(3, summing_threads=2, backup_workers=1), FakeServer()
    with srv:
        srv.handle_command(command(WORKER0, ServerCommand.CONTROLLER, pickle.dumps(sgd, 0)), fake)
        weight_part1, bias = 1, 1 << 16          # key 0's 2nd partition, key 1's 1st
        for ps_key in (weight_part1, bias):
            srv.handle_request(bpush(WORKER0, ps_key, 1.0), fake)          # initial 1.0
        answers = {}
        for ps_key in (weight_part1, bias):
            reqs = [bpush(s, ps_key, 0.0, pull_too=True) for s in (WORKER0, WORKER1)]
            for req in reqs:
                srv.handle_request(req, fake)
            answers[ps_key] = values(fake, reqs[0])
    assert np.allclose(answers[weight_part1], 0.9)                          # decayed
    assert answers[bias] == [1.0] * 4                                       # no weight decay


def test_once_two_of_three_finished_the_late_worker_hears_the_training_is_over():
    srv, fake = backup_server()
    with srv:
        late = bpush(WORKER2, 1, 100.0, pull_too=True)          # round 0, waits for another
        srv.handle_request(late, fake)
        assert not fake.answered(late)
        srv.handle_command(command(WORKER0, ServerCommand.BYTEPS_ABSENT, b"2"), fake)
        for body in (b"1", b"0"):          # a barrier after its training: it stays done
            srv.handle_command(command(WORKER0, ServerCommand.BYTEPS_ABSENT, body), fake)
        srv.handle_command(command(WORKER1, ServerCommand.BYTEPS_ABSENT, b"2"), fake)
        assert fake.wait_for(late).error.startswith(TRAINING_OVER)   # not applied alone
        again = bpush(WORKER2, 1, 100.0, pull_too=True)
        srv.handle_request(again, fake)
        assert "2 of 3 finished training" in fake.wait_for(again).error
        read = pull(WORKER0, 1)
        srv.handle_request(read, fake)
        assert values(fake, read) == [10.0] * 4                 # nothing was applied
        stale = {}
        for sender in (WORKER0, WORKER2):
            req = command(sender, ServerCommand.BYTEPS_STALE)
            srv.handle_command(req, fake)
            stale[sender] = fake.wait_for(req).body
        assert stale == {WORKER0: b"0/1", WORKER2: b"0/1"}      # no round closed: all current


def test_a_worker_that_missed_the_last_round_is_stale():
    srv, fake = backup_server()
    with srv:
        reqs = [bpush(sender, 1, 1.0, pull_too=True) for sender in (WORKER0, WORKER1)]
        for req in reqs:
            srv.handle_request(req, fake)
        values(fake, reqs[0])                                   # the round closed
        answers = {}
        for sender in (WORKER0, WORKER2):
            req = command(sender, ServerCommand.BYTEPS_STALE)
            srv.handle_command(req, fake)
            answers[sender] = fake.wait_for(req).body
        assert answers == {WORKER0: b"0/1", WORKER2: b"1/1"}


def test_a_round_waits_a_little_for_the_last_worker_on_time_and_closes_without_it_after():
    # every push on time for two rounds, 0.2 s apart: a round with W - b = 2 then waits a
    # quarter of that for the third (taking its gradient: nothing stale, nothing scaled), and
    # closes without it once the wait is over
    import time
    srv, fake = backup_server()
    with srv:
        weight = 10.0
        for _ in range(2):
            time.sleep(0.2)
            reqs = [bpush(s, 1, 1.0, pull_too=True) for s in (WORKER0, WORKER1, WORKER2)]
            for req in reqs:
                srv.handle_request(req, fake)
            weight = values(fake, reqs[0])[0]
        time.sleep(0.2)
        first = [bpush(s, 1, 1.0, pull_too=True) for s in (WORKER0, WORKER1)]
        for req in first:
            srv.handle_request(req, fake)
        time.sleep(0.01)
        assert not fake.answered(first[0])                      # waits for the third
        third = bpush(WORKER2, 1, 4.0, pull_too=True)
        srv.handle_request(third, fake)
        weight -= 1.0 + 1.0 + 4.0                               # all three, not scaled
        assert values(fake, first[0]) == values(fake, third) == [weight] * 4
        time.sleep(0.2)
        started = time.monotonic()
        alone = [bpush(s, 1, 1.0, pull_too=True) for s in (WORKER0, WORKER1)]
        for req in alone:
            srv.handle_request(req, fake)
        assert values(fake, alone[0]) == [weight - 3.0] * 4     # 2 gradients scaled by 3 / 2
        assert 0.03 <= time.monotonic() - started < 0.5
        assert srv._keys[1].rounds.joined_late == 0 and srv._keys[1].rounds.dropped == 0
