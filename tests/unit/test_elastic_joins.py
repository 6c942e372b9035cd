"""Elastic workers, a worker taking a departed one's place (the parts without a network): the
scheduler seats a late worker in a departed place and counts it in the join barrier only
until it passed it (never in the others' key-pairing barriers); a node follows the notices;
server rank 0's join board decides one set of joiners per commit; a key's rounds admit the late
worker between rounds; the worker's side commits, joins and fails on a deadline. Real
processes: tests/cluster/test_elastic.py."""
import numpy as np
import pytest

from kvstore_byteps.config import Role
from kvstore_byteps.engine.joins import JoinPort, Joins
from kvstore_byteps.errors import DeadlineError, JobFinished, ProtocolError, TrainingOver
from kvstore_byteps.mxproto import ServerCommand
from kvstore_byteps.serving.joins import JoinBoard
from kvstore_byteps.serving.rounds import Departed, KeyRounds
from kvstore_byteps.van.runtime.departures import ARRIVAL_WAIT_S
from kvstore_byteps.van.runtime.membership import (NodeDead, NodeJoined, NodeLeft, Ready, Refused,
                                                   VanClock, barrier_request, control_message)
from kvstore_byteps.van.runtime.node_membership import NodeMembership
from kvstore_byteps.van.wire.message import ControlCommand, Control, Message, Meta

from tests.unit.test_elastic import (elastic_scheduler, from_sender, keep_alive, node,
                                     push_round, sends, worker_id)

F32 = np.float32


def late_worker(port, rank_hint=None):
    n = node(Role.WORKER, port)
    n.rank_hint = rank_hint
    return Message(Meta(control=Control(cmd=ControlCommand.ADD_NODE, nodes=[n]), request=True))


def lose(sched, rank, now):
    """Worker ``rank``'s connection closes: it leaves."""
    return sched.peer_closed(worker_id(rank), now)


def barrier(sched, rank, now, kind="", group=4):
    return sends(sched.handle(from_sender(barrier_request(group, 0, VanClock(), kind),
                                          worker_id(rank)), now))


def test_a_late_worker_takes_its_ranks_departed_place_and_joins_in_the_join_barrier():
    sched = elastic_scheduler(workers=4, min_workers=2)
    lose(sched, 1, 11.0)
    lose(sched, 2, 11.5)
    assert sched.departures.left.keys() == {11, 13}
    actions = sched.handle(late_worker(3002, rank_hint=2), 12.0)
    [joined] = [a for a in actions if isinstance(a, NodeJoined)]
    assert joined.node.id == 13 and joined.node.port == 3002      # its own rank's place
    *others, welcome, left = sends(actions)
    assert welcome.meta.recver == 13 and welcome.meta.extra == {"worker_joined": True}
    assert [n.id for n in welcome.meta.control.nodes][-1] == 1     # the node list, scheduler last
    # it hears of the other departure; every other node hears of it (first) and connects
    assert (left.meta.recver, left.meta.extra) == (13, {"worker_left": True})
    assert sorted(m.meta.recver for m in others) == [8, 9, 15]
    assert all(m.meta.control.nodes[0].id == 13 and m.meta.extra == {"worker_joined": True}
               for m in others)
    # joining: no barrier of the others waits for it ...
    assert barrier(sched, 0, 13.0) == []
    assert sorted(m.meta.recver for m in barrier(sched, 3, 13.0)) == [9, 15]
    # ... but the join barrier does, and from there on it is a member like the others
    assert barrier(sched, 0, 14.0, "join:13") == [] and barrier(sched, 3, 14.0, "join:13") == []
    assert sorted(m.meta.recver for m in barrier(sched, 2, 14.0, "join:13")) == [9, 13, 15]
    assert barrier(sched, 0, 15.0) == [] and barrier(sched, 3, 15.0) == []
    assert sorted(m.meta.recver for m in barrier(sched, 2, 15.0)) == [9, 13, 15]
    # the others pair their key inits without it (it reads the keys, never initialises)
    assert barrier(sched, 0, 16.0, "declare") == []
    assert sorted(m.meta.recver for m in barrier(sched, 3, 16.0, "declare")) == [9, 15]
    # a second late worker, with no rank of its own, takes the place that is left
    [second] = [a for a in sched.handle(late_worker(3005), 17.0) if isinstance(a, NodeJoined)]
    assert second.node.id == 11 and not sched.departures.left


def test_a_late_worker_waits_for_a_departure_then_is_refused_naming_why():
    sched = elastic_scheduler(workers=4, min_workers=3, timeout=5.0)
    assert sched.handle(late_worker(3002, rank_hint=2), 12.0) == []    # nobody left yet
    keep_alive(sched, 16.0, silent=(worker_id(2),))
    actions = sched.tick(17.5)           # worker 2's heartbeats stopped: it leaves, and is
    assert [a.node.id for a in actions if isinstance(a, NodeLeft)] == [13]   # replaced
    assert [a.node.port for a in actions if isinstance(a, NodeJoined)] == [3002]
    # a fifth worker finds no place: the job does not grow
    assert sched.handle(late_worker(3004), 18.0) == []
    keep_alive(sched, 18.0 + 5.0 + ARRIVAL_WAIT_S)
    [refused] = [a for a in sched.tick(18.5 + 5.0 + ARRIVAL_WAIT_S) if isinstance(a, Refused)]
    assert "does not grow beyond DMLC_NUM_WORKER=4" in refused.reason
    plain = elastic_scheduler(workers=4, min_workers=0)
    [refused] = plain.handle(late_worker(3002), 12.0)
    assert isinstance(refused, Refused) and "elastic job" in refused.reason


def test_a_seats_next_process_joins_at_a_commit_of_its_own():
    # worker 13 joined at commit 3 and died; the next process in its seat (a second restart,
    # or a worker started by hand) must not take commit 3's answer (it would wait in a join
    # barrier the others passed long ago: a helper's job hung); nor one that left unjoined
    board = JoinBoard()
    board.join(13)
    board.commit(9, b"2\n{}")
    board.commit(9, b"3\n{}")
    assert board.join(13).startswith(b"3\n")
    board.depart(13)
    for n in range(4, 8):
        board.commit(9, b"%d\n{}" % n)
    assert board.join(13) == b""                 # asks anew: nothing decided for it yet
    assert board.commit(9, b"8\n{}") == b"13"
    board.depart(13)                             # it left before joining; the next one ...
    assert board.join(13) == b"" and board.commit(9, b"9\n{}") == b"13"
    board.commit(9, b"10\n{}")
    assert board.join(13).startswith(b"10\n")  # ... joins at 10, not at 9


def test_a_join_barrier_waits_for_its_own_joiners_not_for_a_worker_seated_later():
    # two late workers seated a moment apart (a helper's run hung 300 s): the first joins at
    # commit m; the second, seated before the others reached m, asks to join only later and
    # must not hold m's join barrier (it joins at a later commit, in a barrier of its own)
    sched = elastic_scheduler(workers=4, min_workers=2)
    lose(sched, 1, 11.0)
    lose(sched, 2, 11.5)
    sched.handle(late_worker(3001, rank_hint=1), 12.0)
    sched.handle(late_worker(3002, rank_hint=2), 12.1)
    assert sched.departures.joining.keys() == {11, 13}
    assert barrier(sched, 0, 13.0, "join:11") == [] and barrier(sched, 3, 13.0, "join:11") == []
    assert sorted(m.meta.recver for m in barrier(sched, 1, 13.0, "join:11")) == [9, 11, 15]
    # the program's own barriers count the joined one, not the one still joining
    assert barrier(sched, 0, 14.0) == [] and barrier(sched, 1, 14.0) == []
    assert sorted(m.meta.recver for m in barrier(sched, 3, 14.0)) == [9, 11, 15]
    assert barrier(sched, 0, 15.0, "join:13") == []     # later: the second one's barrier
    for rank in (1, 3):
        barrier(sched, rank, 15.0, "join:13")
    assert sorted(m.meta.recver for m in barrier(sched, 2, 15.0, "join:13")) == [9, 11, 13, 15]
    # two decided at one commit pass one barrier naming both
    lose(sched, 3, 15.5)
    sched.handle(late_worker(3003, rank_hint=3), 15.6)
    lose(sched, 2, 15.7)
    sched.handle(late_worker(3004, rank_hint=2), 15.8)
    for rank in (0, 1, 2):
        assert barrier(sched, rank, 15.9, "join:13,15") == []
    assert sorted(m.meta.recver for m in barrier(sched, 3, 15.9, "join:13,15")) == [
        9, 11, 13, 15]
    # a join barrier must name its joiners; a plain one is refused, as an unknown kind
    [refused] = [a for a in sched.handle(from_sender(barrier_request(4, 0, VanClock(), "join"),
                                                     worker_id(0)), 16.0)
                 if isinstance(a, Refused)]
    assert "unknown kind 'join'" in refused.reason


def test_a_joining_worker_that_is_lost_leaves_even_at_the_minimum():
    sched = elastic_scheduler(workers=4, min_workers=3)
    lose(sched, 2, 11.0)
    sched.handle(late_worker(3002, rank_hint=2), 12.0)
    barrier(sched, 0, 13.0, "join:13")
    barrier(sched, 1, 13.0, "join:13")
    assert barrier(sched, 3, 13.0, "join:13") == []        # waits for the joining worker
    # its own failure before it joined does not end the job (it leaves, as it is lost)
    abort = control_message(ControlCommand.HEARTBEAT, 1, request=True)
    abort.meta.extra = {"abort": "an uncaught error"}
    [refused] = sched.handle(from_sender(abort, 13), 13.5)
    assert isinstance(refused, Refused) and "had not joined" in refused.reason
    actions = lose(sched, 2, 14.0)                      # 3 left: it may, it was joining
    assert [a.node.id for a in actions if isinstance(a, NodeLeft)] == [13]
    releases = [m for m in sends(actions) if m.meta.control.cmd == ControlCommand.BARRIER]
    assert sorted(m.meta.recver for m in releases) == [9, 11, 15]


def test_a_second_loss_while_a_restarted_worker_has_not_joined_ends_the_job_at_once():
    sched = elastic_scheduler(workers=4, min_workers=3)
    lose(sched, 1, 11.0)
    sched.handle(late_worker(3001, rank_hint=1), 12.0)      # restarting: not back yet
    [dead] = [a for a in lose(sched, 2, 12.5) if isinstance(a, NodeDead)]
    assert dead.node.id == 13
    assert "2 of 4 workers would be left, fewer than BYTEPS_MIN_WORKERS=3" in dead.reason
    assert "restarting, not joined yet: worker rank 1" in dead.reason


def test_a_node_follows_a_late_workers_arrival_and_a_late_worker_knows_it_is_one():
    worker = NodeMembership(node(Role.WORKER, 4000), node(Role.SCHEDULER, 9091), 10.0, 1.0)
    worker.my_node = node(Role.WORKER, 1000, 9)
    worker.nodes = [node(Role.WORKER, 1000 + r, worker_id(r)) for r in range(4)]
    worker.ready = True
    gone = control_message(ControlCommand.HEARTBEAT, 9, nodes=[node(Role.WORKER, 1002, 13)])
    gone.meta.extra = {"worker_left": True}
    worker.handle(from_sender(gone, 1), 0.0)
    new = node(Role.WORKER, 3002, 13)
    new.is_recovery = True
    notice = control_message(ControlCommand.ADD_NODE, 9, nodes=[new])
    notice.meta.extra = {"worker_joined": True}
    [joined] = worker.handle(from_sender(notice, 1), 0.0)
    assert isinstance(joined, NodeJoined) and joined.node.port == 3002 and worker.left == []
    # the late worker itself: its entry in the node list, flagged
    late = NodeMembership(node(Role.WORKER, 3002), node(Role.SCHEDULER, 9091), 10.0)
    welcome = control_message(ControlCommand.ADD_NODE, 13, nodes=[new, node(Role.SERVER, 2000, 8)])
    welcome.meta.extra = {"worker_joined": True}
    [ready] = [a for a in late.handle(from_sender(welcome, 1), 0.0) if isinstance(a, Ready)]
    assert ready.joined and ready.epoch == 0 and ready.my_node.id == 13


def test_the_join_board_gives_every_worker_of_a_commit_the_same_joiners():
    board = JoinBoard()
    assert board.commit(9, b"1\n{\"batch\": 1}") == b""         # nobody waits
    assert board.join(13) == b""                                # worker 13 asks to join
    assert board.commit(11, b"1\n{\"batch\": 1}") == b""        # commit 1 was decided without
    assert board.commit(11, b"2\n{\"batch\": 2}") == b"13"      # the first report of 2 decides
    assert board.commit(9, b"2\n{\"batch\": 2}") == b"13"       # ... for everyone: they
    assert board.join(13) == b""                 # learn it at commit 3, where it joins
    assert board.commit(9, b"3\n{\"batch\": 3}") == b""        # it joined: decided once
    assert board.join(13) == b"3\n1\n13\n{\"batch\": 3}"        # it resumes from commit 3
    summing = JoinBoard(lambda: False)                          # (where they only sum)
    summing.join(13)
    summing.commit(9, b"1\n{}")
    summing.commit(9, b"2\n{}")
    assert summing.join(13) == b"2\n0\n13\n{}"
    # a program's thread runs ahead of MXNet's engine: reports of one commit come far apart,
    # and one below the highest decided is answered as it was decided, whoever waits now
    for n in range(4, 200):
        board.commit(9, b"%d\n{}" % n)
    assert board.join(15) == b""
    assert board.commit(11, b"3\n{}") == b"" and board.commit(11, b"150\n{}") == b""
    assert board.commit(9, b"200\n{}") == b"15" and board.commit(11, b"200\n{}") == b"15"
    # the leading worker's parameters for those joining at 201, until each read them
    board.commit(9, b"201\n{}")
    assert board.handover(9, b"201\nweights") == b""
    assert board.handover(15, b"201") == b"weights" and board.handover(15, b"201") == b""
    with pytest.raises(ProtocolError, match="no number and JSON"):
        board.commit(9, b"x\n{}")
    admitted = []
    assert board.handle(ServerCommand.BYTEPS_ADMIT, 13, b"", admitted.append) == b""
    assert admitted == [13]


def test_a_key_admits_a_late_worker_between_rounds_from_the_next_round_on():
    departed = Departed()
    rounds = KeyRounds(1, 3, 2, F32, departed)
    values = {s: np.full(2, 10.0 ** s, F32) for s in range(3)}
    push_round(rounds, [0, 1, 2], values)                       # round 0, everyone
    departed.add(2)
    rounds.depart(2)
    for _ in range(3):                                          # rounds 1-3 without worker 2
        answered, answer = push_round(rounds, [0, 1], values)
        assert answer.tolist() == pytest.approx([11 * 3 / 2] * 2)
    # the others pushed rounds it has not: it is not waited for (a late worker's watched
    # join barrier took that for a deadlock under load, and ended the job)
    assert rounds.waiting_for(2) is None
    departed.readmit(2)
    assert rounds.admit(2) == 4
    assert rounds.waiting_for(2) is None
    for _ in range(3):          # rounds 4-6: all three again, unscaled; the slots turn over
        answered, answer = push_round(rounds, [2, 0, 1], values)
        assert len(answered) == 3 and answer.tolist() == [111.0, 111.0]


class FakeServers:
    """Server rank 0's join board and the workers' barrier, as a JoinPort sees them (a
    request is answered when sent; its answer read later)."""

    def __init__(self, answers=()):
        self.board, self.calls, self._answers = JoinBoard(), [], list(answers)

    def port(self, sender, timeout=1.0):
        def send(head, body):
            self.calls.append((sender, head.name))
            if self._answers:
                return self._answers.pop(0)
            return self.board.handle(head, sender, body, lambda s: None)
        return JoinPort(send, lambda answer, what: answer,
                        lambda head, body, what: self.calls.append((sender, head.name)),
                        lambda within, joiners: self.calls.append((sender, "join barrier")),
                        lambda: sender == 9, timeout)


def test_a_worker_commits_and_settles_into_the_join_barriers_only_where_somebody_joins():
    servers = FakeServers()
    joins = Joins(servers.port(9), late=False, enabled=True)
    settled = []
    assert joins.commit(b"{}", lambda: settled.append(1)) == [] and not settled
    late = Joins(servers.port(13), late=True, enabled=True)
    with pytest.raises(RuntimeError, match="only after it joined"):
        late.commit(b"{}", lambda: None)
    servers.board.join(13)                   # (its first ask, as late.join() makes it)
    assert joins.commit(b"{\"batch\": 2}", lambda: settled.append(1)) == []   # decided at 2
    assert joins.commit(b"{\"batch\": 3}", lambda: settled.append(1),
                        lambda: b"parameters") == [13]      # ... they join at 3
    assert settled == [1]
    assert servers.calls[-4:] == [(9, "BYTEPS_COMMIT"), (9, "BYTEPS_HANDOVER"),
                                  (9, "join barrier"), (9, "join barrier")]   # its parameters
    checked = []
    n, state, handover = late.join(checked.append)
    assert (n, state, handover) == (3, b"{\"batch\": 3}", b"parameters") and checked == [True]
    assert not late.joining and late.commits == 3
    assert servers.calls[-5:] == [(13, "join barrier"), (13, "BYTEPS_HANDOVER"),
                                  (13, "BYTEPS_ADMIT"), (13, "join barrier"),   # nobody pushes
                                  (13, "BYTEPS_COMMIT")]    # its report of 3: it hears of 4
    assert late.commit(b"{}", lambda: None) == [] and joins.commit(b"{}", lambda: None) == []


def test_a_late_worker_that_cannot_take_the_parameters_stays_out_of_the_rounds():
    # where the workers update, a State without a trainer (Module.fit) has nothing to take the
    # leader's parameters into: it fails before the join barrier, so it just leaves
    from kvstore_byteps.elastic import State
    from kvstore_byteps.errors import ConfigError
    servers = FakeServers(answers=[b"3\n0\n13\n{}"])
    late = Joins(servers.port(13), late=True, enabled=True)
    state = State.__new__(State)
    state._trainer = None
    with pytest.raises(ConfigError, match="Module.fit takes a worker back only where the "
                                          "servers update"):
        late.join(state._check)
    assert (13, "join barrier") not in servers.calls and late.joining
    state._check(True)                 # the servers hold the weights: its Module reads them


def test_a_late_worker_that_nobody_commits_for_fails_naming_what_it_waited_for():
    joins = Joins(FakeServers(answers=[b""] * 1000).port(13, timeout=0.2), late=True,
                  enabled=True)
    with pytest.raises(DeadlineError, match="next State.commit"):
        joins.join()


def test_a_late_worker_that_has_not_joined_when_the_others_finish_is_told_and_leaves():
    # under load a fifth worker's start took longer than the others' training: it asked to
    # join until its heartbeats went unanswered (30 s), then blamed its link, exit 1
    sched = elastic_scheduler(workers=4, min_workers=2)
    lose(sched, 2, 11.0)
    sched.handle(late_worker(3002, rank_hint=2), 12.0)
    for rank in (0, 1):
        assert barrier(sched, rank, 13.0, "shutdown") == []
    *released, notice = sends(sched.handle(from_sender(
        barrier_request(4, 0, VanClock(), "shutdown"), worker_id(3)), 13.0))
    assert sorted(m.meta.recver for m in released) == [9, 11, 15]     # not the joining one
    assert notice.meta.recver == 13 and notice.meta.extra["job_finished"]
    assert "finished the job before worker rank 2 joined it" in notice.meta.extra["abort"]
    assert 13 in sched.departures.left and not sched.departures.joining
    # a late worker arriving now is turned away: the job is finishing
    [refused] = [a for a in sched.handle(late_worker(3003), 14.0) if isinstance(a, Refused)]
    assert "the job is finishing" in refused.reason
    # the worker's side: the notice ends its van with JobFinished, which its State() turns
    # into TrainingOver (exit status 0), saying why, in its join or its trainer's set-up
    worker = NodeMembership(node(Role.WORKER, 3002), node(Role.SCHEDULER, 9091), 10.0)
    worker.my_node, worker.ready = node(Role.WORKER, 3002, 13), True
    [fail] = worker.handle(from_sender(notice, 1), 13.0)
    assert isinstance(fail.error, JobFinished)

    def finished(head, body):
        try:
            raise fail.error.again()
        except JobFinished as exc:      # as the worker's wait says what it was doing
            raise JobFinished("worker rank 2, asking to join: %s" % exc) from exc
    joins = Joins(JoinPort(finished, None, None, None, lambda: False, 1.0), late=True,
                  enabled=True)
    with pytest.raises(JobFinished):
        joins.join()
    from kvstore_byteps.elastic import State
    state = State.__new__(State)
    state._trainer = None
    with pytest.raises(TrainingOver, match="^the other workers finished") as over:
        state._join(joins)
    assert over.value.code == 0


def test_an_elastic_worker_that_no_scheduler_answers_says_the_job_may_have_ended():
    # a worker started after the job ended waits BYTEPS_START_TIMEOUT: its line says why
    # that may be (a helper found it said only "is the scheduler running")
    for elastic, said in ((True, True), (False, False)):
        worker = NodeMembership(node(Role.WORKER, 4000), node(Role.SCHEDULER, 9091), 10.0,
                                elastic=elastic)
        worker.start(0.0)
        [fail] = worker.tick(10.5)
        assert ("finds no scheduler once the job ended" in str(fail.error)) is said


def test_a_node_that_did_not_run_asks_the_scheduler_again_before_taking_it_for_dead():
    from kvstore_byteps.van.runtime.membership import Send
    worker = NodeMembership(node(Role.WORKER, 4000), node(Role.SCHEDULER, 9091), 10.0, 1.0,
                            heartbeat_timeout=4.0)
    worker.my_node, worker.ready = node(Role.WORKER, 1000, 9), True
    worker.last_heartbeat_reply, worker.next_heartbeat = 0.0, 1.0
    worker.tick(0.5)
    # stopped for 7 s (SIGSTOP, swapped out): its silence, not the scheduler's
    [ask] = worker.tick(7.5)
    assert isinstance(ask, Send) and ask.message.meta.control.cmd == ControlCommand.HEARTBEAT
    assert worker.tick(7.6) == []
    # ... while a scheduler silent past the timeout of a running node is dead
    dead = [a for t in (8.0, 9.0, 10.0, 11.0, 12.0) for a in worker.tick(t)
            if isinstance(a, NodeDead)]
    assert [a.node.id for a in dead] == [1]


def test_an_elastic_worker_that_loses_the_scheduler_leaves_rather_than_ending_the_job():
    from kvstore_byteps.errors import EXIT_LEFT
    from kvstore_byteps.van.runtime.membership import Fail
    worker = NodeMembership(node(Role.WORKER, 4000), node(Role.SCHEDULER, 9091), 10.0, 1.0,
                            heartbeat_timeout=4.0, elastic=True)
    worker.my_node, worker.ready = node(Role.WORKER, 1000, 9), True
    worker.last_heartbeat_reply, worker.next_heartbeat = 0.0, 1.0
    actions = [a for t in (0.5, 1.0, 2.0, 3.0, 4.0, 5.0) for a in worker.tick(t)]
    [left] = [a for a in actions if isinstance(a, Fail)]
    assert left.error.status == EXIT_LEFT and "its link may be down" in str(left.error)
