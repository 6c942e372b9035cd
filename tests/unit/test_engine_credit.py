"""Unit tests of the credit-based priority queue. Pure."""
import pytest

from kvstore_byteps.engine.credit import CreditScheduler


def drain(queue):
    out = []
    while queue.ready():
        out.append(queue.pop())
        queue.release()
    return out


def test_higher_priority_leaves_first_and_fifo_among_equals():
    queue = CreditScheduler()
    for name, priority in [("a", 0), ("b", -1), ("c", 0), ("d", 5), ("e", -1)]:
        queue.push(name, priority)
    assert drain(queue) == ["d", "a", "c", "b", "e"]


def test_credit_limits_items_in_flight():
    queue = CreditScheduler(credit=2)
    for index in range(4):
        queue.push(index)
    assert queue.pop() == 0 and queue.pop() == 1
    assert queue.pop() is None and not queue.ready() and queue.in_flight == 2
    queue.release()
    assert queue.pop() == 2 and queue.pop() is None


def test_higher_priority_enqueued_later_overtakes_queued_lower_ones():
    # MXNet passes priority = -param_index: the back layer (index 9) is pushed first.
    queue = CreditScheduler(credit=1)
    for part in range(3):
        queue.push(("layer9", part), -9)
    assert queue.pop() == ("layer9", 0)          # takes the only credit
    for part in range(2):
        queue.push(("layer0", part), 0)          # arrives while layer9 waits for credit
    order = []
    while len(queue):
        queue.release()
        order.append(queue.pop())
    assert order == [("layer0", 0), ("layer0", 1), ("layer9", 1), ("layer9", 2)]


def test_release_more_than_in_flight_is_an_error():
    queue = CreditScheduler(credit=1)
    with pytest.raises(ValueError, match="in flight"):
        queue.release()
    with pytest.raises(ValueError):
        CreditScheduler(credit=0)


def test_remove_if_drops_queued_items_in_order_without_credit():
    queue = CreditScheduler(credit=1)
    for item, priority in [("x1", 0), ("y", 3), ("x2", 1)]:
        queue.push(item, priority)
    assert queue.remove_if(lambda item: item.startswith("x")) == ["x2", "x1"]
    assert len(queue) == 1 and queue.in_flight == 0
    assert queue.pop() == "y"


def test_byte_weighted_credit_lets_many_small_items_fly_but_not_big_ones():
    queue = CreditScheduler(credit=100, cost=lambda item: item[1])
    for name, size in [("small1", 10), ("small2", 10), ("big", 90), ("small3", 10)]:
        queue.push((name, size), priority=0)
    assert queue.pop()[0] == "small1" and queue.pop()[0] == "small2"
    assert queue.pop() is None            # 20 in flight + 90 would exceed 100
    queue.release(10)
    queue.release(10)
    assert queue.pop()[0] == "big"        # nothing in flight: it may go even alone
    assert queue.pop()[0] == "small3"     # 90 + 10 <= 100


def test_item_costlier_than_credit_still_leaves_when_idle():
    queue = CreditScheduler(credit=5, cost=lambda item: 50)
    queue.push("huge")
    assert queue.pop() == "huge" and queue.in_flight == 50
