"""BackupRounds under random interleavings: many keys on two servers, workers that each push
every key then wait for every pull before their next step (as gluon's Trainer does), channels
that deliver at their own pace, summing threads that close rounds while pushes arrive, workers
that finish (``BYTEPS_ABSENT`` done) or hear that the training is over. Every run must end with
no pull left unanswered (a deadlock between rounds of different keys hung real jobs: issue 46)
and each round's sum must hold exactly the gradients it counted. Pure: no server, no network."""
import collections
import random

import numpy as np
import pytest

from kvstore_byteps.serving.backup_rounds import ENDED, BackupRounds

KEYS, SERVERS, STEPS = 6, 2, 30


class Job:
    """One simulated job: the servers' rounds, the workers' steps and the messages between."""

    def __init__(self, seed: int, workers: int, backup: int, slow=None):
        self.rnd = random.Random(seed)
        self.rounds = [BackupRounds(k, workers, backup, 1, np.float64) for k in range(KEYS)]
        self.channels = {(w, s): collections.deque() for w in range(workers)
                         for s in range(SERVERS)}
        # each channel delivers at its own pace; a slow worker's channels slower still
        self.pace = {c: self.rnd.choice([0.2, 1.0, 1.0, 3.0]) * (0.4 if c[0] == slow else 1.0)
                     for c in self.channels}
        self.summing = [collections.deque() for _ in range(KEYS)]     # one thread per key
        self.waiting = {w: set() for w in range(workers)}             # keys with a pull out
        self.steps = [0] * workers
        self.training = [True] * workers
        self.over = [False] * workers
        self.summed_gradients = 0
        for w in range(workers):
            self.start_step(w)

    def start_step(self, w: int) -> None:
        if self.over[w] or self.steps[w] == STEPS:       # done: tell every server
            self.training[w] = False
            for s in range(SERVERS):
                self.channels[(w, s)].append(("done", None))
            return
        self.steps[w] += 1
        for k in self.rnd.sample(range(KEYS), KEYS):      # priorities reorder the keys
            self.channels[(w, k % SERVERS)].extend([("push", k), ("pull", k)])
            self.waiting[w].add(k)

    def answer(self, w: int, k: int, over: bool = False) -> None:
        self.waiting[w].discard(k)
        self.over[w] |= over
        if not self.waiting[w] and self.training[w]:
            self.start_step(w)

    def close(self, k: int, complete) -> None:
        total, gradients = complete
        assert total[0] == gradients, "round sum %s of %d gradients" % (total[0], gradients)
        # never a round that fewer than W - b workers pushed into (issue 62: a straggler's
        # rounds closed alone while the others waited in a barrier); its gradients are fewer
        # only where a push was too late to sum
        assert self.rounds[k].pushed_by >= self.rounds[k].needed, "%d pushed" % (
            self.rounds[k].pushed_by)
        self.summed_gradients += gradients
        for w in self.rounds[k].close():
            self.answer(w, k)

    def recheck(self, k: int) -> None:
        def task():
            complete = self.rounds[k].recheck()
            if complete is not None:     # the update runs next on this thread, then close
                self.summing[k].appendleft(lambda: self.close(k, complete))
        self.summing[k].append(task)

    def receive(self, w: int, s: int) -> None:
        what, k = self.channels[(w, s)].popleft()
        if what == "push":
            r = self.rounds[k].begin_push(w)
            if r is None:
                self.recheck(k)
                return

            def add():
                complete = self.rounds[k].add(r, np.ones(1))
                if complete is not None:
                    self.summing[k].appendleft(lambda: self.close(k, complete))
            self.summing[k].append(add)
        elif what == "pull":
            version = self.rounds[k].request_pull(w, w)
            if version is not None:
                self.answer(w, k, over=version == ENDED)
        else:
            for k in range(s, KEYS, SERVERS):
                for waiter in self.rounds[k].finish(w):
                    self.answer(waiter, k, over=True)
                self.recheck(k)

    def run(self) -> None:
        while True:
            ready = [("receive", c) for c, q in self.channels.items() if q]
            ready += [("sum", k) for k in range(KEYS) if self.summing[k]]
            if not ready:
                return
            kind, what = self.rnd.choices(
                ready, [self.pace[what] if kind == "receive" else 1.0 for kind, what in ready])[0]
            if kind == "sum":
                self.summing[what].popleft()()
            else:
                self.receive(*what)


@pytest.mark.parametrize("workers, backup, slow", [(3, 1, None), (4, 1, 3), (5, 2, None)])
def test_every_pull_is_answered_and_every_sum_holds_what_it_counted(workers, backup, slow):
    for seed in range(100):
        job = Job(seed, workers, backup, slow)
        job.run()
        stuck = {w: sorted(keys) for w, keys in job.waiting.items() if keys}
        assert not stuck, "seed %d: pulls never answered (worker: keys) %s after steps %s" % (
            seed, stuck, job.steps)
        assert not any(job.training)
        # a worker ran every step, and the others were stopped only once fewer than W - b
        # workers were left: the first W - b - 1 to finish ran every step too
        assert sorted(job.steps)[backup + 1:] == [STEPS] * (workers - backup - 1), job.steps
        assert job.summed_gradients > 0
