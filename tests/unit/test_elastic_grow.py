"""Elastic workers, a job that grows (BYTEPS_MAX_WORKERS, launch.py --max-workers), the parts
without a network: the seats beyond DMLC_NUM_WORKER start vacant (as departed) on the
scheduler, on every node and on the servers; a late worker takes one at once (a departed
worker's place first) and every node adds it; a round of more pushes than DMLC_NUM_WORKER is
scaled to that many, as one of fewer is; a worker finding no seat is told why and stops.
Real processes: tests/cluster/test_elastic.py."""
import numpy as np
import pytest

from kvstore_byteps.config import Role
from kvstore_byteps.errors import ClusterStartError, ConfigError
from kvstore_byteps.serving.rounds import Departed, KeyRounds
from kvstore_byteps.van.runtime.departures import ARRIVAL_WAIT_S, Departures
from kvstore_byteps.van.runtime.membership import Connect, NodeJoined, Refused, Send
from kvstore_byteps.van.runtime.node_membership import NodeMembership
from kvstore_byteps.van.runtime.roster import Roster
from kvstore_byteps.van.runtime.scheduler_membership import SchedulerMembership
from kvstore_byteps.van.wire.message import ControlCommand, Control, Message, Meta

from tests.unit.test_elastic import config, from_sender, keep_alive, node, push_round, sends
from tests.unit.test_elastic_joins import barrier, late_worker, lose

F32 = np.float32


def growing_scheduler(workers=4, seats=5, min_workers=3, timeout=5.0):
    """A formed cluster of ``workers`` workers and one server with ``seats`` worker seats."""
    sched = SchedulerMembership(node(Role.SCHEDULER, 9091), workers, 1, start_deadline=100.0,
                                heartbeat_timeout=timeout, min_workers=min_workers,
                                seats=seats)
    for member in [node(Role.SERVER, 2000)] + [node(Role.WORKER, 1000 + r)
                                               for r in range(workers)]:
        sched.handle(Message(Meta(control=Control(cmd=ControlCommand.ADD_NODE, nodes=[member]),
                                  request=True)), 10.0)
    assert sched.ready
    return sched


def test_the_seats_beyond_the_job_are_vacant_and_a_departed_place_is_taken_first():
    seats = Departures(4, min_workers=3, seats=6)
    assert seats.vacant == {17, 19} and seats.workers() == 4
    assert seats.present([9, 11, 13, 15, 17, 19]) == [9, 11, 13, 15]
    seats.leave(node(Role.WORKER, 1001, 11))
    assert seats.workers() == 3 and not seats.may_leave(node(Role.WORKER, 1000, 9))
    assert seats.seat(node(Role.WORKER, 3000)) == 11        # a departed place first
    grown = node(Role.WORKER, 3001)
    grown.rank_hint = 5
    assert seats.seat(grown) == 19                          # its own rank's vacant seat
    assert seats.seat(node(Role.WORKER, 3002)) == 17
    assert seats.seat(node(Role.WORKER, 3003)) is None
    for joined in (11, 17, 19):
        seats.joined(joined)
    assert seats.workers() == 6 and seats.may_leave(node(Role.WORKER, 1000, 9))
    assert "all BYTEPS_MAX_WORKERS=6 seats are taken" in seats.describe_full()
    assert Departures(4, 3).vacant == set()            # a job that does not grow


def test_a_fifth_worker_takes_the_vacant_seat_at_once_and_every_node_adds_it():
    sched = growing_scheduler()
    for rank in range(3):                     # the vacant seat is in no barrier
        assert barrier(sched, rank, 11.0) == []
    assert sorted(m.meta.recver for m in barrier(sched, 3, 11.0)) == [9, 11, 13, 15]
    actions = sched.handle(late_worker(3004), 12.0)           # nobody left: no wait
    [joined] = [a for a in actions if isinstance(a, NodeJoined)]
    assert joined.node.id == 17 and [n.id for n in sched.nodes][-1] == 17
    *notices, welcome = sends(actions)           # the others hear of it first
    assert welcome.meta.recver == 17 and welcome.meta.extra == {"worker_joined": True}
    assert 17 in [n.id for n in welcome.meta.control.nodes]
    assert sorted(m.meta.recver for m in notices) == [8, 9, 11, 13, 15]
    # it joins in the join barrier, then every barrier counts five
    for rank in range(4):
        assert barrier(sched, rank, 13.0, "join:17") == []
    assert sorted(m.meta.recver for m in barrier(sched, 4, 13.0, "join:17")) == [9, 11, 13, 15, 17]
    assert sched.departures.workers() == 5
    # a worker of the grown job may leave (five, minimum three), and its seat is free again
    lose(sched, 4, 14.0)
    assert 17 in sched.departures.left and sched.departures.workers() == 4


def test_a_worker_finding_no_seat_is_told_why_and_stops_its_start():
    sched = growing_scheduler()
    sched.handle(late_worker(3004), 12.0)
    assert sched.handle(late_worker(3005), 12.5) == []      # waits for a departure ...
    keep_alive(sched, 12.5 + 5.0 + ARRIVAL_WAIT_S)
    actions = sched.tick(13.0 + 5.0 + ARRIVAL_WAIT_S)       # ... then is turned away
    [connect] = [a for a in actions if isinstance(a, Connect)]
    [notice] = sends(actions)
    [refused] = [a for a in actions if isinstance(a, Refused)]
    assert connect.node.port == 3005 and notice.meta.recver == connect.node.id
    assert connect.node.id not in [n.id for n in sched.nodes]       # no seat's id
    assert "all BYTEPS_MAX_WORKERS=5 seats are taken" in refused.reason
    assert notice.meta.extra["abort"] == refused.reason
    # the worker, not yet a node of the job, ends its start with that reason
    late = NodeMembership(node(Role.WORKER, 3005), node(Role.SCHEDULER, 9091), 60.0)
    [failed] = late.handle(from_sender(notice, 1), 30.0)
    assert isinstance(failed.error, ClusterStartError) and "seats are taken" in str(
        failed.error)


def test_every_node_holds_the_vacant_seats_as_departed_until_a_worker_takes_one():
    workers = [node(Role.WORKER, 1000 + r, 9 + 2 * r) for r in range(4)]
    roster = Roster()
    roster.formed(workers + [node(Role.SERVER, 2000, 8)], seats=6)
    assert roster.left == {17, 19}
    # a late worker may claim a vacant seat's id before this node hears of it (byteps_tcp)
    assert [(n.id, n.port) for n in roster.claimable()[-2:]] == [(17, 0), (19, 0)]
    roster.arrive(node(Role.WORKER, 3004, 17))
    assert roster.left == {19} and [n.id for n in roster.nodes][-1] == 17
    # a node told of a worker in a seat it did not know adds it
    member = NodeMembership(node(Role.WORKER, 1000), node(Role.SCHEDULER, 9091), 60.0)
    member.nodes, member.ready = list(workers), True
    grown = node(Role.WORKER, 3004, 17)
    grown.is_recovery = True
    notice = Message(Meta(control=Control(cmd=ControlCommand.ADD_NODE, nodes=[grown]),
                          extra={"worker_joined": True}))
    [joined] = [a for a in member.handle(from_sender(notice, 1), 20.0)
                if isinstance(a, NodeJoined)]
    assert joined.node.id == 17 and [n.id for n in member.nodes][-1] == 17


def test_a_grown_rounds_sum_is_scaled_to_the_jobs_workers():
    rounds = KeyRounds(1, 5, 2, F32, Departed([17]), scale_to=4)
    values = {s: np.full(2, float(i + 1), F32) for i, s in enumerate((9, 11, 13, 15, 17))}
    answered, answer = push_round(rounds, [9, 11, 13, 15], values)
    assert len(answered) == 4 and answer.tolist() == [10.0, 10.0]     # four: as they are
    rounds._departed.readmit(17)
    assert rounds.admit(17) == 1
    answered, answer = push_round(rounds, [9, 11, 13, 15, 17], values)
    assert len(answered) == 5 and answer.tolist() == [12.0, 12.0]     # 15 x 4/5


def test_the_mxnet_style_rounds_of_a_grown_job_are_scaled_too():
    from kvstore_byteps.mxproto import ServerCommand
    from kvstore_byteps.serving.dist import KVStoreDistServer
    from tests.support.server_fakes import WORKER0, WORKER1, FakeServer, command, pull, push
    srv, fake = KVStoreDistServer(1, seats=2), FakeServer()
    assert srv.departed.ids == {WORKER1} and srv.is_worker(WORKER1)
    srv.handle_command(command(WORKER0, ServerCommand.SYNC_MODE), fake)
    srv.handle_request(push(WORKER0, 5, np.zeros(2, F32)), fake)              # init
    alone = push(WORKER0, 5, np.full(2, 3.0, F32))
    srv.handle_request(alone, fake)
    assert fake.answered(alone)                       # the vacant seat is waited for by none
    srv.departed.readmit(WORKER1)
    first, second = push(WORKER0, 5, np.full(2, 1.0, F32)), push(WORKER1, 5, np.full(2, 2.0, F32))
    srv.handle_request(first, fake)
    assert not fake.answered(first)
    srv.handle_request(second, fake)
    reading = pull(WORKER1, 5)
    srv.handle_request(reading, fake)
    assert fake.answer_to(reading).values(F32).tolist() == [1.5, 1.5]     # 3 scaled by 1/2


def test_the_setting_and_the_launcher_option():
    assert config(BYTEPS_MIN_WORKERS="3", BYTEPS_MAX_WORKERS="6").worker_seats == 6
    assert config(BYTEPS_MIN_WORKERS="3").worker_seats == 4
    with pytest.raises(ConfigError, match="BYTEPS_MAX_WORKERS=6 grows an elastic job"):
        config(BYTEPS_MAX_WORKERS="6")
    with pytest.raises(ConfigError, match="fewer than the job's workers"):
        config(BYTEPS_MIN_WORKERS="3", BYTEPS_MAX_WORKERS="3")
    from kvstore_byteps.launcher.cli import parse_args
    from kvstore_byteps.launcher.runs import join_command, plan
    from kvstore_byteps.launcher.plan import local_hosts
    args = parse_args(["-n", "2", "-s", "1", "--min-workers", "1", "--max-workers", "3",
                       "python", "x.py"], {})
    assert args.env_all["BYTEPS_MAX_WORKERS"] == "3"
    line = join_command(plan(args, local_hosts(), 9000), 2)
    assert ("BYTEPS_MAX_WORKERS=3 BYTEPS_MIN_WORKERS=1" in line and "DMLC_WORKER_ID=2" in line
            and "DMLC_PS_ROOT_PORT=9000" in line and line.endswith("python x.py")
            and "BYTEPS_LOCAL" not in line)
    for argv in (["-n", "2", "--max-workers", "3"],
                 ["-n", "2", "--min-workers", "1", "--max-workers", "1"]):
        with pytest.raises(SystemExit):
            parse_args(argv + ["python", "x.py"], {})


def test_gradients_are_scaled_by_the_jobs_workers_not_by_who_is_in_it():
    from kvstore_byteps.elastic import scale_workers

    class Engine:
        def __init__(self, **env):
            self.config = config(**env)

    class Store:
        num_workers = 5
    store = Store()
    store._engine = Engine(BYTEPS_MIN_WORKERS="3", BYTEPS_MAX_WORKERS="5")
    assert scale_workers(store) == 4
    store._engine = Engine()
    assert scale_workers(store) == 5           # not elastic: the store's own count


def test_a_worker_asking_for_a_grown_rank_as_the_job_forms_waits_for_it_to_form():
    sched = SchedulerMembership(node(Role.SCHEDULER, 9091), 2, 1, start_deadline=100.0,
                                heartbeat_timeout=5.0, min_workers=1, seats=3)
    early = node(Role.WORKER, 3002)
    early.rank_hint = 2             # (launch.py's printed command: DMLC_WORKER_ID=2)
    members = [early, node(Role.SERVER, 2000), node(Role.WORKER, 1000), node(Role.WORKER, 1001)]
    for member in members:
        sched.handle(Message(Meta(control=Control(cmd=ControlCommand.ADD_NODE, nodes=[member]),
                                  request=True)), 10.0)
    assert sched.ready and sorted(n.port for n in sched.nodes) == [1000, 1001, 2000]
    [joined] = [a for a in sched.tick(10.5) if isinstance(a, NodeJoined)]
    assert joined.node.port == 3002 and joined.node.id == 13
