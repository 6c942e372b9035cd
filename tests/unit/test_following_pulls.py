"""Row_sparse pulls that follow a push (kvstore_byteps/serving/following.py): held until a
round holding that worker's push of at least the named timestamp is done."""
from kvstore_byteps.serving.following import FollowingPulls


def test_a_pull_is_due_once_a_round_with_its_push_or_a_later_one_is_done():
    pulls, answered = FollowingPulls(), []
    assert not pulls.due(7, sender=9, after=100)
    pulls.hold(7, 9, 100, lambda: answered.append("a"))
    pulls.hold(7, 11, 101, lambda: answered.append("b"))
    pulls.hold(8, 9, 100, lambda: answered.append("other key"))
    for answer in pulls.round_done(7, [(9, 100), (13, 102)]):
        answer()
    assert answered == ["a"]                      # worker 11's push 101 is not in it
    assert pulls.due(7, 9, 100) and pulls.due(7, 9, 99) and not pulls.due(7, 9, 101)
    for answer in pulls.round_done(7, [(9, 104), (11, 103)]):
        answer()
    assert answered == ["a", "b"]
    assert pulls.round_done(7, [(9, 90)]) == [] and pulls.due(7, 9, 104)   # never goes back
