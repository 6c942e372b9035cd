"""Fault injection for cluster tests: put this directory first on PYTHONPATH and set
``KVSTORE_TEST_DROP_ACKS=<percent>``; every node of ours started with it then loses that share
of the PS_RESEND ACKs it receives (PS_DROP_MSG only loses data messages). Inert otherwise."""
import os

_PERCENT = float(os.environ.get("KVSTORE_TEST_DROP_ACKS", "0") or 0)

if _PERCENT > 0:
    import random

    from kvstore_byteps.van.runtime import postoffice as _postoffice
    from kvstore_byteps.van.wire.message import ControlCommand

    _deliver = _postoffice.Postoffice._on_message
    _rng = random.Random()

    def _lossy(self, message):
        if message.meta.control.cmd == ControlCommand.ACK and _rng.random() * 100 < _PERCENT:
            return True
        return _deliver(self, message)

    _postoffice.Postoffice._on_message = _lossy
