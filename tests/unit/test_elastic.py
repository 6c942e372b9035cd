"""Elastic workers (BYTEPS_MIN_WORKERS), the parts without a network: the scheduler lets a lost
worker leave while enough are left (everyone told, barriers released) and ends the job below
that, naming every worker lost; a node follows the notice; a key's rounds close without the
departed worker's push, scaled to the job's workers; MXNet-style rounds likewise; the settings
refused where no round can do without a worker; the launcher's option. Real processes (and
the launcher's supervision): tests/cluster/test_elastic.py."""
import numpy as np
import pytest

from kvstore_byteps.config import Config, Role
from kvstore_byteps.errors import EXIT_LEFT, ConfigError
from kvstore_byteps.serving.rounds import KeyRounds
from kvstore_byteps.van.runtime.membership import (NodeDead, NodeLeft, VanClock,
                                                   barrier_request, control_message)
from kvstore_byteps.van.runtime.node_membership import NodeMembership
from kvstore_byteps.van.runtime.scheduler_membership import SchedulerMembership
from kvstore_byteps.van.wire.message import ControlCommand, Message, Meta, Node, Control

F32 = np.float32


def node(role, port, node_id=None):
    n = Node(role, hostname="127.0.0.1", port=port, heartbeat_ms=1000)
    if node_id is not None:
        n.id = node_id
    return n


def from_sender(msg, sender):
    msg.meta.sender = sender
    return msg


def sends(actions):
    return [a.message for a in actions if hasattr(a, "message")]


def elastic_scheduler(workers=4, min_workers=3, timeout=5.0):
    """A cluster of ``workers`` workers and one server, formed at t=10, every node heartbeating
    (worker ranks by port: 1000 + rank; ids 9, 11, 13, ...; the server is 8)."""
    sched = SchedulerMembership(node(Role.SCHEDULER, 9091), workers, 1, start_deadline=100.0,
                                heartbeat_timeout=timeout, min_workers=min_workers)
    members = [node(Role.SERVER, 2000)] + [node(Role.WORKER, 1000 + r) for r in range(workers)]
    for member in members:
        request = Message(Meta(control=Control(cmd=ControlCommand.ADD_NODE, nodes=[member]),
                               request=True))
        sched.handle(request, 10.0)
    assert sched.ready
    return sched


def keep_alive(sched, now, silent=()):
    for n in sched.nodes:
        if n.id not in silent:
            msg = control_message(ControlCommand.HEARTBEAT, 1, nodes=[n])
            sched.handle(from_sender(msg, n.id), now)


def worker_id(rank):
    return 9 + 2 * rank


def test_a_lost_worker_leaves_while_enough_are_left_and_the_job_ends_below_that():
    sched = elastic_scheduler(workers=4, min_workers=3)
    clock = VanClock()
    # workers 0, 1, 3 wait in a barrier of the workers; worker 2 is about to be lost
    for rank in (0, 1, 3):
        assert sched.handle(from_sender(barrier_request(4, 0, clock), worker_id(rank)), 12.0) == []
    keep_alive(sched, 14.0, silent=(worker_id(2),))
    actions = sched.tick(15.5)
    [left] = [a for a in actions if isinstance(a, NodeLeft)]
    assert left.node.id == worker_id(2) and left.workers == 3
    assert not [a for a in actions if isinstance(a, NodeDead)]
    notices = [m for m in sends(actions) if m.meta.control.cmd == ControlCommand.HEARTBEAT]
    assert sorted(m.meta.recver for m in notices) == [8, 9, 11, 15]     # not the departed
    assert all(m.meta.extra == {"worker_left": True} and m.meta.control.nodes[0].id == 13
               for m in notices)
    releases = [m for m in sends(actions) if m.meta.control.cmd == ControlCommand.BARRIER]
    assert sorted(m.meta.recver for m in releases) == [9, 11, 15]      # the barrier it held
    # its heartbeats are no longer awaited, and later barriers do without it
    keep_alive(sched, 19.0, silent=(worker_id(2),))
    assert not [a for a in sched.tick(20.0) if isinstance(a, (NodeLeft, NodeDead))]
    for rank in (0, 1):
        assert sched.handle(from_sender(barrier_request(4, 0, clock), worker_id(rank)), 21.0) == []
    assert len(sends(sched.handle(from_sender(barrier_request(4, 0, clock), worker_id(3)),
                                  21.0))) == 3
    # a second loss would leave 2 of 4, fewer than 3: the job ends, naming both workers
    keep_alive(sched, 22.0, silent=(worker_id(1), worker_id(2)))
    keep_alive(sched, 27.0, silent=(worker_id(1), worker_id(2)))
    actions = sched.tick(27.5)
    [dead] = [a for a in actions if isinstance(a, NodeDead)]
    assert dead.node.id == worker_id(1)
    assert "fewer than BYTEPS_MIN_WORKERS=3" in dead.reason and "worker rank 2" in dead.reason
    assert all(m.meta.extra == {"dead_node": True} for m in sends(actions))


def test_a_workers_closed_connection_is_its_loss_unless_it_is_leaving_or_no_loss_may_be():
    from kvstore_byteps.van.wire.message import connection_closed
    sched = elastic_scheduler(workers=4, min_workers=3)
    clock = VanClock()
    # worker 3 entered its shutdown barrier: its connection closing is its normal end
    sched.handle(from_sender(barrier_request(7, 0, clock, "shutdown"), worker_id(3)), 11.0)
    assert sched.peer_closed(worker_id(3), 11.5) == []
    [left] = [a for a in sched.peer_closed(worker_id(2), 12.0) if isinstance(a, NodeLeft)]
    assert left.node.id == worker_id(2)
    assert left.reason == "its connection to the scheduler closed"
    assert sched.peer_closed(worker_id(2), 12.1) == []                 # once
    # 2 left would be too few: the job ends now, not at the heartbeat timeout, naming both
    [dead] = [a for a in sched.peer_closed(worker_id(1), 12.2) if isinstance(a, NodeDead)]
    assert dead.node.id == worker_id(1) and "fewer than BYTEPS_MIN_WORKERS=3" in dead.reason
    assert "left before: worker rank 2" in dead.reason
    assert sched.peer_closed(worker_id(1), 12.3) == []                 # once
    assert sched.peer_closed(8, 12.3) == []                            # servers never leave
    plain = elastic_scheduler(workers=4, min_workers=0)
    assert plain.peer_closed(worker_id(2), 12.0) == []                 # heartbeats decide
    # the van's notice names the peer as its sender, and no decoded message can carry it
    notice = connection_closed(13, 1)
    assert notice.meta.sender == 13 and notice.meta.extra == {"connection_closed": True}


def test_servers_never_leave_and_jobs_without_a_minimum_end_at_the_first_loss():
    sched = elastic_scheduler(workers=4, min_workers=3)
    keep_alive(sched, 14.0, silent=(8,))
    assert [a.node.id for a in sched.tick(15.5) if isinstance(a, NodeDead)] == [8]
    plain = elastic_scheduler(workers=4, min_workers=0)
    keep_alive(plain, 14.0, silent=(worker_id(2),))
    actions = plain.tick(15.5)
    assert [a.node.id for a in actions if isinstance(a, NodeDead)] == [worker_id(2)]
    assert not [a for a in actions if isinstance(a, NodeLeft)]


def test_a_node_follows_the_notice_once_and_only_the_schedulers():
    worker = NodeMembership(node(Role.WORKER, 4000), node(Role.SCHEDULER, 9091), 10.0, 1.0,
                            heartbeat_timeout=5.0)
    worker.nodes = [node(Role.WORKER, 1000 + r, worker_id(r)) for r in range(4)]
    worker.my_node = node(Role.WORKER, 1000, 9)
    notice = control_message(ControlCommand.HEARTBEAT, 9, nodes=[node(Role.WORKER, 1002, 13)])
    notice.meta.extra = {"worker_left": True}
    [left] = worker.handle(from_sender(notice, 1), 0.0)
    assert isinstance(left, NodeLeft) and left.node.id == 13 and left.workers == 3
    assert worker.handle(from_sender(notice, 1), 0.0) == []          # told once
    assert worker.handle(from_sender(notice, 11), 0.0)[0].__class__.__name__ == "Refused"
    # a later death names the workers that left before
    dead = control_message(ControlCommand.HEARTBEAT, 9, nodes=[node(Role.WORKER, 1001, 11)])
    dead.meta.extra = {"dead_node": True}
    [died] = worker.handle(from_sender(dead, 1), 0.0)
    assert isinstance(died, NodeDead) and "worker rank 2" in died.reason


def push_round(rounds, senders, values, finish=None):
    """Each of ``senders`` pushes ``values[sender]`` into its next round and pulls it;
    returns (round, the tokens answered, the answer)."""
    answered, answer = [], None
    for sender in senders:
        r = rounds.begin_push(sender)
        token = ("pull", sender)
        now = rounds.request_pull(sender, token)
        if now is not None:
            answered.append(token)
            answer = now
        tokens, done = rounds.accumulate(r, values[sender], finish)
        if tokens:
            answered += tokens
            answer = done
    return answered, answer


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_a_round_closes_without_the_departed_workers_push_scaled_to_the_job(dtype):
    rounds = KeyRounds(1, 4, 3, dtype)
    values = {s: np.full(3, s + 1, dtype) for s in range(4)}
    answered, answer = push_round(rounds, [0, 1, 2, 3], values)
    assert len(answered) == 4 and answer.tolist() == [10, 10, 10]
    # round 1: workers 0, 1 and 3 push; worker 2 died before its push
    answered, answer = push_round(rounds, [0, 1, 3], values)
    assert answered == [] and answer is None                    # still waits for worker 2
    assert rounds.depart(2) == [1]
    tokens, answer = rounds.recheck(1)
    assert sorted(tokens) == [("pull", 0), ("pull", 1), ("pull", 3)]
    assert answer.dtype == dtype and answer.tolist() == pytest.approx([7 * 4 / 3] * 3, rel=1e-3)
    # later rounds need the three left: the first three pushes close it, scaled, and the
    # double buffer turns over without the departed worker's answers
    for _ in range(3):
        answered, answer = push_round(rounds, [3, 1, 0], values)
        assert len(answered) == 3
        assert answer.tolist() == pytest.approx([7 * 4 / 3] * 3, rel=1e-3)


def test_a_round_the_departed_worker_pushed_keeps_its_push_and_drops_its_pull():
    rounds = KeyRounds(1, 3, 2, F32)
    values = {s: np.full(2, 10.0 ** s, F32) for s in range(3)}
    r = rounds.begin_push(2)                      # worker 2 pushes, pulls, and dies
    assert rounds.request_pull(2, ("pull", 2)) is None
    rounds.accumulate(r, values[2])
    assert rounds.depart(2) == [0]
    assert rounds.recheck(0) == ([], None)        # the others' pushes are still due
    answered, answer = push_round(rounds, [0, 1], values)
    assert sorted(answered) == [("pull", 0), ("pull", 1)]     # not the departed one's
    assert answer.tolist() == [111.0, 111.0]                  # all three pushes, unscaled
    answered, answer = push_round(rounds, [0, 1], values)     # the next: two of three, scaled
    assert answer.tolist() == pytest.approx([11 * 3 / 2] * 2)


def test_a_departure_racing_the_last_push_closes_the_round_once():
    # the summing thread added the push while thinking another was due; the departure's
    # recheck then finds the round complete, and a second recheck does nothing
    rounds = KeyRounds(1, 3, 1, np.float16)
    for sender in (0, 1):
        rounds.begin_push(sender)
        rounds.request_pull(sender, sender)
    rounds.accumulate(0, np.ones(1, np.float16))
    rounds.accumulate(0, np.ones(1, np.float16))
    assert rounds.depart(2) == [0]
    tokens, answer = rounds.recheck(0)
    assert sorted(tokens) == [0, 1] and answer.tolist() == [3.0]
    assert rounds.recheck(0) == ([], None)


def test_the_servers_optimizer_runs_once_on_the_scaled_sum():
    rounds = KeyRounds(1, 2, 2, F32)
    seen = []

    def finish(total):
        seen.append(total.copy())
        total[:] = -total
    r = rounds.begin_push(0)
    rounds.request_pull(0, "t")
    rounds.accumulate(r, np.ones(2, F32), finish)
    rounds.depart(1)
    assert rounds.recheck(0, finish) == (["t"], pytest.approx(np.array([-2.0, -2.0])))
    assert len(seen) == 1 and seen[0].tolist() == [2.0, 2.0]


def test_mxnet_style_rounds_close_without_the_departed_worker():
    # the rounds of row_sparse keys and of MXNet's workers' keys on our servers (dist.py)
    from kvstore_byteps.mxproto import ServerCommand
    from kvstore_byteps.serving.dist import KVStoreDistServer
    from tests.support.server_fakes import (WORKER0, WORKER1, WORKER2, FakeServer, command,
                                            pull, push)
    srv, fake = KVStoreDistServer(3), FakeServer()
    srv.handle_command(command(WORKER0, ServerCommand.SYNC_MODE), fake)
    srv.handle_request(push(WORKER0, 5, np.zeros(2, F32)), fake)           # init
    first, second = push(WORKER0, 5, np.full(2, 1.0, F32)), push(WORKER1, 5, np.full(2, 2.0, F32))
    srv.handle_request(first, fake)
    srv.handle_request(second, fake)
    assert not fake.answered(first)                     # waits for worker 2
    srv.depart(WORKER2)
    assert fake.answer_to(first).error is None and fake.answered(second)
    reading = pull(WORKER1, 5)
    srv.handle_request(reading, fake)
    assert fake.answer_to(reading).values(F32).tolist() == [4.5, 4.5]    # 3 scaled by 3/2
    srv.handle_request(push(WORKER0, 5, np.full(2, 1.0, F32)), fake)
    last = push(WORKER1, 5, np.full(2, 1.0, F32))
    srv.handle_request(last, fake)
    assert fake.answered(last)                          # two pushes close a round now


def config(**env):
    base = {"DMLC_ROLE": "worker", "DMLC_NUM_WORKER": "4", "DMLC_NUM_SERVER": "1",
            "DMLC_PS_ROOT_URI": "127.0.0.1", "DMLC_PS_ROOT_PORT": "9000"}
    return Config.from_env({**base, **env})


def test_the_setting_is_read_checked_and_refused_where_no_round_can_do_without_a_worker():
    assert config().min_workers == 0 and not config().elastic
    assert config(BYTEPS_MIN_WORKERS="3").elastic
    with pytest.raises(ConfigError, match="more than the job's workers"):
        config(BYTEPS_MIN_WORKERS="5")
    for other in ({"BYTEPS_ENABLE_ASYNC": "1"}, {"BYTEPS_BACKUP_WORKERS": "1"},
                  {"BYTEPS_SERVER_RECOVERY": "1"}, {"BYTEPS_SERVER_PACING_BYTES": "1000"},
                  {"PS_RESEND": "1"}):
        with pytest.raises(ConfigError, match="synchronous training only, without %s"
                           % list(other)[0]):
            config(BYTEPS_MIN_WORKERS="2", **other)
    with pytest.raises(ConfigError, match="does not take local groups"):
        config(BYTEPS_MIN_WORKERS="2", BYTEPS_LOCAL_SIZE="2", BYTEPS_LOCAL_RANK="0")
    with pytest.raises(ConfigError, match="needs heartbeats"):
        config(BYTEPS_MIN_WORKERS="2", PS_HEARTBEAT_INTERVAL="0")


def test_the_launcher_option_sets_every_node_and_is_refused_where_it_cannot_supervise(capsys):
    from kvstore_byteps.launcher.cli import parse_args
    args = parse_args(["-n", "4", "-s", "1", "--min-workers", "3", "python", "x.py"], {})
    assert args.min_workers == 3 and args.env_all["BYTEPS_MIN_WORKERS"] == "3"
    assert parse_args(["-n", "4", "python", "x.py"], {"BYTEPS_MIN_WORKERS": "2"}).min_workers == 2
    for argv, said in ((["-n", "2", "--min-workers", "3"], "more than the job's 2 workers"),
                       (["-n", "4", "--launcher", "mpi", "--min-workers", "3"],
                        "is for --launcher local, ssh, netns"),
                       (["-n", "4", "--local-groups", "--min-workers", "3"],
                        "does not take --local-groups")):
        with pytest.raises(SystemExit) as stopped:
            parse_args(argv + ["python", "x.py"], {})
        assert stopped.value.code == 2 and said in capsys.readouterr().err


def test_keys_made_after_a_departure_and_the_departed_workers_late_requests():
    # one Departed per server: a key initialised after the departure (a bucket, a metrics key,
    # a Horovod-style name) does without the departed worker too; a push or pull that raced
    # the notice is refused, never reopening a round closed without it
    from kvstore_byteps.errors import ProtocolError
    from kvstore_byteps.serving.rounds import Departed
    departed = Departed()
    early = KeyRounds(1, 3, 2, F32, departed)
    early.depart(2)
    later = KeyRounds(2, 3, 2, F32, departed)
    values = {s: np.full(2, 1.0, F32) for s in range(3)}
    answered, answer = push_round(later, [0, 1], values)
    assert len(answered) == 2 and answer.tolist() == [3.0, 3.0]        # 2 scaled by 3/2
    for rounds in (early, later):
        with pytest.raises(ProtocolError, match="left the job"):
            rounds.begin_push(2)
        with pytest.raises(ProtocolError, match="left the job"):
            rounds.request_pull(2, "t")


def test_the_scheduler_no_longer_listens_to_a_worker_that_left():
    from kvstore_byteps.van.runtime.membership import abort_request
    sched = elastic_scheduler(workers=4, min_workers=2)
    keep_alive(sched, 14.0, silent=(worker_id(2),))
    assert [a for a in sched.tick(15.5) if isinstance(a, NodeLeft)]
    # it was only stalled: its heartbeats are answered with the notice that it left (it stops,
    # EXIT_LEFT: launch.py --max-restarts starts it again) and do not re-arm its watch
    keep_alive(sched, 16.0)
    [told] = sends(sched.handle(from_sender(control_message(
        ControlCommand.HEARTBEAT, 1, nodes=[sched._node(worker_id(2))]), worker_id(2)), 16.0))
    assert told.meta.recver == worker_id(2) and told.meta.extra == {"worker_left": True}
    assert told.meta.control.nodes[0].id == worker_id(2)
    stalled = NodeMembership(node(Role.WORKER, 1002), node(Role.SCHEDULER, 9091), 10.0, 1.0)
    stalled.my_node, stalled.ready = node(Role.WORKER, 1002, worker_id(2)), True
    [stop] = stalled.handle(from_sender(told, 1), 16.1)
    assert stop.error.status == EXIT_LEFT and "took it for lost" in str(stop.error)
    keep_alive(sched, 20.0, silent=(worker_id(2),))
    assert not [a for a in sched.tick(21.5) if isinstance(a, (NodeLeft, NodeDead))]
    # nor may it end the job
    refused = sched.handle(from_sender(abort_request("request timed out", VanClock()),
                                       worker_id(2)), 22.0)
    assert len(refused) == 1 and "which left the job" in refused[0].reason
