"""The postoffice: one per process; joins the cluster and routes messages (ps-lite's Postoffice).

It owns the van, runs the membership state machine on the van's receive thread, executes the
machine's actions, and hands data messages to customers (the KV apps; customer.py), each of
which runs its handler on its own thread so a slow handler never stalls the receive loop.

Thread-safety: ``start``, ``barrier`` and ``finalize`` are for the owning thread (the receive
loop does their work: start runs the membership there, a barrier is posted to it through the
node's connection to itself, finalize ends it with a TERMINATE to itself); ``send`` and
``register_handler`` are thread-safe.
"""
import logging
import random
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

from ...config import Config, Role
from ...errors import (ConfigError, DeadlineError, JobAbortedError, KVStoreBytePSError, PeerError,
                       ProtocolError)
from ...logs import PeerLog
from .customer import HandlerThread, InlineHandler, MixedHandler
from .membership import (Connect, Fail, NodeDead, NodeRecovered, Ready, Refused, ReleaseBarrier,
                         Send, Stop, abort_request, barrier_post, group_members,
                         terminate_message)
from .node_membership import NodeMembership
from .scheduler_membership import SchedulerMembership
from ..registry import make_van
from ..wire.message import (ALL_GROUP, K_EMPTY, SCHEDULER_ID, Message, Node, id_to_rank)
from ..wire.keys import KeyRange, server_key_ranges
from ...ports import free_port
from .netif import choose_host
from .resend import Resender

log = logging.getLogger(__name__)

_TICK_SECONDS = 0.05
#: a scheduler that cannot form the cluster: how long it tries to reach the other nodes (a
#: connect already under way still runs to its end), and then waits for its notices to leave
_ABORT_NOTICE_S = 5.0
_ABORT_LINGER_S = 0.5
#: ticks come at most this often (the van may call more often)
_TICK_STEP_SECONDS = 0.01
_STOP_SECONDS = 10.0
_TERMINATE_SECONDS = 1.0
#: how much longer start() waits for the receive thread's verdict after the start deadline
_VERDICT_WAIT_S = 10.0
_PROGRESS_LOG_SECONDS = 30.0
#: data messages kept while the node is not ready yet (a restarted server hears from workers
#: that learnt of it before its own ADD_NODE answer arrived); more are dropped
_EARLY_DATA_LIMIT = 10000


class Postoffice:
    """Cluster membership, barriers and message routing for one node."""

    def __init__(self, config: Config, van=None):
        self.config = config
        self.van = van if van is not None else make_van(config)
        self.my_node: Optional[Node] = None
        self.nodes: List[Node] = []
        self.membership = None
        self._customers: Dict[Tuple[int, int], Any] = {}   # customer.py's
        self._early: Dict[Tuple[int, int], List[Message]] = {}
        self._lock = threading.Lock()
        self._ready = threading.Event()
        self._stopped = threading.Event()
        self._barrier_cond = threading.Condition()
        self._barrier_released = 0
        self._error: Optional[BaseException] = None
        self._ended_job = False     # this node asked the scheduler to end the job
        #: while start() waits: a failure then is start()'s to raise (and its caller's to
        #: report), not the receive loop's to log as well (the user read it twice)
        self._starting = False
        self._start_lock = threading.Lock()
        self._thread: Optional[threading.Thread] = None
        self._finalized = False
        self._resender: Optional[Resender] = None     # PS_RESEND, once ready
        self._member_ids: frozenset = frozenset()   # looked up per request: a set
        self._failure_hooks: List[Callable[[BaseException], None]] = []
        self._tick_hooks: List[Callable[[float], None]] = []
        self._next_tick = 0.0
        self._recovery_hooks: List[Callable[[Node, int], None]] = []
        self._before_ready: List[Message] = []
        #: > 0: this node is a restarted server, the epoch-th one to take over its id
        self.recovery_epoch = 0
        self._peer_log = PeerLog(log)
        #: data messages dropped on purpose (PS_DROP_MSG)
        self.dropped_messages = 0
        self._loss_reported = False     # PS_DROP_MSG / PS_RESEND counts, logged at stop
        self._drop_rng = random.Random() if config.drop_msg_percent else None
        self._resend_lock = threading.Lock()

    # ------------------------------------------------------------------ properties
    @property
    def role(self) -> Role:
        return self.config.role

    @property
    def num_workers(self) -> int:
        return self.config.num_workers

    @property
    def num_servers(self) -> int:
        return self.config.num_servers

    @property
    def transport(self) -> str:
        """How this node reaches its peers, as a start-up line names it (after ``start``)."""
        return self.van.describe()

    @property
    def my_id(self) -> int:
        return self.my_node.id if self.my_node else K_EMPTY

    @property
    def my_rank(self) -> int:
        return id_to_rank(self.my_id)

    @property
    def stopped(self) -> bool:
        """Whether the receive loop ended (TERMINATE, or a fatal error: see ``error``)."""
        return self._stopped.is_set()

    def wait_stopped(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for the receive loop to end; whether it did (after
        :meth:`end_job`, the scheduler's notice ends it)."""
        return self._stopped.wait(timeout)

    @property
    def error(self) -> Optional[BaseException]:
        return self._error

    def server_key_ranges(self) -> Tuple[KeyRange, ...]:
        return server_key_ranges(self.num_servers)

    def group_ids(self, group: int) -> List[int]:
        return group_members(group, self.num_workers, self.num_servers)

    # ------------------------------------------------------------------ start
    def start(self) -> None:
        """Bind, register with the scheduler and block until the cluster is formed.

        Raises ClusterStartError (naming the scheduler address or the missing nodes) when the
        cluster does not form within ``BYTEPS_START_TIMEOUT`` seconds.
        """
        cfg = self.config
        deadline = time.monotonic() + cfg.start_timeout
        scheduler = Node(Role.SCHEDULER, SCHEDULER_ID, cfg.root_uri, cfg.root_port)
        if cfg.is_scheduler:
            if not cfg.root_port:
                raise ConfigError("DMLC_PS_ROOT_PORT must be set for the scheduler")
            self.van.bind(scheduler, max_retry=0)
            scheduler = self.my_node = self.van.advertise(scheduler)
            self.membership = SchedulerMembership(scheduler, cfg.num_workers, cfg.num_servers,
                                                  deadline,
                                                  heartbeat_timeout=cfg.heartbeat_timeout)
        else:
            if not cfg.root_port:
                raise ConfigError("DMLC_PS_ROOT_PORT must be set (the scheduler's port)")
            host = choose_host(cfg.node_host, cfg.interface)
            hint = cfg.worker_id if cfg.role is Role.WORKER else None
            me = Node(cfg.role, K_EMPTY, host, cfg.port or free_port(""), rank_hint=hint)
            if cfg.port:     # asked for by the user: another port would surprise them
                try:
                    me.port = self.van.bind(me, max_retry=0)
                except ConfigError as exc:
                    raise ConfigError("PORT=%d: %s (unset PORT to let the node pick a free one)"
                                      % (cfg.port, exc)) from None
            else:            # our pick may have been taken meanwhile: retry with others
                me.port = self.van.bind(me, max_retry=40)
            me = self.my_node = self.van.advertise(me)
            self.membership = NodeMembership(me, scheduler, deadline, cfg.heartbeat_interval,
                                             heartbeat_timeout=cfg.heartbeat_timeout)
        self._thread = threading.Thread(target=self._receive_loop, daemon=True,
                                        name="van-receive")
        self._starting = True
        self._thread.start()      # it starts the membership: one thread owns that state
        self._ready.wait(max(0.0, deadline - time.monotonic()) + 1.0)
        if not self._ready.is_set():
            # the receive thread gives the verdict (its tick fails the start naming the nodes
            # that did not come); a thread busy at the deadline may give it a little late:
            # wait for it rather than say less (a CI run of test_auth_cluster[zmq] did)
            self._ready.wait(_VERDICT_WAIT_S)
        with self._start_lock:
            self._starting = False
            error = self._error
        if error is not None:
            raise error
        if not self._ready.is_set():
            raise DeadlineError("cluster start-up did not finish")
        log.info("%s is ready", self.my_node.describe())

    # ------------------------------------------------------------------ receive side
    def _receive_loop(self) -> None:
        try:
            self._execute(self.membership.start(time.monotonic()))
            self.van.run(self._on_message, self._on_tick, _TICK_SECONDS)
        except BaseException as exc:  # reaches start()/barrier() callers
            if exc is not self._error:    # (a dead node was logged when it was declared)
                self._record_failure(exc, "%s" % exc)
        finally:
            self._stopped.set()
            if self._error is not None:
                for hook in list(self._failure_hooks):
                    try:
                        hook(self._error)
                    except Exception:
                        log.exception("a failure hook failed")
            self._ready.set()
            with self._barrier_cond:
                self._barrier_cond.notify_all()
            self.van.close()

    def _on_tick(self) -> None:
        now = time.monotonic()
        # The van calls this after every wake-up, hundreds of times a second while data flows
        # (370 times a replayed ResNet-50 step on a worker); the timers it keeps (start-up and
        # request deadlines, heartbeats, resends) need no finer step than this.
        if now < self._next_tick:
            return
        self._next_tick = now + _TICK_STEP_SECONDS
        if not self._execute(self.membership.tick(now)):
            raise self._error or PeerError("the membership stopped this node")
        for hook in self._tick_hooks:
            try:
                hook(now)
            except Exception:   # a hook's bug must not stop the node
                log.exception("a tick hook failed")
        if self._resender is not None:
            with self._resend_lock:       # sent in the order the resender recorded them
                for message in self._resender.due(now):
                    self._send_resend_traffic(message, "resend")

    def _send_resend_traffic(self, message: Message, what: str) -> None:
        """Send an ACK or a resend (PS_RESEND's own traffic). Once this node is leaving (its
        shutdown barrier began), a peer that already left is not an error: a resend's ACK, or
        a resent answer's sender, may be gone, and nobody waits for either any more."""
        try:
            self.van.send(message)
        except (PeerError, ProtocolError):
            if not self._resender.leaving:
                raise               # a peer gone mid-job: the node stops, naming it
            log.debug("%s to node %s after the shutdown barrier began not sent: it left",
                      what, message.meta.recver)

    def _on_message(self, message: Message) -> bool:
        control = message.meta.is_control
        if control:
            log.debug("control %s from node %s", message.meta.control.cmd.name, message.meta.sender)
        elif self._drop_rng is not None and self._ready.is_set() and \
                self._drop_rng.randrange(100) < self.config.drop_msg_percent:
            # PS_DROP_MSG: lose received data messages on purpose (to exercise PS_RESEND)
            self.dropped_messages += 1
            log.debug("PS_DROP_MSG: dropped a data message from node %s", message.meta.sender)
            return True
        if self._resender is not None:
            with self._resend_lock:
                ack, deliver = self._resender.on_receive(message, time.monotonic())
            if ack is not None:
                self._send_resend_traffic(ack, "ACK")
            if not deliver:
                return True
        if control:
            return self._execute(self.membership.handle(message, time.monotonic()),
                                 message.meta.sender)
        if not self._ready.is_set():     # its sender may know this node before it does
            if len(self._before_ready) < _EARLY_DATA_LIMIT:
                self._before_ready.append(message)
            return True
        self._dispatch_data(message)
        return True

    def _execute(self, actions, peer=None) -> bool:
        """Carry out membership's actions, each by its handler in ``_ACTIONS``; ``peer``: the
        sender of the message that caused them (its refusals are logged once in full, then
        counted). False once an action ended the node (the later ones still run)."""
        keep_running = True
        for action in actions:
            keep_running = self._ACTIONS[type(action)](self, action, peer) and keep_running
        return keep_running

    def _connect(self, action: Connect, peer) -> bool:
        try:
            self.van.connect(action.node, None if action.anonymous else self.membership.my_node.id)
        except KVStoreBytePSError as exc:    # (ends this node: raised on)
            self._abort_start(action.node, exc)
            raise
        return True

    def _abort_start(self, node: Node, error: Exception) -> None:
        """The scheduler cannot reach ``node`` as the cluster forms (its byteps_tcp hello
        refused: another version, van or key; an address that does not answer) and stops with
        ``error``: it first tells every node that registered why (best effort), so that they
        stop now too instead of waiting out BYTEPS_START_TIMEOUT for a node list that never
        comes (the membership has notices only on the scheduler). Nothing is done once the
        cluster formed."""
        if self._ready.is_set():
            return
        my_id = self.membership.my_node.id
        notices = self.membership.start_failed(node, str(error))
        deadline = time.monotonic() + _ABORT_NOTICE_S
        for other, notice in notices:
            if time.monotonic() > deadline:      # (one that does not answer took it all)
                log.debug("no time left to tell %s that the job cannot start",
                          other.describe_rank())
                continue
            try:
                if other.id != node.id:     # (``node`` is reached over ZeroMQ if at all)
                    self.van.connect(other, my_id)
                notice.meta.sender = my_id
                self._transmit(notice)
            except Exception as exc:     # the others still get theirs
                log.debug("could not tell %s that the job cannot start: %s",
                          other.describe_rank(), exc)
        if notices:     # ZeroMQ drops what it has not sent when the van closes (byteps_tcp's
            time.sleep(_ABORT_LINGER_S)     # sockets send theirs out after close)

    def _send(self, action: Send, peer) -> bool:
        try:
            self._transmit(action.message)
        except (PeerError, ProtocolError) as exc:   # e.g. a stranger's address
            self._peer_log.warning(action.message.meta.recver,
                                   "could not send %s to node %s: %s",
                                   action.message.meta.control.cmd.name,
                                   action.message.meta.recver, exc)
        return True

    def _become_ready(self, action: Ready, peer) -> bool:
        self.my_node, self.nodes = action.my_node, action.nodes
        self.recovery_epoch = action.epoch
        self._member_ids = frozenset(node.id for node in action.nodes)
        if self.config.resend:
            self._resender = Resender(self.my_node.id, self.config.resend_timeout_ms,
                                      in_order=self.van.in_order)
        self.van.on_nodes(self.nodes)
        self.van.on_ready()
        if action.epoch:     # before any request reaches the restarted server's app
            self._run_recovery_hooks(self.my_node, action.epoch)
        self._ready.set()
        early, self._before_ready = self._before_ready, []
        for message in early:
            self._dispatch_data(message)
        return True

    def _node_recovered(self, action: NodeRecovered, peer) -> bool:
        self.nodes = [action.node if n.id == action.node.id else n for n in self.nodes]
        self.van.on_nodes(self.nodes)
        log.warning("%s: %s restarted and rejoined (restart %d of that node id)",
                    self.my_node.describe(), action.node.describe_rank(), action.epoch)
        self._run_recovery_hooks(action.node, action.epoch)
        return True

    def _release_barrier(self, action: ReleaseBarrier, peer) -> bool:
        with self._barrier_cond:
            self._barrier_released += 1
            self._barrier_cond.notify_all()
        return True

    def _stop(self, action: Stop, peer) -> bool:
        return False

    def _node_dead(self, action: NodeDead, peer) -> bool:
        error = PeerError("%s is dead: %s" % (action.node.describe_rank(), action.reason))
        self._record_failure(error, "%s: %s" % (self.my_node.describe() if self.my_node
                                                 else "node", error))
        return False

    def _fail(self, action: Fail, peer) -> bool:
        if isinstance(action.error, JobAbortedError):
            action.error.elsewhere = not self._ended_job
        self._record_failure(action.error, "%s" % action.error)
        return False

    def _record_failure(self, error: BaseException, line: str) -> None:
        """The error that stops this node (the first one wins), and its ``line`` logged, once:
        while start() waits, start() raises it and its caller reports it (a worker's one-line
        error, the server's and scheduler's "failed"), so it is not logged here too."""
        with self._start_lock:
            self._error = self._error or error
            raised_by_start = self._starting
        if raised_by_start:
            log.debug("%s (start() raises it)", line)
        else:
            log.error("%s", line)

    def _refused(self, action: Refused, peer) -> bool:
        self._peer_log.warning(("refused", peer), "%s: %s", self.my_node.describe()
                               if self.my_node else "node", action.reason)
        return True

    #: membership's action type -> the method that carries it out
    _ACTIONS = {Connect: _connect, Send: _send, Ready: _become_ready,
                NodeRecovered: _node_recovered, ReleaseBarrier: _release_barrier, Stop: _stop,
                NodeDead: _node_dead, Fail: _fail, Refused: _refused}

    def _dispatch_data(self, message: Message) -> None:
        meta = message.meta
        if meta.sender == K_EMPTY or meta.app_id == K_EMPTY:
            self._peer_log.warning(meta.sender, "dropped a data message without %s",
                                   "sender identity" if meta.sender == K_EMPTY else "app_id")
            return
        customer_id = meta.customer_id if self.config.role is Role.WORKER else meta.app_id
        key = (meta.app_id, customer_id)
        # (a dict read needs no lock; only a miss has to be decided under it, where
        # register_handler also takes the messages kept for later)
        customer = self._customers.get(key)
        if customer is None:
            with self._lock:
                customer = self._customers.get(key)
                if customer is None:   # the app is not registered yet: keep it for later
                    self._early.setdefault(key, []).append(message)
                    return
        customer.accept(message)

    # ------------------------------------------------------------------ apps
    def register_handler(self, app_id: int, customer_id: int,
                          handler: Callable[[Message], None], inline: bool = False,
                          quick: Optional[Callable[[Message], bool]] = None):
        """Route data messages of (app_id, customer_id) to ``handler`` on its own thread, or,
        where the van allows it (customer.py), on the receive loop: all of them with
        ``inline`` (a handler that never waits for the van), or those ``quick`` calls quick
        while the handler's thread is idle."""
        if self.van.handlers_inline_ok and inline:
            customer = InlineHandler(app_id, customer_id, handler)
        elif self.van.handlers_inline_ok and quick is not None:
            customer = MixedHandler(app_id, customer_id, handler, quick)
        else:
            customer = HandlerThread(app_id, customer_id, handler)
        with self._lock:
            if (app_id, customer_id) in self._customers:
                raise ValueError("customer (%d, %d) is already registered" % (app_id, customer_id))
            self._customers[(app_id, customer_id)] = customer
            early = self._early.pop((app_id, customer_id), [])
        for message in early:
            customer.accept(message)
        return customer

    def is_member(self, node_id: int) -> bool:
        """Whether ``node_id`` is a node of the cluster as the scheduler announced it."""
        return node_id in self._member_ids

    def on_failure(self, hook: Callable[[BaseException], None]) -> None:
        """Call ``hook(error)`` once if the receive loop ends with an error (a dead node, a
        broken van): the KV layer fails every pending request with it."""
        self._failure_hooks.append(hook)

    def on_recovery(self, hook: Callable[[Node, int], None]) -> None:
        """Call ``hook(node, epoch)`` on the receive thread when a restarted server took over
        ``node.id`` for the ``epoch``-th time: another node (already connected to; the KV
        layer recovers what the dead one held), or this one, as it becomes ready and before
        any data message is handed on. Register before :meth:`start`."""
        self._recovery_hooks.append(hook)

    def _run_recovery_hooks(self, node: Node, epoch: int) -> None:
        for hook in list(self._recovery_hooks):
            try:
                hook(node, epoch)
            except Exception:
                log.exception("a recovery hook failed")

    def on_tick(self, hook: Callable[[float], None]) -> None:
        """Call ``hook(monotonic now)`` on the receive thread at every tick (every 50 ms):
        how the KV layer's deadlines are kept, with no thread of their own. Keep it short."""
        self._tick_hooks.append(hook)

    def send(self, message: Message) -> int:
        """Send a message to ``message.meta.recver`` (thread-safe)."""
        if self._stopped.is_set():
            if isinstance(self._error, JobAbortedError):    # the whole story: who, and why
                raise self._error.again()
            raise PeerError("cannot send to node %s: this node's van has stopped%s"
                            % (message.meta.recver,
                               " (%s)" % self._error if self._error else ""))
        message.meta.sender = self.my_id
        return self._transmit(message)

    def _transmit(self, message: Message) -> int:
        if self._resender is None:
            return self.van.send(message)
        # Kept for resending *before* it leaves: the ACK may come back before van.send
        # returns, and an ACK for a message not kept yet was lost, so it was resent for nothing.
        # Kept and sent under one lock, so the resender's order of sends is the wire's (fast
        # retransmit reads an ACK as "everything sent before it arrived").
        with self._resend_lock:
            self._resender.on_send(message, time.monotonic())
            return self.van.send(message)

    # ------------------------------------------------------------------ barrier / stop
    def barrier(self, group: int, customer_id: int = 0, timeout: Optional[float] = None,
                kind: str = "") -> None:
        """Block until every member of ``group`` called barrier. ``timeout=None`` waits as long
        as the cluster is alive, logging progress; otherwise DeadlineError after ``timeout`` s.
        ``kind``: a worker's finish or shutdown barrier (barriers.BARRIER_KINDS)."""
        if len(self.group_ids(group)) <= 1:
            return
        with self._barrier_cond:
            target = self._barrier_released + 1
        # posted to the receive loop, which owns the membership and sends control messages
        self.send(barrier_post(group, customer_id, self.my_id, self.membership.clock, kind))
        started = time.monotonic()
        with self._barrier_cond:
            while self._barrier_released < target:
                if self._stopped.is_set():
                    if isinstance(self._error, JobAbortedError):   # who ended it, and why
                        raise self._error.again()
                    raise PeerError("barrier of group %d aborted: the van stopped (%s)"
                                    % (group, self._error))
                waited = time.monotonic() - started
                if timeout is not None and waited > timeout:
                    raise DeadlineError("%s: barrier of group %d (nodes %s) not complete after "
                                        "%.0f s" % (self.my_node.describe(), group,
                                                    self.group_ids(group), waited))
                if not self._barrier_cond.wait(_PROGRESS_LOG_SECONDS if timeout is None
                                               else min(timeout, _PROGRESS_LOG_SECONDS)):
                    log.info("%s still waiting for barrier of group %d",
                             self.my_node.describe(), group)

    def end_job(self, reason: str, status: int = 1) -> None:
        """Ask the scheduler to end the job for every node, saying why (thread-safe); every
        node then exits with ``status``. The scheduler's notice then stops this node too
        (``error`` says why); with an upstream scheduler, which ignores the request, nothing
        happens: the caller stops by itself."""
        self._ended_job = True
        self.send(abort_request(reason, self.membership.clock, status))

    def finalize(self, barrier: bool = True, timeout: Optional[float] = None) -> None:
        """MXNet's shutdown: Barrier(7) (DeadlineError after ``timeout`` s; None waits as long
        as the cluster lives), then TERMINATE to self; the van stops even if the barrier
        fails. Idempotent."""
        if self._finalized or self._thread is None:
            return
        self._finalized = True
        if self._resender is not None:   # everyone is leaving: ACKs of the last messages,
            with self._resend_lock:      # and their receivers, may be gone
                self._resender.leave()
        try:
            if barrier and not self._stopped.is_set():
                self.barrier(ALL_GROUP, timeout=timeout)
        finally:
            self.stop()

    def stop(self) -> None:
        """Stop the receive loop (TERMINATE to self) and every customer."""
        if not self._loss_reported:
            self._loss_reported = True
            if self.dropped_messages:
                log.warning("PS_DROP_MSG=%d: %d received data messages were dropped on purpose",
                            self.config.drop_msg_percent, self.dropped_messages)
            if self._resender is not None and self._resender.resent:
                log.info("PS_RESEND: %s", self._resender.describe())
        if not self._stopped.is_set():
            try:
                self.van.send(terminate_message(self.my_id))
            except Exception as exc:  # van already broken: the loop ends anyway
                log.debug("could not send TERMINATE to self: %s", exc)
        if self._thread is not None:
            # The TERMINATE comes after everything sent before it; one that has not arrived
            # within a second may never (a node stopped while the cluster forms may not read
            # its own connection yet): then the van stops without it.
            self._thread.join(_TERMINATE_SECONDS)
            if self._thread.is_alive():
                self.van.interrupt()
            self._thread.join(_STOP_SECONDS)
            if self._thread.is_alive():
                log.error("the van's receive loop did not stop within %.0f s", _STOP_SECONDS)
        with self._lock:
            customers = list(self._customers.values())
        for customer in customers:
            customer.stop(_STOP_SECONDS)
