"""Partition size from the measured link (engine/sizing.py): the rule, the measurement, the
layout rank 0 leaves with the servers. Pure: a fake link and clock."""
import pytest

from kvstore_byteps.config import Config, VanType
from kvstore_byteps.engine import sizing
from kvstore_byteps.engine.sparse import ROW_RANGE_BYTES
from kvstore_byteps.errors import KVStoreBytePSError


@pytest.mark.parametrize("rate, expected", [
    (60e6, 768000),            # 500 Mbit/s
    (52e6, 768000),            # ... measured a little low on a busy machine
    (125e6, 1536000),          # 1 Gbit/s
    (10e6, 384000),            # slow links: never below the per-message floor
    (250e6, 4096000),          # 2 Gbit/s and faster, loopback: BytePS's default
    (3e9, 4096000),
])
def test_a_partition_takes_about_the_wire_time(rate, expected):
    assert sizing.partition_bytes_for(rate) == expected


def test_the_largest_partition_is_the_configured_default():
    assert max(sizing.SIZES) == Config().partition_bytes == 4096000


class FakeLink:
    """Every send takes a fixed round trip plus its bytes to all servers at ``rate``."""

    def __init__(self, rate, servers, round_trip):
        self.rate, self.servers, self.round_trip = rate, servers, round_trip
        self.now, self.sizes = 0.0, []

    def send(self, body):
        self.sizes.append(len(body))
        self.now += self.round_trip + len(body) * self.servers / self.rate

    def clock(self):
        return self.now


def test_the_round_trip_is_taken_out_of_the_measured_rate():
    link = FakeLink(rate=60e6, servers=4, round_trip=0.005)
    assert sizing.measure_rate(link.send, 4, clock=link.clock) == pytest.approx(60e6)
    assert link.sizes == [sizing.SMALL_BODY, sizing.LARGE_BODY] * sizing.TRIES


def test_a_difference_lost_in_the_noise_gives_at_most_ten_times_the_plain_rate():
    times = iter([0.002, 0.001] * sizing.TRIES)     # the large body came back first
    now = [0.0]

    def send(body):
        now[0] += next(times)
    rate = sizing.measure_rate(send, 2, clock=lambda: now[0])
    assert rate == pytest.approx((sizing.LARGE_BODY - sizing.SMALL_BODY) * 2 / 0.0001)


def test_the_best_try_counts():
    link = FakeLink(rate=60e6, servers=2, round_trip=0.001)
    slow_once = iter([0.05])               # the first large body met other traffic

    def send(body):
        link.send(body)
        if len(body) == sizing.LARGE_BODY:
            link.now += next(slow_once, 0.0)
    assert sizing.measure_rate(send, 2, clock=link.clock) == pytest.approx(60e6)


def test_a_small_body_held_up_once_does_not_inflate_the_rate():
    link = FakeLink(rate=60e6, servers=2, round_trip=0.001)
    held_once = iter([0.01])              # the first small body waited for a busy core

    def send(body):
        link.send(body)
        if len(body) == sizing.SMALL_BODY:
            link.now += next(held_once, 0.0)
    assert sizing.measure_rate(send, 2, clock=link.clock) == pytest.approx(60e6)


def test_row_sparse_ranges_are_cut_where_the_link_shrinks_partitions():
    assert sizing.row_range_bytes_for(768000) == ROW_RANGE_BYTES
    assert sizing.row_range_bytes_for(1536000) == ROW_RANGE_BYTES
    assert sizing.row_range_bytes_for(Config.partition_bytes) == 0      # a range a server
    body = sizing.encode_layout(768000, 60e6, 8192, row_range_bytes=ROW_RANGE_BYTES)
    assert sizing.decode_layout(body)["row_range_bytes"] == ROW_RANGE_BYTES


def test_layout_round_trip_and_bad_answers():
    body = sizing.encode_layout(765952, 60e6)
    assert sizing.decode_layout(body) == {"partition_bytes": 765952, "rate": 60e6}
    for bad in (b"", b"{}", b'{"partition_bytes": 0}', b"\xff", b'{"partition_bytes": "x"}'):
        with pytest.raises(KVStoreBytePSError, match="layout of rank 0"):
            sizing.decode_layout(bad)


class FakeCluster:
    """The commands and the barrier a worker's sizing goes through, recorded."""

    def __init__(self, servers=2, held=None):
        self.servers, self.held, self.sent, self.barriers = servers, held, [], 0
        self.tests = []

    def link_test(self, body):
        self.tests.append(len(body))

    def command(self, head, body, what):
        from kvstore_byteps.mxproto import ServerCommand
        self.sent.append((ServerCommand(head).name, len(body)))
        if head == ServerCommand.BYTEPS_LAYOUT and body:
            self.held = body
        answer = self.held if head == ServerCommand.BYTEPS_LAYOUT and not body else b""
        return type("Answer", (), {"bodies": {8 + 2 * s: answer for s in range(self.servers)}})

    def barrier(self, group, timeout):
        self.barriers += 1


def _engine(rank, cluster, joined=False):
    """A worker's cluster life (engine/cluster.py) over the fake cluster (``joined``: a late
    worker of an elastic job)."""
    from kvstore_byteps.engine.cluster import Cluster
    engine = Cluster(Config(num_servers=cluster.servers, van_type=VanType.ZMQ,  # no socket
                            size_partitions_by_link=True),
                     type("Postoffice", (), {"num_servers": cluster.servers, "joined": joined,
                                             "barrier": cluster.barrier})(), str)
    engine.rank, engine.command, engine.link_test = rank, cluster.command, cluster.link_test
    return engine


def test_rank_0_measures_and_leaves_the_size_the_others_read_it_after_the_barrier():
    cluster = FakeCluster()
    leader = _engine(0, cluster)
    chosen = leader.agree_on_layout()["partition_bytes"]
    assert chosen in sizing.SIZES and leader.link_rate > 0
    assert cluster.tests == [sizing.SMALL_BODY, sizing.LARGE_BODY] * sizing.TRIES
    assert cluster.sent == [("BYTEPS_LAYOUT", len(sizing.encode_layout(
        chosen, leader.link_rate, leader.config.fusion_bytes,
        sizing.row_range_bytes_for(chosen))))]
    assert cluster.barriers == 1
    cluster.held = sizing.encode_layout(765952, 60e6)    # whatever rank 0 chose, the others
    other = _engine(1, cluster)                          # take it: no test of their own
    assert other.agree_on_layout()["partition_bytes"] == 765952 and other.link_rate == 60e6
    assert cluster.sent[-1] == ("BYTEPS_LAYOUT", 0) and cluster.barriers == 2
    assert len(cluster.tests) == 2 * sizing.TRIES      # rank 0's only
    # a worker that took a departed one's place (elastic) reads it: no barrier, no test
    late = _engine(0, cluster, joined=True)
    assert late.agree_on_layout()["partition_bytes"] == 765952
    assert cluster.barriers == 2 and len(cluster.tests) == 2 * sizing.TRIES


def test_servers_holding_different_layouts_are_an_error():
    cluster = FakeCluster()
    other = _engine(1, cluster)
    bodies = {8: sizing.encode_layout(765952, 60e6), 10: sizing.encode_layout(4096000, 1e9)}
    other.command = lambda head, body, what: type("Answer", (), {"bodies": bodies})
    with pytest.raises(KVStoreBytePSError, match="different partition layouts"):
        other.agree_on_layout()


def test_a_worker_that_fuses_otherwise_than_rank_0_ends_the_job_at_start_saying_so():
    from kvstore_byteps.errors import ConfigError
    cluster = FakeCluster()
    cluster.held = sizing.encode_layout(765952, 60e6, fusion_bytes=2048)
    other = _engine(1, cluster)
    ended = []
    other.po.end_job = ended.append
    with pytest.raises(ConfigError, match="worker rank 1 has BYTEPS_FUSION_BYTES=4096000, "
                                          "rank 0 2048"):
        other.agree_on_layout()
    assert ended and "set the same BYTEPS_FUSION_BYTES on every worker" in ended[0]
    cluster.held = sizing.encode_layout(765952, 60e6, fusion_bytes=4096000)    # the same
    assert _engine(1, cluster).agree_on_layout()["fusion_bytes"] == 4096000
