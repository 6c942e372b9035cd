"""Customers: an app's handler on a thread of its own (HandlerThread) or on the delivering
thread (InlineHandler, a worker's answers on vans that allow it)."""
import threading

from kvstore_byteps.van.base import Van
from kvstore_byteps.van.auto.van import AutoVan
from kvstore_byteps.van.runtime.customer import HandlerThread, InlineHandler
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


def test_two_delivering_threads_never_run_the_handler_at_once():
    inside, overlaps = [0], []
    lock = threading.Lock()

    def handler(m):
        with lock:
            inside[0] += 1
            overlaps.append(inside[0])
        for _ in range(1000):
            pass
        with lock:
            inside[0] -= 1
    customer = InlineHandler(0, 0, handler)
    threads = [threading.Thread(target=lambda: [customer.accept(message(i))
                                                for i in range(300)]) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert len(overlaps) == 600 and max(overlaps) == 1


def test_after_stop_nothing_more_is_handled():
    for kind in (InlineHandler, HandlerThread):
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
