"""Counted nouns in messages: one worker, two workers."""
from kvstore_byteps.engine.layout import BytePSDialect, MXNetDialect
from kvstore_byteps.words import count


def test_a_noun_is_plural_unless_there_is_one():
    assert [count(n, "worker") for n in (0, 1, 2)] == ["0 workers", "1 worker", "2 workers"]
    assert count(1, "backup worker") == "1 backup worker"
    assert count(3, "process", "processes") == "3 processes"


def test_rank_0_names_one_server_in_the_singular():
    assert count(1, BytePSDialect.noun) == "1 BytePS server"
    assert count(2, MXNetDialect.noun) == "2 MXNet's own servers"
