"""The command line of ``python -m kvstore_byteps.server`` and ``python -m kvstore_byteps.scheduler``.

It only answers ``--help`` (and rejects anything else): like MXNet's own nodes, these take their
whole configuration from the ``DMLC_*`` / ``PS_*`` / ``BYTEPS_*`` environment.
"""
import argparse
import dataclasses
import sys
from typing import Optional, Sequence

from .config import Config, Role
from .errors import KVStoreBytePSError
from .logs import setup_logging

_EPILOG = """\
configuration comes from the environment, as for MXNet's own nodes:
  DMLC_PS_ROOT_URI, DMLC_PS_ROOT_PORT   the scheduler's address and port (the port is required)
  DMLC_NUM_WORKER, DMLC_NUM_SERVER      how many workers and servers the cluster has
  DMLC_PS_VAN_TYPE                      unset: ZeroMQ with MXNet's nodes, byteps_tcp between
                                        ours; zmq, p3, byteps_tcp, byteps_rdma
  PS_HEARTBEAT_INTERVAL, PS_HEARTBEAT_TIMEOUT, BYTEPS_*: see the README's Configuration table

usually the launcher starts every node: kvstore-byteps-launch -n 2 -s 2 python train.py"""


def parse_node_args(prog: str, summary: str, argv: Optional[Sequence[str]]) -> None:
    """``--help`` prints the usage and exits 0; any other argument exits 2 saying so."""
    parser = argparse.ArgumentParser(prog=prog, description=summary, epilog=_EPILOG,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.parse_args(argv)


def node_config(prog: str, summary: str, argv: Optional[Sequence[str]], role: Role) -> Config:
    """The start of both entry points: the command line (:func:`parse_node_args`), the
    configuration for ``role`` (running the module means being that role, whatever DMLC_ROLE
    says) and logging. A bad variable exits 2 with the error, as a bad argument does."""
    parse_node_args(prog, summary, argv)
    try:
        config = Config.from_env()
    except KVStoreBytePSError as exc:
        print("%s: %s" % (prog, exc), file=sys.stderr)
        raise SystemExit(2) from None
    if config.role is not role:
        config = dataclasses.replace(config, role=role)
    setup_logging(config, "[%s]" % role.name.lower())
    return config
