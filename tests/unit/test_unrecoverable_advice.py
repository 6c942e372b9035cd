"""A worker that cannot restore a restarted server says so, and why, whether its send to the
dead server fails first or the restart's announcement comes first (engine/recovery.py)."""
from kvstore_byteps.engine.recovery import RecoveryKeeper, Unrecoverable
from kvstore_byteps.errors import PeerError

REASON = "this worker did not keep its last pushes: set BYTEPS_SERVER_RECOVERY=1"


def send_failure():
    error = PeerError("push of 2 key(s): sending to node 10 failed: Broken pipe")
    error.unreachable_node = 10
    return error


def test_a_failed_send_to_a_server_names_what_to_set():
    explained = Unrecoverable(None, 0, REASON, lambda e: None).explain(send_failure())
    assert isinstance(explained, PeerError)
    assert "Broken pipe" in str(explained) and "cannot restore it" in str(explained)
    assert "BYTEPS_SERVER_RECOVERY=1" in str(explained)


def test_other_errors_and_a_recovering_worker_are_left_as_they_are():
    other = PeerError("the server answered: bad key")
    assert Unrecoverable(None, 0, REASON, lambda e: None).explain(other) is other
    assert Unrecoverable(None, 0, REASON, lambda e: None).explain(None) is None
    failure = send_failure()
    assert RecoveryKeeper(None, 0, lambda e: None).explain(failure) is failure
