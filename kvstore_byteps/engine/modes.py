"""What a worker's engine does that depends on the training mode (``config.TrainingMode``)
beyond what the mode says of itself: backup workers tell the servers when this worker pushes
nothing for a while; whether a round's pull rides with its push, whether keys are fused into
gradient buckets, why a restarted server could not be restored, and when synchronous training
may hand the servers the optimizer. Pure: ``command`` sends through the caller's KV worker."""
from typing import Callable, Optional

from ..config import Config, TrainingMode
from ..errors import KVStoreBytePSError
from ..mxproto import Presence, ServerCommand
from .layout import ServerDialect

__all__ = ["tell_presence", "pulls_ride", "fuses", "unrecoverable", "SERVERS_UPDATE",
           "check_servers_update", "servers_update_refusal"]

#: why a restarted server cannot be restored once the servers run the optimizer, and why
#: gradient buckets are off then (each key is updated with its own optimizer index)
SERVERS_UPDATE = ("the servers keep the weights and run the optimizer (set_optimizer: "
                  "update_on_kvstore), so a restarted server lost them; to make servers "
                  "restorable, update on the workers (update_on_kvstore=False or "
                  "MXNET_UPDATE_ON_KVSTORE=0) with BYTEPS_SERVER_RECOVERY=1")
_INSTEAD = ("call set_optimizer before the first push (gluon.Trainer and Module.fit do), or "
            "update on the workers (update_on_kvstore=False or MXNET_UPDATE_ON_KVSTORE=0)")


def tell_presence(mode: TrainingMode, command: Callable, presence: Presence) -> None:
    """Backup workers: tell the servers that this worker pushes nothing for now (it waits in a
    barrier), has finished training, or is back; ``command(head, body, what)`` sends and
    waits. Nothing in the other modes."""
    if mode.backup_workers:
        command(ServerCommand.BYTEPS_ABSENT, presence.value,
                "telling the servers this worker is %s" % presence.name.lower())


def pulls_ride(config: Config, dialect: ServerDialect) -> bool:
    """Our servers take a round's pull along with its push (one message less per partition
    and round). Not with async rounds (a pull is answered at once there), nor with kept
    rounds (a restarted server is sent the pushes again, and would not know the pulls)."""
    return (config.pull_with_push and dialect.extensions_missing is None
            and not config.training_mode.asynchronous and not config.server_recovery)


def fuses(mode: TrainingMode, dialect: ServerDialect) -> bool:
    """Gradient buckets where the servers sum rounds the workers apply: our servers,
    synchronous training."""
    return dialect.extensions_missing is None and mode.summed


def unrecoverable(config: Config, dialect: ServerDialect) -> Optional[str]:
    """Why a restarted server could not be restored from this worker's pushes (None: it
    can, the worker keeps its last pushes)."""
    reason = dialect.unrecoverable or config.training_mode.unrecoverable
    if reason is None and not config.server_recovery:
        reason = ("this worker did not keep its last pushes: set BYTEPS_SERVER_RECOVERY=1 "
                  "on every worker to make a restarted server restorable")
    return reason


def check_servers_update(rounds_begun: bool, buckets: int) -> None:
    """Raise KVStoreBytePSError where synchronous training cannot hand the servers the
    optimizer now (:func:`servers_update_refusal` says why)."""
    refusal = servers_update_refusal(rounds_begun, buckets)
    if refusal:
        raise KVStoreBytePSError(refusal)


def servers_update_refusal(rounds_begun: bool, buckets: int) -> Optional[str]:
    """Why synchronous training cannot hand the servers the optimizer now (None: it can):
    after the first round (the servers' rounds were sums; the workers' weights may already
    differ from the servers'), with ``buckets`` gradient buckets formed (each key needs its
    own optimizer index)."""
    if buckets:
        return ("set_optimizer after gradient buckets were formed (%d): the servers update "
                "each key with its own optimizer index; %s" % (buckets, _INSTEAD))
    if rounds_begun:
        return ("set_optimizer after the first push: the servers' rounds so far were sums "
                "that the workers applied; %s" % _INSTEAD)
    return None
