"""Customers: an app's handler on a thread of its own (HandlerThread), on the delivering
thread (InlineHandler, a worker's answers on vans that allow it), or each where it may
(MixedHandler: a server's quick requests inline while its thread is idle)."""
import threading

from kvstore_byteps.van.base import Van
from kvstore_byteps.van.auto.van import AutoVan
from kvstore_byteps.van.runtime.customer import HandlerThread, InlineHandler, MixedHandler
from kvstore_byteps.van.tcp.van import TcpVan
from kvstore_byteps.van.wire.message import Message, Meta
from kvstore_byteps.van.zmq.van import ZMQVan


def message(timestamp):
    return Message(Meta(timestamp=timestamp, sender=9))


def test_inline_handler_runs_each_message_at_once_on_the_delivering_thread():
    seen = []
    customer = InlineHandler(0, 0, lambda m: seen.append((m.meta.timestamp,
                                                          threading.get_ident())))
    customer.accept(message(1))
    customer.post(lambda: seen.append(("posted", threading.get_ident())))
    customer.accept(message(2))
    me = threading.get_ident()
    assert seen == [(1, me), ("posted", me), (2, me)]


def test_a_failing_message_is_logged_and_the_next_one_still_handled(caplog):
    seen = []

    def handler(m):
        if m.meta.timestamp == 1:
            raise ValueError("bad")
        seen.append(m.meta.timestamp)
    customer = InlineHandler(0, 0, handler)
    customer.accept(message(1))               # does not raise into the receive loop
    customer.accept(message(2))
    assert seen == [2]
    assert "failed on a message from node 9" in caplog.text


def overlap_counter():
    """A handler that records how many calls of it were running as each began."""
    inside, overlaps, lock = [0], [], threading.Lock()

    def handler(m):
        with lock:
            inside[0] += 1
            overlaps.append(inside[0])
        for _ in range(1000):
            pass
        with lock:
            inside[0] -= 1
    return handler, overlaps


def test_two_delivering_threads_never_run_the_handler_at_once():
    handler, overlaps = overlap_counter()
    customer = InlineHandler(0, 0, handler)
    threads = [threading.Thread(target=lambda: [customer.accept(message(i))
                                                for i in range(300)]) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert len(overlaps) == 600 and max(overlaps) == 1


def test_after_stop_nothing_more_is_handled():
    kinds = (InlineHandler, HandlerThread,
             lambda *args: MixedHandler(*args, quick=lambda m: True))
    for kind in kinds:
        seen = []
        customer = kind(0, 0, lambda m: seen.append(m.meta.timestamp))
        customer.accept(message(1))
        customer.stop(5.0)
        customer.accept(message(2))
        customer.post(lambda: seen.append("posted"))
        assert seen == [1], kind


def test_only_vans_whose_sends_never_wait_for_a_peer_take_handlers_inline():
    assert not Van.handlers_inline_ok and not ZMQVan.handlers_inline_ok
    assert TcpVan.handlers_inline_ok and AutoVan.handlers_inline_ok


def test_a_customer_says_whether_its_handler_runs_on_the_receive_loop():
    # the worker engine runs its next pushes where answers return credit only on the receive
    # loop of a van whose sends never wait (KVWorker.answers_on_receive_loop)
    inline = InlineHandler(0, 0, lambda m: None)
    threaded = HandlerThread(0, 0, lambda m: None)
    try:
        assert inline.on_receive_loop and not threaded.on_receive_loop
    finally:
        threaded.stop(5.0)


def quick_if_even(m):
    return m.meta.timestamp % 2 == 0


def test_mixed_handler_runs_quick_messages_inline_and_the_rest_on_its_thread():
    seen, handled = [], threading.Event()

    def handler(m):
        seen.append((m.meta.timestamp, threading.get_ident()))
        if m.meta.timestamp == 1:
            handled.set()
    customer = MixedHandler(0, 0, handler, quick_if_even)
    try:
        me = threading.get_ident()
        customer.accept(message(2))
        assert seen == [(2, me)]                  # quick, the thread idle: handled here
        customer.accept(message(1))               # not quick: its thread
        assert handled.wait(10)
        assert seen[1][0] == 1 and seen[1][1] != me
    finally:
        customer.stop(5.0)


def test_mixed_handler_queues_quick_messages_behind_a_busy_thread_in_arrival_order():
    seen, release, started = [], threading.Event(), threading.Event()

    def handler(m):
        if m.meta.timestamp == 1:                 # a slow message holds the thread
            started.set()
            release.wait(10)
        seen.append((m.meta.timestamp, threading.get_ident()))
    customer = MixedHandler(0, 0, handler, quick_if_even)
    try:
        customer.accept(message(1))
        assert started.wait(10)
        customer.accept(message(2))               # quick, but must not overtake 1
        customer.post(lambda: seen.append(("posted", threading.get_ident())))
        customer.accept(message(4))
        assert seen == []
        release.set()
        done = threading.Event()
        customer.post(done.set)
        assert done.wait(10)
        assert [s[0] for s in seen] == [1, 2, "posted", 4]
        assert len({s[1] for s in seen}) == 1 and seen[0][1] != threading.get_ident()
        customer.accept(message(6))               # idle again: inline
        assert seen[-1] == (6, threading.get_ident())
    finally:
        customer.stop(5.0)


def test_mixed_handler_never_runs_two_messages_at_once():
    handler, overlaps = overlap_counter()
    customer = MixedHandler(0, 0, handler, quick_if_even)
    try:
        threads = [threading.Thread(target=lambda: [customer.accept(message(i))
                                                    for i in range(300)]) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        done = threading.Event()
        customer.post(done.set)
        assert done.wait(10)
        assert len(overlaps) == 600 and max(overlaps) == 1
    finally:
        customer.stop(5.0)


def test_a_mixed_handlers_failing_quick_message_is_logged_and_not_raised(caplog):
    def handler(m):
        raise ValueError("bad")
    customer = MixedHandler(0, 0, handler, quick_if_even)
    try:
        customer.accept(message(2))
        assert "failed on a message from node 9" in caplog.text
    finally:
        customer.stop(5.0)
