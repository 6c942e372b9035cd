"""The scheduler node: ``python -m kvstore_byteps.scheduler`` (reads the DMLC_* environment).

It assigns node ids, runs barriers and heartbeats, and exits after the shutdown barrier, exactly
as MXNet's scheduler does, so upstream servers and workers can join it.
"""
import logging
import sys
from typing import Optional

from .config import Config, Role
from .errors import KVStoreBytePSError, exit_status
from .van.wire.message import ALL_GROUP
from .van.runtime.postoffice import Postoffice

log = logging.getLogger(__name__)


def run_scheduler(config: Config) -> int:
    """Run a scheduler until every node has finalized; return a process exit code."""
    if config.role is not Role.SCHEDULER:
        raise KVStoreBytePSError("run_scheduler needs DMLC_ROLE=scheduler, not %s"
                                 % config.role.name.lower())
    postoffice = None
    try:
        postoffice = Postoffice(config)        # its van may refuse the config (no device)
        postoffice.start()
        postoffice.barrier(ALL_GROUP)          # start-up barrier (MXNet: RunServer)
        postoffice.finalize()                  # shutdown barrier: waits for every node
    except KVStoreBytePSError as exc:
        log.error("scheduler failed: %s", exc)
        if postoffice is not None:
            postoffice.stop()
        return exit_status(exc)
    return 0


def main(argv: Optional[list] = None) -> int:
    from .node_cli import node_config
    config = node_config("python -m kvstore_byteps.scheduler", "Run a kvstore-byteps scheduler "
                         "(MXNet's and our servers and workers can join it).", argv,
                         Role.SCHEDULER)
    return run_scheduler(config)


if __name__ == "__main__":
    sys.exit(main())
