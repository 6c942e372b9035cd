"""A pull's answer that cannot be handled fails its items (engine/routes.py): whatever goes
wrong while the sums are copied out, the PULL stage hears it; nothing is left pending."""
from types import SimpleNamespace

import numpy as np

from kvstore_byteps.engine.routes import PlainRoute


class Unsliceable:
    """An output whose bytes cannot be reached (a bug's stand-in)."""

    def __getitem__(self, _):
        raise TypeError("not an array")


def items(outputs):
    layout = SimpleNamespace(round_cmd=0, name="key 3")
    task = SimpleNamespace(context=SimpleNamespace(layout=layout, outputs=outputs), step=0)
    return [SimpleNamespace(task=task, key=3, index=i, priority=0,
                            partition=SimpleNamespace(ps_key=10 + i, offset=4 * i, nbytes=4))
            for i in range(2)]


class Keeper:
    """The recovery keeper's stand-in (no recovery)."""

    def answered(self, group):
        pass


class KV:
    def pull(self, keys, cmd, priority, callback, into):
        self.answer = callback


def answered(route, kv, group):
    got = []
    route.pull(group, lambda error, done_items: got.append((error, done_items)))
    kv.answer(SimpleNamespace(error=None, landed=False, result=SimpleNamespace(
        vals=np.arange(2, dtype=np.float32).view(np.uint8), lens=np.array([4, 4]))))
    return got


def test_the_sums_are_copied_into_the_outputs():
    kv, out = KV(), np.zeros(8, np.uint8)
    got = answered(PlainRoute(kv, SimpleNamespace(enabled=False), Keeper()), kv, items([out]))
    assert got[0][0] is None and out.view(np.float32).tolist() == [0.0, 1.0]


def test_an_unexpected_failure_fails_the_items_instead_of_leaving_them_pending(caplog):
    kv = KV()
    got = answered(PlainRoute(kv, SimpleNamespace(enabled=False), Keeper()), kv,
                   items([Unsliceable()]))
    assert len(got) == 1 and isinstance(got[0][0], TypeError)
    assert "handling a pull's answer failed" in caplog.text
