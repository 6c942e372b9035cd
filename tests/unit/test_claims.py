"""Which byteps_tcp connection speaks for which node id (van/tcp/claims.py), pure."""
from kvstore_byteps.config import Role
from kvstore_byteps.van.tcp.claims import HOLD, READ, RECONNECT_WINDOW_S, REFUSE, Claims
from kvstore_byteps.van.wire.message import K_EMPTY, Node

NODES = [Node(Role.SERVER, 8, "10.0.0.1", 9000), Node(Role.WORKER, 9, "10.0.0.2", 9001),
         Node(Role.SCHEDULER, 1, "10.0.0.3", 9002)]


def moved(node_id, port):
    return [Node(n.role, n.id, n.hostname, port if n.id == node_id else n.port) for n in NODES]


def test_the_first_connection_of_an_id_is_read_a_second_is_held_until_the_first_closes():
    claims = Claims()
    assert claims.admit("worker", 9)[0] == READ
    decision, replaced, why = claims.admit("spoof", 9)
    assert decision == HOLD and replaced is None and "node 9" in why
    assert claims.admit("spoof2", 9)[:2] == (HOLD, "spoof")     # one held per id, the newest
    assert claims.closed("spoof") is None                        # forgotten already
    assert claims.closed("worker") == "spoof2"                   # the held one takes over
    assert claims.admit("third", 9)[0] == HOLD
    assert claims.closed("third") is None and claims.closed("spoof2") is None
    assert claims.admit("fourth", 9)[0] == READ


def test_anonymous_connections_are_always_read():
    claims = Claims()
    claims.nodes_changed(NODES)
    assert [claims.admit(c, K_EMPTY)[0] for c in "abc"] == [READ, READ, READ]


def test_once_the_nodes_are_known_a_claim_of_another_id_is_refused_and_old_ones_dropped():
    claims = Claims()
    assert claims.admit("early", 99)[0] == READ          # no node list yet: nothing to check
    assert claims.admit("worker", 9)[0] == READ
    close, read = claims.nodes_changed(NODES)
    assert close == ["early"] and read == []
    decision, _, why = claims.admit("late", 77)
    assert decision == REFUSE and "77" in why


def test_a_moved_node_gives_its_id_to_the_newest_connection():
    claims = Claims()
    claims.nodes_changed(NODES, now=0.0)
    assert claims.admit("old server", 8, now=1.0)[0] == READ
    assert claims.admit("restarted", 8, now=100.0)[0] == HOLD    # the old one looks alive
    assert claims.nodes_changed(moved(8, 9100), now=100.1) == (["old server"], ["restarted"])


def test_a_moved_node_already_reconnected_keeps_its_new_connection():
    claims = Claims()
    claims.nodes_changed(NODES, now=0.0)
    claims.admit("old server", 8, now=1.0)
    claims.closed("old server")                               # it died: its connection closed
    assert claims.admit("restarted", 8, now=100.0)[0] == READ    # before the announcement
    assert claims.nodes_changed(moved(8, 9100), now=100.2) == ([], [])
    assert claims.admit("spoof", 8, now=101.0)[0] == HOLD


def test_a_moved_node_whose_old_connection_is_still_open_loses_it_then_reconnects():
    claims = Claims()
    claims.nodes_changed(NODES, now=0.0)
    claims.admit("old server", 8, now=1.0)
    later = 1.0 + RECONNECT_WINDOW_S + 1
    assert claims.nodes_changed(moved(8, 9100), now=later) == (["old server"], [])
    assert claims.admit("restarted", 8, now=later + 0.1)[0] == READ
