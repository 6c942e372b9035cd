"""KVStoreDistServer semantics with a recording responder (no sockets, no MXNet)."""
import numpy as np
import pytest

from kvstore_byteps.errors import PeerError
from kvstore_byteps.compress.twobit import quantize_2bit
from kvstore_byteps.serving.dist import KVStoreDistServer
from kvstore_byteps.mxproto import RequestType, ServerCommand, encode_cmd
from kvstore_byteps.serving.updater import RowSparseGrad
from tests.support.server_fakes import WORKER0, WORKER1, FakeServer, command, pull, push, request, \
    vector_request

BEGIN = 1000   # this server's key range begin: ps key 1005 is MXNet key 5


class RecordingSGD:
    """update = weight - 0.1 * grad, recording what the server handed over."""

    def __init__(self):
        self.calls = []

    def __call__(self, key, grad, weight):
        self.calls.append((key, grad, weight.dtype))
        if isinstance(grad, RowSparseGrad):
            out = np.array(weight, copy=True)
            out[grad.indices] -= 0.1 * grad.data
            return out
        return weight - np.float32(0.1) * grad


def make(num_workers=2, sync=True, updater=None):
    srv = KVStoreDistServer(num_workers, key_begin=BEGIN, updater_loader=lambda body: updater)
    fake = FakeServer()
    if sync:
        srv.handle_command(command(WORKER0, ServerCommand.SYNC_MODE), fake)
    if updater is not None:
        srv.handle_command(command(WORKER0, ServerCommand.CONTROLLER, b"opt"), fake)
    return srv, fake


def values_of(fake, req, dtype=np.float32):
    answer = fake.answer_to(req)
    assert answer.error is None, answer.error
    return answer.values(dtype)


def test_golden_sync_round_gives_the_sum_and_acks_after_the_round():
    srv, fake = make()
    srv.handle_request(vector_request("11_push_init_request", WORKER0), fake)   # zeros: init
    assert len(fake.answers) == 2 and fake.answers[-1].vals is None             # init acked
    r0 = push(WORKER0, 5, np.ones(100, np.float32))
    r1 = vector_request("13_push_request_r1", WORKER1)                            # 2.0 each
    srv.handle_request(r0, fake)
    assert not fake.answered(r0)                                                  # round open
    srv.handle_request(r1, fake)
    assert fake.answer_to(r0).vals is None and fake.answer_to(r1).vals is None
    p = pull(WORKER0, 5)
    srv.handle_request(p, fake)
    answer = fake.answer_to(p)
    assert answer.vals == vector_request("11_push_init_request").vals.tobytes().replace(
        b"\x00\x00\x00\x00", np.float32(3.0).tobytes())
    assert list(answer.keys) == [5] and list(answer.lens) == [400]   # lens in bytes


def test_each_round_replaces_the_store_with_that_rounds_sum():
    srv, fake = make()
    srv.handle_request(push(WORKER0, 7, np.zeros(4, np.float32)), fake)
    for step in range(3):
        srv.handle_request(push(WORKER0, 7, np.full(4, 1.0, np.float32)), fake)
        srv.handle_request(push(WORKER1, 7, np.full(4, 2.0, np.float32)), fake)
        p = pull(WORKER1, 7)
        srv.handle_request(p, fake)
        assert list(values_of(fake, p)) == [3.0] * 4     # not accumulated over rounds


def test_pushpull_answers_come_from_a_buffer_no_later_round_touches():
    srv, fake = make()
    srv.handle_request(push(WORKER0, 3, np.zeros(8, np.float32)), fake)
    answers = []
    for step in range(4):
        a = push(WORKER0, 3, np.full(8, step, np.float32), pull=True)
        b = push(WORKER1, 3, np.full(8, 10 * step, np.float32), pull=True)
        srv.handle_request(a, fake)
        srv.handle_request(b, fake)
        answers += [(fake.answer_to(a), 11.0 * step), (fake.answer_to(b), 11.0 * step)]
    for answer, expected in answers:   # the buffers handed to respond() are still intact
        assert (np.frombuffer(answer.vals_ref, np.float32) == expected).all()
        assert not answer.vals_ref.flags.writeable


def test_updater_applied_once_per_round_with_the_mxnet_key():
    sgd = RecordingSGD()
    srv, fake = make(updater=sgd)
    srv.handle_request(push(WORKER0, BEGIN + 5, np.ones(3, np.float32)), fake)
    srv.handle_request(push(WORKER0, BEGIN + 5, np.full(3, 1.0, np.float32)), fake)
    srv.handle_request(push(WORKER1, BEGIN + 5, np.full(3, 3.0, np.float32)), fake)
    p = pull(WORKER0, BEGIN + 5)
    srv.handle_request(p, fake)
    np.testing.assert_allclose(values_of(fake, p), 1.0 - 0.1 * 4.0, rtol=1e-6)
    assert [c[0] for c in sgd.calls] == [5]


def test_async_mode_applies_each_push_and_needs_an_updater():
    srv, fake = make(sync=False)
    srv.handle_request(push(WORKER0, 1, np.ones(2, np.float32)), fake)
    bad = push(WORKER1, 1, np.ones(2, np.float32))
    srv.handle_request(bad, fake)
    assert "needs an optimizer" in fake.answer_to(bad).error
    sgd = RecordingSGD()
    srv2, fake2 = make(sync=False, updater=sgd)
    srv2.handle_request(push(WORKER0, 1, np.ones(2, np.float32)), fake2)
    for sender in (WORKER0, WORKER1, WORKER0):
        req = push(sender, 1, np.ones(2, np.float32))
        srv2.handle_request(req, fake2)
        assert fake2.answer_to(req).error is None          # answered at once
    p = pull(WORKER1, 1)
    srv2.handle_request(p, fake2)
    np.testing.assert_allclose(values_of(fake2, p), 1.0 - 0.3, rtol=1e-6)


def test_pulls_are_answered_at_once_even_mid_round():
    srv, fake = make()
    srv.handle_request(push(WORKER0, 2, np.full(2, 5.0, np.float32)), fake)
    srv.handle_request(push(WORKER0, 2, np.full(2, 1.0, np.float32)), fake)   # round open
    p = pull(WORKER1, 2)
    srv.handle_request(p, fake)
    assert list(values_of(fake, p)) == [5.0, 5.0]


def test_float16_and_float64_keys_keep_their_dtype_on_the_wire():
    srv, fake = make()
    for key, dtype in ((1, np.float16), (2, np.float64)):
        srv.handle_request(push(WORKER0, key, np.zeros(4, dtype)), fake)
        srv.handle_request(push(WORKER0, key, np.full(4, 0.5, dtype)), fake)
        srv.handle_request(push(WORKER1, key, np.full(4, 0.25, dtype)), fake)
        p = pull(WORKER0, key, dtype)
        srv.handle_request(p, fake)
        assert list(values_of(fake, p, dtype)) == [0.75] * 4
        assert list(fake.answer_to(p).lens) == [4 * np.dtype(dtype).itemsize]


def test_golden_fp16_pushpull_with_multi_precision_updates_a_float32_master():
    sgd = RecordingSGD()
    srv, fake = make(updater=sgd)
    srv.handle_command(command(WORKER0, ServerCommand.SET_MULTI_PRECISION), fake)
    key = (2 ** 64 - 1) // 2 + 9
    srv.handle_request(push(WORKER0, key, np.ones(4, np.float16)), fake)      # init 1.0
    golden = vector_request("22_pushpull_fp16_request", WORKER1)              # fp16 gradient 1.0
    other = push(WORKER0, key, np.ones(4, np.float16), pull=True)
    srv.handle_request(golden, fake)
    srv.handle_request(other, fake)
    assert sgd.calls[0][1].dtype == np.float32 and sgd.calls[0][2] == np.float32
    expected = np.float16(np.float32(1.0) - np.float32(0.1) * np.float32(2.0))
    assert list(values_of(fake, golden, np.float16)) == [expected] * 4        # 0.7998 as vector 23
    assert fake.answer_to(golden).vals == vector_request("23_pushpull_fp16_response").vals.tobytes()


def test_row_sparse_init_sync_rounds_and_pull_lens_in_elements():
    srv, fake = make()
    srv.handle_request(vector_request("24_rowsparse_init_push", WORKER0), fake)   # 6 x 2
    master = (2 ** 64 - 1) // 2 + 7
    rs = encode_cmd(RequestType.ROW_SPARSE, np.float32)
    a = request(WORKER0, [master, master + 1, master + 4], np.ones((2, 2), np.float32), [0, 8, 8],
                push=True, head=rs)
    b = request(WORKER1, [master], None, [0], push=True, head=rs)                  # no rows here
    srv.handle_request(a, fake)
    srv.handle_request(b, fake)
    assert fake.answer_to(a).error is None and fake.answer_to(b).error is None
    p = vector_request("25_rowsparse_pull_request", WORKER1)                       # rows 1, 2
    srv.handle_request(p, fake)
    answer = fake.answer_to(p)
    assert list(answer.lens) == [0, 2, 2] and list(answer.keys) == list(p.keys)
    assert list(answer.values()) == [1.0, 1.0, 0.0, 0.0]   # the round's sum; row 2 unpushed
    empty = request(WORKER0, [master], pull=True, head=rs)
    srv.handle_request(empty, fake)
    assert list(fake.answer_to(empty).lens) == [0] and fake.answer_to(empty).vals == b""


def test_row_sparse_updater_gets_a_row_sparse_gradient():
    sgd = RecordingSGD()
    srv, fake = make(updater=sgd)
    rs = encode_cmd(RequestType.ROW_SPARSE, np.float32)
    srv.handle_request(request(WORKER0, [50, 50, 51, 52], np.ones((3, 2), np.float32),
                               [0, 8, 8, 8], push=True, head=rs), fake)
    for sender, rows in ((WORKER0, [2]), (WORKER1, [2, 0])):
        srv.handle_request(request(sender, [50] + [50 + r for r in rows],
                                   np.ones((len(rows), 2), np.float32), [0] + [8] * len(rows),
                                   push=True, head=rs), fake)
    grad = sgd.calls[0][1]
    assert isinstance(grad, RowSparseGrad) and list(grad.indices) == [0, 2]
    assert grad.data.tolist() == [[1.0, 1.0], [2.0, 2.0]] and sgd.calls[0][0] == 50 - BEGIN
    p = request(WORKER0, [50, 50, 51, 52], pull=True, head=rs)
    srv.handle_request(p, fake)
    np.testing.assert_allclose(fake.answer_to(p).values(), [0.9, 0.9, 1, 1, 0.8, 0.8], rtol=1e-6)


def test_two_bit_compressed_rounds_sum_the_dequantized_values():
    srv, fake = make()
    srv.handle_command(command(WORKER0, ServerCommand.SET_GRADIENT_COMPRESSION, b"1,0.500000"),
                       fake)
    key, size = BEGIN + 1, 20
    srv.handle_request(push(WORKER0, key, np.zeros(size, np.float32)), fake)   # init is cmd 0
    grads = [np.linspace(-1, 1, size).astype(np.float32), np.full(size, 0.7, np.float32)]
    expected = np.zeros(size, np.float32)
    for sender, grad in zip((WORKER0, WORKER1), grads):
        packed, residual = quantize_2bit(grad, 0.5)
        expected += grad - residual
        srv.handle_request(request(sender, [BEGIN + size, key], np.frombuffer(packed, np.uint8),
                                   [0, len(packed)], push=True, head=3), fake)
    p = pull(WORKER0, key, rtype=RequestType.COMPRESSED)
    srv.handle_request(p, fake)
    assert fake.errors() == []
    np.testing.assert_array_equal(values_of(fake, p), expected)


def test_compressed_push_before_the_compression_command_is_refused():
    srv, fake = make()
    req = vector_request("32_push_compressed", WORKER0)
    srv.handle_request(req, fake)
    assert "before kSetGradientCompression" in fake.answer_to(req).error


def test_every_command_is_answered_and_stop_stops():
    srv, fake = make()
    for head, body in ((ServerCommand.SET_PROFILER_PARAMS, b"filename:srvprof.json,0"),
                       (ServerCommand.SYNC_MODE, b""), (42, b"")):
        req = command(WORKER0, head, body)
        srv.handle_command(req, fake)
        assert fake.answered(req)
    assert "unknown server command 42" in fake.answers[-1].error
    assert not srv.stopped
    for rogue in (8, 1, 2147483647, WORKER0 + 2 * 5):   # a server, the scheduler, anonymous,
        req = vector_request("16_cmd_stopserver_request", rogue)   # a worker rank too high
        srv.handle_command(req, fake)
        assert "kStopServer refused: node %d is not a worker" % rogue in fake.answer_to(req).error
        assert not srv.stopped
    stop = vector_request("16_cmd_stopserver_request", WORKER0)
    srv.handle_command(stop, fake)
    assert fake.answer_to(stop).error is None and srv.wait_stopped(0)


@pytest.mark.parametrize("bad,match", [
    (lambda: pull(WORKER0, 77), "never initialised"),
    (lambda: push(WORKER0, 1, np.ones(3, np.float32)), "holds 4 values, push has 3"),
    (lambda: push(WORKER0, 1, np.ones(4, np.float64)), "holds float32, got a float64 push"),
    (lambda: request(WORKER0, [1], np.ones(4, np.float32), [12], push=True), "lens say 12"),
    (lambda: request(WORKER0, [1], np.ones(4, np.int32), [16], push=True,
                     head=encode_cmd(0, np.float32) + 14), "unsupported dtype int32"),
    (lambda: request(WORKER0, [1, 2], None, None, pull=True), "expected 1 key"),
    (lambda: push(WORKER0, 1, np.ones(4, np.float32), rtype=RequestType.BYTEPS), "BytePSServer"),
    (lambda: request(WORKER0, [1, 1], None, None, pull=True, head=1), "does not hold row_sparse"),
])
def test_bad_requests_get_an_error_and_everyone_else_keeps_correct_sums(bad, match):
    srv, fake = make()
    srv.handle_request(push(WORKER0, 1, np.zeros(4, np.float32)), fake)
    srv.handle_request(push(WORKER0, 1, np.full(4, 1.0, np.float32)), fake)   # round open
    wrong = bad()
    srv.handle_request(wrong, fake)
    assert fake.answer_to(wrong).error and match in fake.answer_to(wrong).error
    srv.handle_request(push(WORKER1, 1, np.full(4, 2.0, np.float32)), fake)   # round completes
    p = pull(WORKER1, 1)
    srv.handle_request(p, fake)
    assert list(values_of(fake, p)) == [3.0] * 4


def test_a_failing_updater_fails_the_round_not_the_server():
    def broken(key, grad, weight):
        raise RuntimeError("optimizer blew up")
    srv, fake = make(updater=broken)
    srv.handle_request(push(WORKER0, 4, np.ones(2, np.float32)), fake)
    a, b = push(WORKER0, 4, np.ones(2, np.float32)), push(WORKER1, 4, np.ones(2, np.float32))
    srv.handle_request(a, fake)
    srv.handle_request(b, fake)
    assert "optimizer blew up" in fake.answer_to(a).error and fake.answer_to(b).error
    p = pull(WORKER0, 4)
    srv.handle_request(p, fake)
    assert list(values_of(fake, p)) == [1.0, 1.0]


def test_a_refused_optimizer_refuses_the_rounds_instead_of_storing_gradients_as_weights():
    def refuse(body):
        raise ValueError("optimizer class my.CustomSGD is not allowed")
    srv = KVStoreDistServer(2, key_begin=BEGIN, updater_loader=refuse)
    fake = FakeServer()
    srv.handle_command(command(WORKER0, ServerCommand.SYNC_MODE), fake)
    weights = np.full(4, 7.0, np.float32)
    srv.handle_request(push(WORKER0, 1, weights), fake)             # init
    opt = command(WORKER0, ServerCommand.CONTROLLER, b"opt")
    srv.handle_command(opt, fake)
    assert "CustomSGD is not allowed" in fake.answer_to(opt).error
    grads = [push(w, 1, np.ones(4, np.float32)) for w in (WORKER0, WORKER1)]
    for req in grads:
        srv.handle_request(req, fake)
    for req in grads:
        error = fake.answer_to(req).error
        assert "refused the optimizer" in error and "CustomSGD" in error, error
    read = pull(WORKER1, 1)
    srv.handle_request(read, fake)
    assert np.array_equal(np.frombuffer(fake.answer_to(read).vals, np.float32), weights)
    # MXNet's workers ignore the error answers: the server says the job must end
    assert "refused the optimizer sent by worker rank 0" in srv.job_error
    assert "CustomSGD" in srv.job_error


def test_an_optimizer_refused_from_another_rank_than_0_is_only_refused():
    """MXNet sends the optimizer from rank 0 only: a refused one from elsewhere (e.g. a rogue
    worker's malicious pickle) is answered with the error but does not stop the training."""
    def refuse(body):
        raise ValueError("not allowed")
    srv = KVStoreDistServer(2, key_begin=BEGIN, updater_loader=refuse)
    fake = FakeServer()
    srv.handle_command(command(WORKER0, ServerCommand.SYNC_MODE), fake)
    srv.handle_request(push(WORKER0, 1, np.zeros(4, np.float32)), fake)
    opt = command(WORKER1, ServerCommand.CONTROLLER, b"opt")
    srv.handle_command(opt, fake)
    assert "not allowed" in fake.answer_to(opt).error and srv.refused_optimizer is None
    assert srv.job_error is None
    grads = [push(w, 1, np.ones(4, np.float32)) for w in (WORKER0, WORKER1)]
    for req in grads:
        srv.handle_request(req, fake)
    assert all(fake.answer_to(req).error is None for req in grads)


def test_a_push_from_a_node_that_is_no_worker_is_refused_and_not_summed():
    srv, fake = make()
    srv.handle_request(push(WORKER0, 1, np.zeros(4, np.float32)), fake)     # init
    stranger = push(99, 1, np.full(4, 100.0, np.float32))
    srv.handle_request(stranger, fake)
    assert "node 99 is not a worker" in fake.answer_to(stranger).error
    grads = [push(w, 1, np.ones(4, np.float32)) for w in (WORKER0, WORKER1)]
    for req in grads:
        srv.handle_request(req, fake)
    read = pull(WORKER0, 1)
    srv.handle_request(read, fake)
    assert np.array_equal(np.frombuffer(fake.answer_to(read).vals, np.float32), [2, 2, 2, 2])


def test_a_refused_compression_setting_of_worker_rank_0_ends_the_job():
    srv, fake = make()
    bad = command(WORKER0, ServerCommand.SET_GRADIENT_COMPRESSION, b"3bit,0.5")
    srv.handle_command(bad, fake)
    assert fake.answer_to(bad).error and "SET_GRADIENT_COMPRESSION" in srv.job_error


class _GoneWorker(FakeServer):
    """A responder whose every answer to WORKER1 fails as a broken connection does."""

    def respond(self, req, **kwargs):
        if req.sender == WORKER1:
            raise PeerError("sending to worker %d failed: [Errno 104] Connection reset by peer"
                            % WORKER1)
        return super().respond(req, **kwargs)


def test_answers_to_a_gone_worker_are_logged_once_and_the_server_goes_on(caplog):
    """A worker that died mid-round has many answers coming: the first failure is logged
    (without a traceback: a broken link is no bug of the server), later ones only counted,
    and the other workers are still answered."""
    srv, _ = make()
    gone = _GoneWorker()
    for key in range(20):
        srv.handle_request(push(WORKER0, key, np.zeros(4, np.float32)), gone)  # init
        for worker in (WORKER0, WORKER1):                                      # a round
            srv.handle_request(push(worker, key, np.ones(4, np.float32)), gone)
    failed = [r for r in caplog.records if "could not answer node %d" % WORKER1 in r.getMessage()]
    assert len(failed) == 1, [r.getMessage() for r in caplog.records]
    assert not failed[0].exc_info and "Connection reset" in failed[0].getMessage()
    assert srv._peer_log.count(("answer", WORKER1)) == 20
    p = pull(WORKER0, 3)
    srv.handle_request(p, gone)
    assert values_of(gone, p).tolist() == [2.0] * 4
