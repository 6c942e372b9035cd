"""A pull riding along with its push, as the server unpacks it (serving/riding.py)."""
import dataclasses

import numpy as np

from kvstore_byteps.serving.riding import attached_pull
from kvstore_byteps.van.kv import KVPairs, KVRequest
from kvstore_byteps.van.wire.message import Control, ControlCommand, Meta


def test_the_riding_pull_is_the_push_meta_turned_into_a_pull_field_for_field():
    # every field of Meta set to a value of its own, so a field the unpacking forgot shows
    fields = dict(head=6, app_id=1, customer_id=2, timestamp=40, sender=9, recver=8,
                  request=True, push=True, pull=False, simple_app=True, body=b"b",
                  data_type=[8, 11, 3], priority=-5,
                  control=Control(ControlCommand.EMPTY, barrier_group=3),
                  extra={"pull_timestamp": 41})
    assert set(fields) == {f.name for f in dataclasses.fields(Meta)}, "set every field here"
    push_meta = Meta(**fields)
    keys = np.array([7], np.uint64)
    pull = attached_pull(KVRequest(push_meta, KVPairs(keys, memoryview(b"abcd"), None)))
    assert pull.meta == dataclasses.replace(push_meta, timestamp=41, push=False, pull=True,
                                            data_type=[], extra=None)
    assert pull.keys is keys and pull.vals.nbytes == 0 and pull.lens is None


def test_a_push_without_a_riding_pull_has_none():
    req = KVRequest(Meta(head=6, push=True), KVPairs(np.array([7], np.uint64),
                                                    memoryview(b""), None))
    assert attached_pull(req) is None
