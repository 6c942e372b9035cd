"""BackupRounds (serving/backup_rounds.py): rounds close at W - b pushes, late pushes join a
later round, very stale ones are dropped and counted, pulls get the first weights newer than what they pushed, absent workers
are not waited for. Pure: no server, no network."""
import numpy as np
import pytest

from kvstore_byteps.errors import ProtocolError
from kvstore_byteps.serving.backup_rounds import ENDED, MAX_LATE_ROUNDS, BackupRounds


def rounds(workers=3, backup=1):
    return BackupRounds(7, workers, backup, 2, np.float64)


def push(r, sender, value):
    """A push and its summation, as the server does them (receive, then summing thread)."""
    n = r.begin_push(sender)
    return n, (None if n is None else r.add(n, np.full(2, float(value))))


def test_a_round_closes_at_w_minus_b_pushes_and_a_late_push_joins_the_next():
    r = rounds()
    assert push(r, 9, 1) == (0, None)
    n, complete = push(r, 11, 2)
    assert n == 0 and complete[1] == 2 and list(complete[0]) == [3.0, 3.0]
    assert r.request_pull(9, "pull9") is None          # waits for the close
    assert r.close() == ["pull9"] and r.version == 1
    assert push(r, 13, 100) == (1, None)               # computed on round 0's weights: late
    assert r.request_pull(13, "pull13") == 1           # never waits: the current weights
    assert r.request_pull(11, "pull11") == 1           # its round closed already
    assert push(r, 9, 1) == (1, None)                  # one on time: W - b = 2 not reached
    n, complete = push(r, 11, 2)                       # two on time, and the late one
    assert complete[1] == 3 and list(complete[0]) == [103.0, 103.0]
    assert r.close() == [] and r.joined_late == 1 and r.dropped == 0


def test_a_round_closes_once_every_worker_present_pushed_into_it_late_or_not():
    r = rounds()                                       # 3 workers, W - b = 2
    push(r, 9, 1)
    assert push(r, 13, 1)[1][1] == 2
    r.request_pull(9, "t9"), r.request_pull(13, "t13")
    r.close()
    r.finish(13)                                       # two left: 9 and 11
    assert push(r, 11, 5) == (1, None)                 # late (read round 0's weights)
    assert r.request_pull(11, "t11") == 1
    n, complete = push(r, 9, 1)                        # 11's next push (on time) is not
    assert n == 1 and complete[1] == 2                 # waited for: it may wait on a round
    assert list(complete[0]) == [6.0, 6.0]             # of another key that waits for 9


def test_a_late_push_and_the_next_on_time_are_two_gradients_of_one_round():
    r = rounds(workers=4, backup=1)
    for sender in (9, 11, 13):
        push(r, sender, 1)
        r.request_pull(sender, sender)
    r.close()
    assert push(r, 15, 10) == (1, None)                # late (read 0), answered at once
    assert r.request_pull(15, "t15") == 1
    assert push(r, 15, 20) == (1, None)                # on time in the same round
    push(r, 9, 1)
    total, pushed = push(r, 11, 1)[1]
    assert pushed == 4 and list(total) == [32.0, 32.0]   # 3 on time (W - b) + the late one


def test_a_push_later_than_max_late_rounds_is_dropped_and_its_worker_skips_ahead():
    r = rounds()
    for _ in range(MAX_LATE_ROUNDS + 1):
        push(r, 9, 1), push(r, 11, 1)
        r.request_pull(9, "t9"), r.request_pull(11, "t11")
        r.close()
    assert push(r, 13, 5) == (None, None) and r.dropped == 1     # read version 0
    assert r.request_pull(13, "t13") == MAX_LATE_ROUNDS + 1      # the current weights
    assert push(r, 13, 5)[0] == MAX_LATE_ROUNDS + 1              # on time again



def test_a_second_push_before_the_answer_is_refused():
    r = rounds()
    r.begin_push(9)
    with pytest.raises(ProtocolError, match="again before its pull"):
        r.begin_push(9)


def test_with_fewer_than_w_minus_b_workers_left_no_round_closes_until_they_are_back():
    # issue 62: workers that ended their loop with a barrier left a straggler whose every
    # step closed a round alone, scaled by W
    r = rounds(workers=3, backup=1)
    r.begin_push(9)
    r.add(0, np.ones(2))
    assert r.request_pull(9, "t9") is None and r.recheck() is None     # needs 2
    assert r.set_absent(11, True) == [] and not r.over      # 2 left: W - b
    assert r.shortage_to_watch() == 0
    assert r.set_absent(13, True) == [] and not r.over      # 1 left: short, not over yet
    assert r.recheck() is None and r.version == 0           # its lone push closes nothing
    spell = r.shortage_to_watch()                           # the server's SHORTAGE_GRACE
    assert spell and r.shortage_to_watch() == 0             # watched once
    assert r.end_shortage(spell) == ["t9"] and r.over       # it lasted: over for it
    assert r.begin_push(9) is None and r.request_pull(9, "again") == ENDED
    assert r.set_absent(11, False) == [] and not r.over     # back: rounds close again
    assert r.needed == 2 and not r.ended


def test_pushes_are_summed_only_when_all_counted_pushes_arrived():
    r = rounds(workers=4, backup=1)
    for sender in (9, 11, 13):
        assert r.begin_push(sender) == 0
    assert r.add(0, np.ones(2)) is None and r.add(0, np.ones(2)) is None
    total, count = r.add(0, np.ones(2))
    assert count == 3 and list(total) == [3.0, 3.0]


def test_a_push_after_w_minus_b_but_before_the_close_is_summed_in():
    r = rounds(workers=4, backup=1)
    for sender in (9, 11, 13):
        assert r.begin_push(sender) == 0
    assert r.add(0, np.ones(2)) is None and r.add(0, np.ones(2)) is None
    assert r.begin_push(15) == 0                       # W - b are in, not yet summed
    assert r.add(0, np.ones(2)) is None                # waits for the fourth
    total, count = r.add(0, np.full(2, 10.0))
    assert count == 4 and list(total) == [13.0, 13.0] and r.dropped == 0


def test_a_push_while_the_round_closes_joins_the_next_round():
    r = rounds(workers=3, backup=1)
    push(r, 9, 1)
    assert push(r, 11, 2)[1][1] == 2                   # complete: its update is computed now
    assert r.begin_push(13) == 1                       # on time, but the round is closing
    assert r.request_pull(13, "t13") is None           # answered at the close
    assert r.request_pull(9, "t9") is None and r.request_pull(11, "t11") is None
    assert sorted(r.close()) == ["t11", "t13", "t9"] and r.version == 1
    assert r.add(1, np.full(2, 5.0)) is None           # 13's gradient, now in round 1
    assert push(r, 9, 1)[1] is None                    # 13's is late: one on time
    total, count = push(r, 11, 1)[1]
    assert count == 3 and list(total) == [7.0, 7.0]
    assert r.dropped == 0 and r.joined_late == 1


def test_backup_workers_need_more_workers():
    with pytest.raises(ProtocolError, match="at least 3 workers"):
        BackupRounds(1, 2, 2, 1, np.float32)


def test_once_w_minus_b_workers_finished_no_round_closes_and_late_pulls_hear_it():
    r = rounds(workers=4, backup=1)
    assert r.begin_push(15) == 0                       # the straggler's push of round 0
    r.add(0, np.ones(2))
    assert r.request_pull(15, "t15") is None           # waits for the round
    assert r.finish(9) == [] and not r.over            # 3 left: W - b
    assert r.finish(11) == ["t15"] and r.over          # 2 left: no round can close
    assert not r.ended and r.needed == 3
    assert r.finish(13) == [] and r.ended              # 3 of 4 finished: over for good
    assert r.recheck() is None                         # its lone push closes nothing
    assert r.begin_push(15) is None and r.dropped_after_end == 1
    assert r.request_pull(15, "again") == ENDED
    assert r.version == 0


def test_a_worker_is_stale_until_it_reads_the_latest_weights():
    r = rounds()
    push(r, 9, 1), push(r, 11, 1)
    r.request_pull(9, "t9"), r.request_pull(11, "t11")
    r.close()
    assert not r.stale(9) and r.stale(13)              # 13 last read version 0
    r.note_read(13)
    assert not r.stale(13)


def test_a_leftover_late_gradient_stays_out_of_the_weights_read_after_a_barrier():
    r = rounds()
    push(r, 9, 1)
    push(r, 11, 1)
    r.request_pull(9, "t9"), r.request_pull(11, "t11")
    r.close()
    assert push(r, 13, 5) == (1, None)                 # late: joins round 1, nobody waits
    assert r.request_pull(13, "t13") == 1
    for sender in (9, 11, 13):                         # the workers wait in a barrier
        r.set_absent(sender, True)
    assert r.recheck() is None and r.version == 1      # what they read next is round 1's


class Clock:
    """A clock the test moves by hand."""

    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def waiting_rounds(clock, wait=0.25):
    """4 workers, W - b = 3, one round (10 s, close to close) behind them: every worker known."""
    r = BackupRounds(7, 4, 1, 2, np.float64, wait, clock)
    for round_ in range(2):
        for sender in (9, 11, 13, 15):              # all four in before any is summed
            assert r.begin_push(sender) == round_
        complete = [r.add(round_, np.ones(2)) for _ in range(4)][-1]
        assert complete[1] == 4
        for sender in (9, 11, 13, 15):
            r.request_pull(sender, sender)
        r.close()
        clock.now += 10.0
    return r


def test_a_quorate_round_waits_a_little_for_the_workers_on_time_and_takes_their_push():
    clock = Clock()
    r = waiting_rounds(clock)
    for sender in (9, 11, 13):
        assert push(r, sender, 1)[1] is None           # W - b in: waits for 15
    assert r.due() == clock.now + 2.5 and r.due() is None   # a quarter of the last round, said once
    clock.now += 1.0
    total, count = push(r, 15, 1)[1]                   # in time: a full round, nothing late
    assert count == 4 and list(total) == [4.0, 4.0] and r.joined_late == 0


def test_a_quorate_round_closes_without_the_last_worker_once_its_wait_is_over():
    clock = Clock()
    r = waiting_rounds(clock)
    for sender in (9, 11, 13):
        push(r, sender, 1)
    due = r.due()
    clock.now = due - 0.01
    assert r.recheck() is None
    clock.now = due
    assert r.recheck()[1] == 3
    for sender in (9, 11, 13):
        r.request_pull(sender, sender)
    r.close()
    assert push(r, 15, 1) == (3, None)                 # 15's push is 1 round late: it joins
    r.request_pull(15, "t15")
    for sender in (9, 11):
        push(r, sender, 1)
    assert push(r, 13, 1)[1] is None and r.due()       # and is waited for in the next round
    clock.now += 5.0
    assert r.recheck()[1] == 4                         # (it did not come: closed after)
    for sender in (9, 11, 13):
        r.request_pull(sender, sender)
    r.close()
    for sender in (9, 11, 13):                         # 15 misses another round: 2 behind
        push(r, sender, 1)
        r.request_pull(sender, sender)
    r.close()
    assert push(r, 15, 1) == (None, None) and r.dropped == 1   # too late: dropped, behind
    for sender in (9, 11):
        push(r, sender, 1)
    assert push(r, 13, 1)[1][1] == 3                   # not waited for: W - b close at once
    assert r.due() is None


def test_without_a_wait_or_a_round_behind_a_quorate_round_closes_at_once():
    clock = Clock()
    r = waiting_rounds(clock, wait=0.0)
    for sender in (9, 11):
        push(r, sender, 1)
    assert push(r, 13, 1)[1][1] == 3 and r.due() is None
    r = BackupRounds(7, 4, 1, 2, np.float64, 0.25, clock)   # no round yet: nothing to measure
    for sender in (9, 11):
        push(r, sender, 1)
    assert push(r, 13, 1)[1][1] == 3 and r.due() is None


def test_a_quorate_round_does_not_wait_for_a_worker_in_a_barrier():
    clock = Clock()
    r = waiting_rounds(clock)
    r.set_absent(15, True)
    for sender in (9, 11):
        push(r, sender, 1)
    assert push(r, 13, 1)[1][1] == 3


def test_the_first_worker_back_from_a_barrier_waits_for_the_others_to_say_so():
    # workers leave a barrier together but tell the servers a few ms apart: the first one's
    # push and pull come while the others still count as away; its pull must wait for the
    # round, not hear that the training is over (once in ~50 runs every worker stopped at
    # step 1 so)
    r = rounds(workers=4, backup=1)
    for sender in (9, 11, 13, 15):
        r.set_absent(sender, True)
    r.set_absent(9, False)
    assert r.begin_push(9) == 0 and r.add(0, np.ones(2)) is None
    assert r.request_pull(9, "t9") is None and not r.over
    spell = r.shortage_to_watch()
    for sender in (11, 13, 15):
        r.set_absent(sender, False)
    assert r.end_shortage(spell) == [] and not r.over       # they came back in time
    for sender in (11, 13):
        r.begin_push(sender)
    r.add(0, np.ones(2))
    assert r.add(0, np.ones(2))[1] == 3 and r.close() == ["t9"]


def test_a_shortage_that_a_finished_worker_starts_is_watched_too():
    # one worker waits in a barrier, then another finishes: fewer than W - b present from
    # then on; the spell must be watched, or the last one's pull would wait for ever
    r = rounds(workers=4, backup=1)
    r.set_absent(11, True)
    r.begin_push(9)
    r.add(0, np.ones(2))
    assert r.request_pull(9, "t9") is None
    assert r.finish(13) == [] and not r.over                # 11 may still come back
    spell = r.shortage_to_watch()
    assert spell and r.end_shortage(spell) == ["t9"] and r.over
