"""The kvstore-byteps parameter server: ``python -m kvstore_byteps.server``.

Runs :class:`BytePSServer` (MXNet's server semantics for unmodified ``dist_sync`` /
``dist_async`` workers, plus the BytePS data path for ``dist_byteps`` workers) on the KV layer
of :mod:`kvstore_byteps.van`: joins the cluster described by the usual ``DMLC_*`` variables,
serves until a worker sends kStopServer, then finalizes (Barrier(7), like MXNet's server) and
exits 0. ``run_server(config)`` is the same without the process around it; the
``MXNET_KVSTORE_SERVER=byteps`` hook of ``mxnet_patch`` calls it.

This module is the thin transport adapter; the logic lives in :mod:`kvstore_byteps.serving`,
split by job, all pure or testable without sockets (``protocol``, ``compression``,
``unpickle``, ``updater``, ``store``, ``dist``, ``rounds``, ``summing``, ``batch``, ``byteps``).
"""
import logging
import sys
import time
from typing import Optional

from .config import Config, Role
from .errors import PeerError, ConfigError, JobAbortedError, KVStoreBytePSError, exit_status
from .serving.byteps import BytePSServer
from .serving.dist import KVStoreDistServer
from .words import count

__all__ = ["KVStoreDistServer", "BytePSServer", "run_server", "main"]

log = logging.getLogger(__name__)

#: the serving loop waits in slices so that signals (Ctrl-C) are handled promptly
_POLL_SECONDS = 1.0
#: how long a server that ends the job waits for the scheduler's notice to come back
_END_JOB_WAIT_S = 5.0


def run_server(config: Config) -> int:
    """Join the cluster as a server, serve until kStopServer, finalize; return 0."""
    if config.role is not Role.SERVER:
        raise ConfigError("run_server needs DMLC_ROLE=server, got %s" % config.role.name.lower())
    from .van.kv import KVServer            # the transport is imported only to run for real
    from .van.wire.message import ALL_GROUP
    from .van.runtime.postoffice import Postoffice
    _prepare_process(config)
    postoffice = Postoffice(config)

    def expect_pushes(ps_key: int, nbytes: int) -> None:    # kv_server is made before any push
        kv_server.expect_requests(ps_key, nbytes)

    server = BytePSServer.from_config(config, config.num_workers, expect_pushes)
    try:
        # registered before start, as upstream does, so no early request finds no handler
        profiler = server.profiler          # requests and commands as profile stages
        kv_server = KVServer(postoffice, app_id=0,
                             request_handler=profiler.timed("request", server.handle_request,
                                                            _describe_request),
                             command_handler=profiler.timed("command", server.handle_command,
                                                            _describe_command),
                             quick_request=server.handles_quickly)

        def restarted(node, epoch):     # this server took over a dead one's id
            if node.id == postoffice.my_id:
                server.key_begin = postoffice.server_key_ranges()[postoffice.my_rank].begin
                server.begin_recovery(epoch, time.monotonic() + config.start_timeout)
        postoffice.roster.recovery.add(restarted)
        postoffice.roster.departure.add(lambda node: server.depart(node.id))
        postoffice.start()
        # requests come only after the start-up barrier, which needs this server: safe to set
        server.key_begin = postoffice.server_key_ranges()[postoffice.my_rank].begin
        profiler.rank = postoffice.my_rank
        if postoffice.recovery_epoch:   # the others passed the start-up barrier long ago
            log.warning("server rank %d restarted in place of a dead one: waiting for the "
                        "workers' recovery reports", postoffice.my_rank)
        else:
            postoffice.barrier(ALL_GROUP)
        log.info("server rank %d serving %s", postoffice.my_rank,
                 count(config.num_workers, "worker"))
        _serve(postoffice, server)
    except BaseException:
        server.close()
        postoffice.stop()
        raise
    server.close()
    postoffice.finalize()
    return 0


def _prepare_process(config: Config) -> None:
    """What the process does before it joins: keep freed memory, import MXNet if needed."""
    if config.keep_freed_memory:
        from .memory import keep_freed_memory
        keep_freed_memory()
    if config.backup_workers:
        # the servers will run the workers' optimizer: import MXNet now, while the cluster
        # forms, not in the first round (2-3 s on 2 cores, in every worker's first step)
        from .serving.unpickle import import_mxnet
        import_mxnet()


def _serve(postoffice, server: BytePSServer) -> None:
    """Serve until kStopServer; PeerError when the van or a recovery fails first, and the job
    ended (JobAbortedError) when a node or this server's job error ends it."""
    while not server.wait_done(_POLL_SECONDS):
        if postoffice.stopped:     # the van died (its error was logged): stop serving
            if isinstance(postoffice.error, JobAbortedError):   # a node ended the job
                raise postoffice.error.again()
            raise PeerError("server rank %d: the van stopped before kStopServer: %s"
                            % (postoffice.my_rank, postoffice.error))
        if server.recovery.error is not None:
            raise PeerError("server rank %d: %s" % (postoffice.my_rank,
                                                    server.recovery.error))
        if server.recovery.overdue(time.monotonic()):
            raise PeerError("server rank %d: %s" % (postoffice.my_rank,
                                                    server.recovery.describe_wait()))
    if server.job_error is not None:     # even if kStopServer came right after
        _end_job(postoffice, server.job_error)


def _describe_request(req, server) -> tuple:
    """A request as the server profile names it: push, pull or pushpull, with its keys."""
    meta = req.meta
    kind = "pushpull" if meta.push and meta.pull else ("push" if meta.push else "pull")
    keys = [int(k) for k in req.keys[:4]]
    return kind, {"keys": keys, "sender": req.sender, "bytes": req.vals.nbytes,
                  "cmd": meta.head}


def _describe_command(req, server) -> tuple:
    return "command %d" % req.meta.head, {"sender": req.sender}


def _end_job(postoffice, reason: str) -> None:
    """Have the scheduler end the job on every node; JobAbortedError once its notice stopped
    this node too, or after _END_JOB_WAIT_S (an upstream scheduler ignores the request: the
    job then ends as this server exits, under the launcher)."""
    postoffice.end_job(reason)
    postoffice.wait_stopped(_END_JOB_WAIT_S)
    raise postoffice.error if isinstance(postoffice.error, JobAbortedError) else \
        JobAbortedError("server rank %d ended the job: %s" % (postoffice.my_rank, reason))


def main(argv: Optional[list] = None) -> int:
    """Command-line entry point; the only place here that turns errors into an exit code."""
    from .node_cli import node_config
    config = node_config("python -m kvstore_byteps.server", "Run a kvstore-byteps parameter "
                         "server (serves dist_byteps, dist_sync and dist_async workers).", argv,
                         Role.SERVER)
    try:
        return run_server(config)
    except KVStoreBytePSError as exc:
        log.error("server failed: %s", exc)
        return exit_status(exc)


if __name__ == "__main__":
    sys.exit(main())
