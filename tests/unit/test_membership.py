"""Pure tests of the scheduler's and a node's membership state machines (no sockets)."""
import pytest

from kvstore_byteps.config import Role
from kvstore_byteps.errors import ClusterStartError, JobAbortedError
from kvstore_byteps.van.runtime.membership import (Connect, Fail, NodeDead, NodeRecovered,
                                                  abort_request, Ready, Refused, ReleaseBarrier,
                                                  Send, Stop, barrier_request, control_message,
                                                  group_members, terminate_message, VanClock)
from kvstore_byteps.van.runtime.node_membership import NodeMembership
from kvstore_byteps.van.runtime.numbering import assign_ids
from kvstore_byteps.van.runtime.scheduler_membership import ABORT_GRACE_S, SchedulerMembership
from kvstore_byteps.van.wire.message import K_EMPTY, ControlCommand, Message, Meta, Node, Control


def node(role, host, port, node_id=K_EMPTY):
    return Node(role=role, id=node_id, hostname=host, port=port)


def from_sender(msg, sender):
    msg.meta.sender = sender
    return msg


def add_node_request(n):
    return from_sender(NodeMembership(n, node(Role.SCHEDULER, "s", 1), 10).start(0)[1].message,
                       K_EMPTY)


def sends(actions):
    return [a.message for a in actions if isinstance(a, Send)]


def test_ids_sorted_by_hostname_descending_then_port_ascending():
    nodes = [node(Role.WORKER, "10.0.0.1", 500), node(Role.SERVER, "10.0.0.2", 900),
             node(Role.WORKER, "10.0.0.2", 100), node(Role.SERVER, "10.0.0.1", 50),
             node(Role.WORKER, "10.0.0.10", 1)]
    ids = {(n.hostname, n.port): n.id for n in assign_ids(nodes)}
    # order: 10.0.0.2:100 w, 10.0.0.2:900 s, 10.0.0.10:1 w, 10.0.0.1:50 s, 10.0.0.1:500 w
    assert ids == {("10.0.0.2", 100): 9, ("10.0.0.2", 900): 8, ("10.0.0.10", 1): 11,
                   ("10.0.0.1", 50): 10, ("10.0.0.1", 500): 13}


def test_ids_match_upstream_capture():
    # cap1: worker port 39431 -> 9, server 43905 -> 8, worker 58517 -> 11 (arrival order differs)
    nodes = [node(Role.WORKER, "127.0.0.1", 58517), node(Role.SERVER, "127.0.0.1", 43905),
             node(Role.WORKER, "127.0.0.1", 39431)]
    assert [(n.port, n.id) for n in assign_ids(nodes)] == [(39431, 9), (43905, 8), (58517, 11)]


def test_workers_asking_for_ranks_get_them():
    # our workers send DMLC_WORKER_ID; the sort order would give 10.0.0.9 rank 0
    nodes = [Node(Role.WORKER, hostname="10.0.0.1", port=5, rank_hint=0),
             Node(Role.WORKER, hostname="10.0.0.9", port=5, rank_hint=1),
             node(Role.SERVER, "10.0.0.1", 6), node(Role.SERVER, "10.0.0.9", 6)]
    ids = {(n.role, n.hostname): n.id for n in assign_ids(nodes)}
    assert ids[(Role.WORKER, "10.0.0.1")] == 9 and ids[(Role.WORKER, "10.0.0.9")] == 11
    assert ids[(Role.SERVER, "10.0.0.9")] == 8  # servers ask nothing: upstream's order


@pytest.mark.parametrize("hints", [(0, None), (0, 0), (1, 2)])
def test_partial_duplicate_or_out_of_range_rank_requests_fall_back_to_upstream_order(hints):
    # e.g. an upstream worker (no hint) beside ours, or two workers launched with the same id
    nodes = [Node(Role.WORKER, hostname="10.0.0.1", port=5, rank_hint=hints[0]),
             Node(Role.WORKER, hostname="10.0.0.9", port=5, rank_hint=hints[1])]
    ids = {n.hostname: n.id for n in assign_ids(nodes)}
    assert ids == {"10.0.0.9": 9, "10.0.0.1": 11}


def test_group_members_order():
    assert group_members(7, 2, 2) == [9, 11, 8, 10, 1]
    assert group_members(4, 3, 1) == [9, 11, 13]
    assert group_members(2, 2, 2) == [8, 10]


def make_scheduler(workers=2, servers=1, deadline=100.0):
    return SchedulerMembership(node(Role.SCHEDULER, "127.0.0.1", 9091), workers, servers,
                               start_deadline=deadline)


def test_scheduler_replies_to_workers_then_servers_once_complete():
    sched = make_scheduler()
    members = [node(Role.WORKER, "127.0.0.1", 3000), node(Role.SERVER, "127.0.0.1", 2000),
               node(Role.WORKER, "127.0.0.1", 1000)]
    assert sched.handle(add_node_request(members[0]), 1.0) == []
    assert sched.handle(add_node_request(members[1]), 1.0) == []
    actions = sched.handle(add_node_request(members[2]), 1.0)
    assert [a.node.id for a in actions if isinstance(a, Connect)] == [9, 8, 11]
    replies = sends(actions)
    assert [m.meta.recver for m in replies] == [9, 11, 8]
    assert [m.meta.timestamp for m in replies] == [0, 1, 2]
    announced = replies[0].meta.control.nodes
    assert [(n.port, n.id) for n in announced] == [(1000, 9), (2000, 8), (3000, 11), (9091, 1)]
    assert any(isinstance(a, Ready) for a in actions) and sched.ready


def test_scheduler_ignores_add_node_from_named_identity():
    sched = make_scheduler(workers=1, servers=0)
    assert sched.handle(from_sender(add_node_request(node(Role.WORKER, "h", 1)), 9), 0) == []
    assert not sched.ready


def test_scheduler_deadline_names_missing_roles():
    sched = make_scheduler(workers=2, servers=2, deadline=5.0)
    sched.handle(add_node_request(node(Role.WORKER, "127.0.0.1", 1)), 1.0)
    assert sched.tick(4.0) == []
    [failed] = sched.tick(6.0)
    assert isinstance(failed, Fail) and isinstance(failed.error, ClusterStartError)
    assert "1 of 2 workers and 2 of 2 servers" in str(failed.error)


def test_barrier_counts_every_request_including_scheduler_and_resets():
    sched = make_scheduler(workers=2, servers=1)
    clock = VanClock()
    for sender in (9, 11, 8):
        assert sched.handle(from_sender(barrier_request(7, 0, clock), sender), 0) == []
    replies = sends(sched.handle(from_sender(barrier_request(7, 0, clock), 1), 0))
    assert [m.meta.recver for m in replies] == [9, 11, 8, 1]
    assert all(m.meta.control.cmd == ControlCommand.BARRIER and not m.meta.request and m.meta.app_id == 0
               for m in replies)
    # counter was reset: a new round needs all members again
    assert sched.handle(from_sender(barrier_request(7, 0, clock), 9), 0) == []


def test_worker_group_barrier_is_independent():
    sched = make_scheduler(workers=2, servers=1)
    clock = VanClock()
    assert sched.handle(from_sender(barrier_request(4, 0, clock), 9), 0) == []
    assert sched.handle(from_sender(barrier_request(7, 0, clock), 8), 0) == []
    assert [m.meta.recver for m in sends(
        sched.handle(from_sender(barrier_request(4, 0, clock), 11), 0))] == [9, 11]


def test_barrier_response_releases_node():
    reply = Message(Meta(app_id=0, control=Control(cmd=ControlCommand.BARRIER, barrier_group=-12345)))
    member = NodeMembership(node(Role.WORKER, "h", 1), node(Role.SCHEDULER, "h", 2), 10)
    assert member.handle(reply, 0) == [ReleaseBarrier(0)]


def test_heartbeat_recorded_and_answered_for_members_only():
    sched = formed_scheduler(heartbeating=())
    hb = from_sender(Message(Meta(control=Control(cmd=ControlCommand.HEARTBEAT,
                                                  nodes=[node(Role.WORKER, "h", 5, 11)])), []), 11)
    replies = sends(sched.handle(hb, 42.0))
    assert replies[0].meta.recver == 11 and replies[0].meta.control.nodes[0].id == 1
    assert sched.dead_nodes(50.0, 5.0) == [11] and sched.dead_nodes(45.0, 5.0) == []
    for sender, about in ((99, 99), (9, 11)):      # a stranger; a node speaking for another
        forged = from_sender(Message(Meta(control=Control(
            cmd=ControlCommand.HEARTBEAT, nodes=[node(Role.WORKER, "h", 5, about)])), []), sender)
        actions = sched.handle(forged, 43.0)
        assert len(actions) == 1 and isinstance(actions[0], Refused)


def make_worker(deadline=10.0, heartbeat=0.0):
    return NodeMembership(node(Role.WORKER, "127.0.0.1", 4000),
                          node(Role.SCHEDULER, "127.0.0.1", 9091), deadline, heartbeat)


def test_node_start_sends_anonymous_add_node():
    actions = make_worker().start(0.0)
    assert actions[0] == Connect(node(Role.SCHEDULER, "127.0.0.1", 9091, 1), anonymous=True)
    msg = actions[1].message
    assert msg.meta.control.cmd == ControlCommand.ADD_NODE and msg.meta.timestamp == 0
    assert msg.meta.control.nodes[0].port == 4000


def scheduler_reply(nodes):
    return Message(Meta(control=Control(cmd=ControlCommand.ADD_NODE, nodes=nodes), timestamp=0))


def test_node_adopts_id_and_connects_to_other_role_scheduler_and_itself():
    worker = make_worker(heartbeat=2.0)
    worker.start(0.0)
    nodes = [node(Role.WORKER, "127.0.0.1", 4000, 9), node(Role.SERVER, "127.0.0.1", 5000, 8),
             node(Role.WORKER, "127.0.0.1", 6000, 11), node(Role.SCHEDULER, "127.0.0.1", 9091, 1)]
    actions = worker.handle(scheduler_reply(nodes), 1.0)
    assert [a.node.id for a in actions if isinstance(a, Connect)] == [9, 8, 1]
    assert worker.my_node.id == 9 and worker.ready
    assert worker.tick(2.0) == []
    beat = sends(worker.tick(3.5))
    assert beat[0].meta.control.cmd == ControlCommand.HEARTBEAT and beat[0].meta.control.nodes[0].id == 9


def test_node_not_in_list_is_an_error():
    worker = make_worker()
    [failed] = worker.handle(scheduler_reply([node(Role.SERVER, "127.0.0.1", 5000, 8)]), 1.0)
    assert isinstance(failed.error, ClusterStartError)
    assert "does not contain this node" in str(failed.error)


def test_node_deadline_names_scheduler_address():
    worker = make_worker(deadline=5.0)
    worker.start(0.0)
    assert worker.tick(4.9) == []
    [failed] = worker.tick(5.1)
    assert isinstance(failed.error, ClusterStartError) and "127.0.0.1:9091" in str(failed.error)


def test_terminate_stops_only_when_the_node_sent_it_to_itself():
    worker, scheduler = make_worker(), make_scheduler()
    own = terminate_message(K_EMPTY)                 # the worker has no id yet
    assert worker.handle(own, 0) == [Stop()]
    from_self = terminate_message(1)
    from_self.meta.sender = 1
    assert scheduler.handle(from_self, 0) == [Stop()]
    for sender in (9, K_EMPTY):                      # anyone else: refused, with a reason
        rogue = terminate_message(1)
        rogue.meta.sender = sender
        actions = scheduler.handle(rogue, 0)
        assert len(actions) == 1 and isinstance(actions[0], Refused)
        assert "only stops itself" in actions[0].reason


def test_shutdown_sequence_second_group7_barrier_needs_everyone():
    """The scheduler's second Barrier(7) completes only when all nodes entered finalize."""
    sched = make_scheduler(workers=1, servers=1)
    clock = VanClock()
    for sender in (9, 8, 1):                          # start-up barrier
        actions = sched.handle(from_sender(barrier_request(7, 0, clock), sender), 0)
    assert len(sends(actions)) == 3
    assert sched.handle(from_sender(barrier_request(7, 0, clock), 1), 0) == []  # scheduler waits
    assert len(sends(sched.handle(from_sender(barrier_request(4, 0, clock), 9), 0))) == 1
    assert sched.handle(from_sender(barrier_request(7, 0, clock), 8), 0) == []
    assert len(sends(sched.handle(from_sender(barrier_request(7, 0, clock), 9), 0))) == 3


def test_a_barrier_counts_each_member_once_and_no_stranger():
    sched = make_scheduler(workers=1, servers=1)
    clock = VanClock()
    for stranger in (99, K_EMPTY, 10):                # not in group 7 of a 1x1 cluster
        actions = sched.handle(from_sender(barrier_request(7, 0, clock), stranger), 0)
        assert len(actions) == 1 and isinstance(actions[0], Refused)
    for sender in (9, 9, 8):                          # a repeated request counts once
        assert sends(sched.handle(from_sender(barrier_request(7, 0, clock), sender), 0)) == []
    assert len(sends(sched.handle(from_sender(barrier_request(7, 0, clock), 1), 0))) == 3


# ------------------------------------------------------------------ dead nodes
def formed_scheduler(timeout=5.0, heartbeating=(1000, 2000, 3000)):
    """A 2-worker 1-server cluster formed at t=10; ports in ``heartbeating`` announce heartbeats."""
    sched = SchedulerMembership(node(Role.SCHEDULER, "127.0.0.1", 9091), 2, 1,
                                start_deadline=100.0, heartbeat_timeout=timeout)
    for role, port in ((Role.WORKER, 3000), (Role.SERVER, 2000), (Role.WORKER, 1000)):
        member = node(role, "127.0.0.1", port)
        if port in heartbeating:
            member.heartbeat_ms = 1000
        sched.handle(add_node_request(member), 10.0)
    return sched


def heartbeat_from(node_id, port, role=Role.WORKER):
    msg = control_message(ControlCommand.HEARTBEAT, 1, nodes=[node(role, "127.0.0.1", port, node_id)])
    return from_sender(msg, node_id)


def test_a_silent_node_is_declared_dead_once_and_everyone_else_is_told():
    sched = formed_scheduler()
    assert sched.tick(14.0) == []
    sched.handle(heartbeat_from(9, 1000), 14.0)   # (ids: worker 1000 -> 9, 3000 -> 11)       # worker rank 0 and the server keep going
    sched.handle(heartbeat_from(8, 2000, Role.SERVER), 14.0)
    actions = sched.tick(15.5)                          # worker 11 silent since 10.0
    dead = [a for a in actions if isinstance(a, NodeDead)]
    assert [(a.node.id, a.node.port) for a in dead] == [(11, 3000)]
    assert "no heartbeat for 6 s" in dead[0].reason
    notices = sends(actions)
    assert sorted(m.meta.recver for m in notices) == [8, 9]
    assert all(m.meta.extra == {"dead_node": True} and m.meta.control.nodes[0].id == 11
               for m in notices)
    later = [a.node.id for a in sched.tick(30.0) if isinstance(a, NodeDead)]
    assert 11 not in later                              # reported once


def test_nodes_that_never_said_they_heartbeat_are_never_declared_dead():
    sched = formed_scheduler(heartbeating=(2000,))      # two upstream workers, our server
    sched.handle(heartbeat_from(8, 2000, Role.SERVER), 100.0)
    assert not [a for a in sched.tick(101.0) if isinstance(a, NodeDead)]


def test_a_node_fails_on_the_schedulers_notice_only():
    worker = NodeMembership(node(Role.WORKER, "127.0.0.1", 4000),
                            node(Role.SCHEDULER, "127.0.0.1", 9091), 10.0, 1.0,
                            heartbeat_timeout=5.0)
    assert worker.my_node.heartbeat_ms == 1000          # announced in its ADD_NODE
    notice = control_message(ControlCommand.HEARTBEAT, 9, nodes=[node(Role.SERVER, "h", 2000, 8)])
    notice.meta.extra = {"dead_node": True}
    actions = worker.handle(from_sender(notice, 1), 0.0)
    assert len(actions) == 1 and isinstance(actions[0], NodeDead) and actions[0].node.id == 8
    refused = worker.handle(from_sender(notice, 11), 0.0)
    assert len(refused) == 1 and isinstance(refused[0], Refused)


def test_a_node_ending_the_job_has_the_scheduler_tell_everyone_why_then_stop():
    sched = formed_scheduler()
    request = from_sender(abort_request("the optimizer was refused", VanClock()), 8)
    actions = sched.handle(request, 20.0)
    notices = sends(actions)
    assert sorted(m.meta.recver for m in notices) == [8, 9, 11]    # the sender too
    why = notices[0].meta.extra["abort"]
    assert "server rank 0" in why and "the optimizer was refused" in why
    assert sched.handle(request, 20.1) == []                       # told once
    assert not any(isinstance(a, Fail) for a in sched.tick(20.0 + ABORT_GRACE_S / 2))
    failed = [a for a in sched.tick(20.0 + ABORT_GRACE_S) if isinstance(a, Fail)]
    assert len(failed) == 1 and isinstance(failed[0].error, JobAbortedError)
    worker = NodeMembership(node(Role.WORKER, "127.0.0.1", 4000),
                            node(Role.SCHEDULER, "127.0.0.1", 9091), 10.0)
    worker.ready = True     # (a notice before it is ready ends its start: test_elastic_grow)
    stopped = worker.handle(from_sender(notices[1], 1), 21.0)
    assert len(stopped) == 1 and isinstance(stopped[0], Fail)
    assert isinstance(stopped[0].error, JobAbortedError) and str(stopped[0].error) == why


def test_the_exit_status_a_worker_ends_the_job_with_reaches_every_node():
    # a worker's sys.exit(3): every node of the job exits 3, so every launcher passes it on
    sched = formed_scheduler()
    request = from_sender(abort_request("its program exited with status 3", VanClock(), 3), 11)
    notices = sends(sched.handle(request, 20.0))
    assert {m.meta.extra["abort_status"] for m in notices} == {3}
    worker = NodeMembership(node(Role.WORKER, "127.0.0.1", 4000),
                            node(Role.SCHEDULER, "127.0.0.1", 9091), 10.0)
    worker.ready = True     # (a notice before it is ready ends its start: test_elastic_grow)
    [stopped] = worker.handle(from_sender(notices[0], 1), 21.0)
    assert stopped.error.status == 3
    [failed] = [a for a in sched.tick(20.0 + ABORT_GRACE_S) if isinstance(a, Fail)]
    assert failed.error.status == 3
    # the default: status 1, and no field on the wire (older nodes read it as before)
    plain = sends(formed_scheduler().handle(
        from_sender(abort_request("x", VanClock()), 11), 20.0))
    assert all("abort_status" not in m.meta.extra for m in plain)


def test_only_members_end_the_job_and_only_the_schedulers_notice_stops_a_node():
    sched = formed_scheduler()
    stranger = sched.handle(from_sender(abort_request("x", VanClock()), 99), 20.0)
    assert len(stranger) == 1 and isinstance(stranger[0], Refused) and sched.aborting is None
    worker = NodeMembership(node(Role.WORKER, "127.0.0.1", 4000),
                            node(Role.SCHEDULER, "127.0.0.1", 9091), 10.0)
    forged = control_message(ControlCommand.HEARTBEAT, 9)
    forged.meta.extra = {"abort": "forged"}
    refused = worker.handle(from_sender(forged, 11), 0.0)
    assert len(refused) == 1 and isinstance(refused[0], Refused)


def test_a_node_declares_a_silent_scheduler_dead():
    worker = NodeMembership(node(Role.WORKER, "127.0.0.1", 4000),
                            node(Role.SCHEDULER, "127.0.0.1", 9091), 10.0, 1.0,
                            heartbeat_timeout=5.0)
    reply = control_message(ControlCommand.ADD_NODE, 9, nodes=[
        node(Role.WORKER, "127.0.0.1", 4000, 9), node(Role.SCHEDULER, "127.0.0.1", 9091, 1)])
    worker.handle(from_sender(reply, 1), 1.0)
    worker.handle(from_sender(control_message(ControlCommand.HEARTBEAT, 9), 1), 3.0)
    assert not [a for a in worker.tick(7.5) if isinstance(a, NodeDead)]
    dead = [a for a in worker.tick(8.5) if isinstance(a, NodeDead)]
    assert len(dead) == 1 and dead[0].node.role == Role.SCHEDULER


# ------------------------------------------------------------------ restarted servers
def restarted_server(port, heartbeat_ms=1000):
    member = node(Role.SERVER, "127.0.0.1", port)
    member.heartbeat_ms = heartbeat_ms
    return add_node_request(member)


def test_a_restarted_server_at_the_dead_ones_address_takes_its_id_at_once():
    sched = formed_scheduler()
    actions = sched.handle(restarted_server(2000), 11.0)
    recovered = [a for a in actions if isinstance(a, NodeRecovered)]
    assert [(a.node.id, a.node.is_recovery, a.epoch) for a in recovered] == [(8, True, 1)]
    assert [a.node.port for a in actions if isinstance(a, Connect)] == [2000]
    notices = {m.meta.recver: m for m in sends(actions)}
    assert sorted(notices) == [8, 9, 11]
    assert all(m.meta.extra == {"epoch": 1} for m in notices.values())
    assert len(notices[8].meta.control.nodes) == 4        # the newcomer: everyone
    assert [n.id for n in notices[9].meta.control.nodes] == [8]     # the others: just it
    again = sched.handle(restarted_server(2000), 12.0)      # a second restart: epoch 2
    assert [a.epoch for a in again if isinstance(a, NodeRecovered)] == [2]


def test_a_restarted_server_elsewhere_waits_until_a_server_misses_two_heartbeats():
    sched = formed_scheduler(timeout=30.0)
    for t in (10.5, 11.5):
        for node_id, port in ((9, 1000), (11, 3000)):
            sched.handle(heartbeat_from(node_id, port), t)
    assert sched.handle(restarted_server(5000), 11.6) == []   # server 8 heard at 10.0
    assert not [a for a in sched.tick(11.9) if isinstance(a, NodeRecovered)]
    recovered = [a for a in sched.tick(12.1) if isinstance(a, NodeRecovered)]
    assert [(a.node.id, a.node.port) for a in recovered] == [(8, 5000)]
    assert not [a for a in sched.tick(12.2) if isinstance(a, NodeDead)]


def test_a_restarted_server_replacing_no_silent_server_is_refused_in_the_end():
    sched = formed_scheduler(timeout=5.0)
    sched.handle(restarted_server(5000), 10.5)
    for t in range(11, 17):
        for node_id, port, role in ((9, 1000, Role.WORKER), (11, 3000, Role.WORKER),
                                    (8, 2000, Role.SERVER)):
            sched.handle(heartbeat_from(node_id, port, role), float(t))
        actions = sched.tick(t + 0.1)
        assert not [a for a in actions if isinstance(a, NodeRecovered)]
    assert any(isinstance(a, Refused) and "replaces none" in a.reason for a in actions)
    assert sched.replacements == []


@pytest.mark.parametrize("case", ["upstream server", "upstream worker", "a worker"])
def test_late_joiners_that_cannot_restore_a_server_are_refused(case):
    sched = formed_scheduler(heartbeating=(2000, 3000) if case == "upstream worker"
                             else (1000, 2000, 3000))
    if case == "upstream server":
        request = restarted_server(2000, heartbeat_ms=None)
    elif case == "a worker":
        request = add_node_request(node(Role.WORKER, "127.0.0.1", 7000))
    else:
        request = restarted_server(2000)
    actions = sched.handle(request, 11.0)
    assert len(actions) == 1 and isinstance(actions[0], Refused), actions


def formed_worker():
    worker = NodeMembership(node(Role.WORKER, "127.0.0.1", 4000),
                            node(Role.SCHEDULER, "127.0.0.1", 9091), 10.0)
    reply = control_message(ControlCommand.ADD_NODE, 9, nodes=[
        node(Role.SERVER, "127.0.0.1", 2000, 8), node(Role.WORKER, "127.0.0.1", 4000, 9),
        node(Role.SCHEDULER, "127.0.0.1", 9091, 1)])
    worker.handle(from_sender(reply, 1), 1.0)
    return worker


def test_a_node_reconnects_to_a_restarted_server_on_the_schedulers_word_only():
    worker = formed_worker()
    moved = node(Role.SERVER, "127.0.0.1", 5000, 8)
    moved.is_recovery = True
    notice = control_message(ControlCommand.ADD_NODE, 9, nodes=[moved])
    notice.meta.extra = {"epoch": 3}
    refused = worker.handle(from_sender(notice, 11), 2.0)
    assert len(refused) == 1 and isinstance(refused[0], Refused)
    actions = worker.handle(from_sender(notice, 1), 2.0)
    assert [type(a) for a in actions] == [Connect, NodeRecovered]
    assert actions[0].node.port == 5000 and actions[1].epoch == 3
    assert [n.port for n in worker.nodes if n.id == 8] == [5000]


def test_the_restarted_server_learns_its_epoch_from_the_reply():
    server = NodeMembership(node(Role.SERVER, "127.0.0.1", 5000),
                            node(Role.SCHEDULER, "127.0.0.1", 9091), 10.0)
    me = node(Role.SERVER, "127.0.0.1", 5000, 8)
    me.is_recovery = True
    reply = control_message(ControlCommand.ADD_NODE, 8, nodes=[
        me, node(Role.WORKER, "127.0.0.1", 4000, 9), node(Role.SCHEDULER, "127.0.0.1", 9091, 1)])
    reply.meta.extra = {"epoch": 2}
    ready = [a for a in server.handle(from_sender(reply, 1), 1.0) if isinstance(a, Ready)]
    assert ready[0].epoch == 2 and ready[0].my_node.id == 8


def test_a_node_forwards_its_own_posted_barrier_and_refuses_others():
    from kvstore_byteps.van.runtime.membership import barrier_post
    worker = formed_worker()
    post = barrier_post(4, 0, 9, worker.clock)
    before = worker.clock.tick()
    forwarded = sends(worker.handle(from_sender(post, 9), 2.0))
    assert len(forwarded) == 1
    sent = forwarded[0].meta
    assert (sent.recver, sent.request, sent.control.barrier_group) == (1, True, 4)
    assert sent.timestamp == before + 1           # stamped on the receive loop
    refused = worker.handle(from_sender(barrier_post(4, 0, 9, VanClock()), 11), 2.0)
    assert len(refused) == 1 and isinstance(refused[0], Refused)


def test_the_replaced_process_is_not_heard_any_more():
    """A server that only seemed dead (stalled) and comes back after its id was given to a
    restarted one: its heartbeats go unanswered, so it declares the scheduler dead and stops."""
    sched = formed_scheduler(timeout=30.0)
    sched.handle(restarted_server(5000), 11.0)
    recovered = [a for a in sched.tick(12.5) if isinstance(a, NodeRecovered)]
    assert [a.node.port for a in recovered] == [5000]
    old = sched.handle(heartbeat_from(8, 2000, Role.SERVER), 13.0)
    assert len(old) == 1 and isinstance(old[0], Refused) and "restarted server" in old[0].reason
    new = sched.handle(heartbeat_from(8, 5000, Role.SERVER), 13.0)
    assert sends(new) and sends(new)[0].meta.recver == 8


def test_the_postoffice_has_a_handler_for_every_action():
    """Postoffice._execute looks each action's type up in its table (no isinstance chain)."""
    from kvstore_byteps.van.runtime import membership
    from kvstore_byteps.van.runtime.postoffice import Postoffice
    assert set(Postoffice._ACTIONS) == set(membership.ACTIONS)
    assert all(callable(handler) for handler in Postoffice._ACTIONS.values())


def test_a_worker_in_its_finish_or_shutdown_barrier_holds_no_program_barrier_of_the_others():
    # backup workers: the fast workers end their loop with kv._barrier(); the straggler, its
    # training ended, exits: its finish and shutdown barriers must not pair with that one
    sched = make_scheduler(workers=3, servers=1)
    clock = VanClock()

    def barrier(sender, kind=""):
        return [m.meta.recver for m in sends(sched.handle(
            from_sender(barrier_request(4, 0, clock, kind), sender), 0))]
    assert barrier(9) == [] and barrier(11) == []          # the program's own
    assert barrier(13, "finish") == [9, 11]     # 13 waits in its finish: the requesters go
    assert barrier(9, "finish") == []
    assert barrier(11, "finish") == [9, 11, 13]  # finish pairs with finish
    # after the finish barriers the program's own barriers need every worker again (rank 0
    # initialises a key after finish_training, the others read it after the barrier)
    assert barrier(9) == [] and barrier(11) == [] and barrier(13) == [9, 11, 13]
    # a worker in its shutdown barrier holds neither kind of the others' any more
    assert barrier(13, "shutdown") == []
    assert barrier(9) == [] and barrier(11) == [9, 11]
    assert barrier(9, "finish") == [] and barrier(11, "finish") == [9, 11]
    refused = sched.handle(from_sender(barrier_request(4, 0, clock, "nap"), 9), 0)
    assert len(refused) == 1 and isinstance(refused[0], Refused)
