"""A worker in a barrier while the others wait for its pushes (kvstore_byteps/engine/stuck.py)
and the servers' side of the question (BYTEPS_WAITING): pure, no sockets."""
import threading

import numpy as np
import pytest

from kvstore_byteps.engine.stuck import (BarrierPort, BarrierWatch, Waiting, WorkerBarriers,
                                         parse, reason, stuck)
from kvstore_byteps.mxproto import WAITING_SHOWN, ServerCommand
from kvstore_byteps.serving.rounds import KeyRounds
from kvstore_byteps.serving.summed import SummedRounds

pytestmark = pytest.mark.unit


def test_a_round_others_pushed_waits_for_the_worker_that_did_not():
    rounds = KeyRounds(ps_key=7, num_workers=3, size=4, dtype=np.float32)
    assert rounds.waiting_for(9) is None
    rounds.begin_push(11)
    rounds.begin_push(13)
    assert rounds.waiting_for(9) == (0, [11, 13])      # round 0 needs worker 9's push
    assert rounds.waiting_for(11) is None              # 11 pushed it
    rounds.begin_push(9)
    assert rounds.waiting_for(9) is None


class _Key:
    def __init__(self, ps_key, rounds):
        self.ps_key, self.rounds = ps_key, rounds


def test_the_servers_answer_names_the_rounds_and_who_pushed_them_and_parses_back():
    keys = []
    for ps_key in range(WAITING_SHOWN + 2):
        rounds = KeyRounds(ps_key, 2, 4, np.float32)
        rounds.begin_push(11)
        keys.append(_Key(ps_key, rounds))
    path = SummedRounds.__new__(SummedRounds)       # worker_command reads nothing else
    body = path.worker_command(ServerCommand.BYTEPS_WAITING, 9, b"", keys)
    assert parse(body) == [Waiting(k, 0, (11,)) for k in range(WAITING_SHOWN)]   # at most
    assert path.worker_command(ServerCommand.BYTEPS_WAITING, 11, b"", keys) == b""
    assert parse(b"") == []


def test_only_rounds_that_still_wait_unchanged_are_stuck():
    first = [Waiting(1, 0, (11,)), Waiting(2, 5, (11,))]
    assert stuck(first, [Waiting(2, 5, (11,))]) == [Waiting(2, 5, (11,))]
    assert stuck(first, [Waiting(1, 1, (11,))]) == []     # it pushed meanwhile: moving
    assert stuck(first, []) == []


def watch_until(asks, barrier_passes=None, after=0.05, again=0.05):
    """Arm a watch whose ``ask`` answers ``asks`` in turn; what ``end`` got, or None."""
    answers, ended = list(asks), []
    done = threading.Event()

    def end(what, rounds):
        ended.append((what, rounds))
        done.set()
    watch = BarrierWatch(lambda: answers.pop(0) if answers else [], end, after, again)
    watch.arm("declaring key 5")
    if barrier_passes is not None:
        threading.Timer(barrier_passes, watch.disarm).start()
    done.wait(0.5)
    watch.close()
    return ended[0] if ended else None


def test_a_barrier_whose_rounds_stay_waiting_ends_the_job_naming_what_it_waits_in():
    waiting = [Waiting(3, 2, (11,))]
    assert watch_until([waiting, waiting]) == ("declaring key 5", waiting)


def test_a_barrier_that_passes_or_rounds_that_move_end_nothing():
    waiting = [Waiting(3, 2, (11,))]
    assert watch_until([waiting, [Waiting(3, 3, (11,))]]) is None     # progress
    assert watch_until([[], []]) is None                               # nobody waits
    assert watch_until([waiting, waiting], barrier_passes=0.01, after=0.2) is None


def test_the_reason_names_both_sides_the_rounds_and_the_cause():
    rounds = [Waiting(5, 2, (11, 13))] + [Waiting(k, 0, (11,)) for k in range(3)]
    said = reason(1, "declaring key 4", None, rounds, lambda ps_key: "key %d" % ps_key)
    assert said.startswith("worker rank 1 waits declaring key 4 while worker ranks 1, 2 wait "
                           "at the servers for its push of key 5 round 2; key 0 round 0; key 1 "
                           "round 0 and more: the workers' programs differ")
    assert reason(0, "in the shutdown barrier", "its program stopped", rounds[:1],
                  str).endswith("wait at the servers for its push of 5 round 2: its program "
                                "stopped")


def test_a_worker_with_a_pushpull_still_to_begin_is_not_stuck():
    asked = []
    port = BarrierPort(lambda: 0, lambda: asked.append(1) or [Waiting(1, 0, (11,))],
                       lambda timeout, kind: None, lambda why: None, str)
    barriers = WorkerBarriers(port)
    barriers.called()
    assert barriers._ask() == [] and asked == []         # its push is still to come
    barriers.begun()
    assert barriers._ask() == [Waiting(1, 0, (11,))] and asked == [1]
