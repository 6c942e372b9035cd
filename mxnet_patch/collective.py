"""Named collectives on the ``dist_byteps`` store: what the BytePS and Horovod APIs are built on.

BytePS's and Horovod's MXNet APIs key every operation by a tensor *name*, and workers may meet
their names in different orders (layers built from a dict, parameters initialised lazily). So:

* a name's key is a hash of the name (:func:`key_of`), the same on every worker whatever the
  order; two names of one job that hash alike are refused by name, never merged;
* a name's key is declared (initialised on the servers) the first time it is used, without
  pairing the workers' calls (``KVStoreBytePS.declare``: each worker's read-back waits at the
  server for rank 0's value), and its partitions are placed by a hash of the key
  (``BYTEPS_KEY_HASH_FN`` defaults to BytePS's ``djb2`` here; ``balanced`` placement depends
  on the order of first use and is refused);
* a reduction is a ``pushpull`` of the store (asynchronous, through MXNet's engine), with
  MXNet operations for the scaling before and after it, so reading the result waits for it;
* asynchronous training (``BYTEPS_ENABLE_ASYNC=1``, one process per host): there are no
  rounds to sum, so a "reduction" is BytePS's async push_pull (the servers add the tensor into
  their copy, which is read back: :meth:`Collective.share`), and a broadcast is the
  declaration of a key with rank 0's value, read back (:meth:`Collective.broadcast`).

Ranks: ``BYTEPS_LOCAL_RANK`` / ``BYTEPS_LOCAL_SIZE`` (set by ``bpslaunch`` and ``launch.py``
for each process they start) give the local rank and size. What a host's processes are depends
on what ``DMLC_NUM_WORKER`` counts (``BYTEPS_LOCAL_GROUPS``, :attr:`Config.local_groups`):

* hosts (BytePS's meaning: ``bpslaunch``, ``launch.py --local-groups``): with several processes
  per host, local rank 0 is the host's ``dist_byteps`` worker and the others reduce through it
  (:mod:`mxnet_patch.localgroup`): one flow per host; rank = worker rank x local size + local
  rank, size = workers x local size, as BytePS defines them;
* processes (``launch.py``'s default, as MXNet's launcher): every process is a ``dist_byteps``
  worker of its own, rank and size are the store's, and the local rank and size only say
  where on its host a process runs (``mx.gpu(local_rank())``).
"""
import threading
import zlib
from typing import Optional

import mxnet as mx

from kvstore_byteps.config import Config, Env, set_default
from kvstore_byteps.logs import announce
from kvstore_byteps.words import count

from .engine_async import host_view, push_async
from .localgroup import LocalMember, LocalRoot, group_address
from .worker_exit import close_at_exit

__all__ = ["Collective", "key_of", "COLLECTIVE"]

#: keys are MXNet's C ints; hashes stay below 2**30 so they never meet the store's other keys
_KEY_SPACE = 1 << 30


def key_of(name: str) -> int:
    """The store key of a tensor name: a CRC-32 of its UTF-8 bytes, within [0, 2**30)."""
    return zlib.crc32(name.encode("utf-8")) % _KEY_SPACE


def _config() -> Config:
    """This process's settings, read as the BytePS and Horovod APIs' (a local member too)."""
    return Config.from_env(in_local_group=True)


class Collective:
    """The process's store and the names it has declared. Thread-safe."""

    def __init__(self):
        self._kv = None
        self._elastic_scale = 0
        self._group = None        # LocalRoot / LocalMember with several processes per host
        self._ranks = None        # (rank, size) of this process in the job
        self._names = {}          # key -> name (collisions are refused)
        self._uses = {}           # name -> times this process reduced it (rounds of a group)
        self._auto = 0            # the count behind generated names
        self._asynchronous = False
        self._lock = threading.RLock()

    # ------------------------------------------------------------------ life
    def start(self):
        """Join the job (once; later calls do nothing). Returns the store."""
        with self._lock:
            if self._kv is None:
                # the default of this process's stores, the one this creates included (each
                # store reads its own Config); os.environ stays as the user set it
                set_default(Env.KEY_HASH_FN, "djb2")
                config = _config()
                if config.key_hash_fn == "balanced":
                    raise ValueError(
                        "BYTEPS_KEY_HASH_FN=balanced places partitions in the order tensors "
                        "are first used, which the BytePS and Horovod APIs do not fix; use "
                        "djb2 (BytePS's default), sdbm or built_in")
                self._join(config)
            return self._kv

    def _join(self, config: Config) -> None:
        if config.backup_workers:
            raise ValueError("BYTEPS_BACKUP_WORKERS is a mode of the dist_byteps store "
                             "(gluon.Trainer, Module.fit), not of the BytePS and Horovod APIs, "
                             "whose push_pull and allreduce sum every worker's tensor")
        self._asynchronous = config.enable_async
        #: an elastic job's DMLC_NUM_WORKER (its sums' scale), else 0
        self._elastic_scale = config.num_workers if config.elastic else 0
        if not self.grouped(config):        # every process is a worker of its own
            kv = mx.kv.create("dist_byteps")
            self._kv, self._ranks = kv, (kv.rank, kv.num_workers)
        elif self._asynchronous:
            raise ValueError("BYTEPS_ENABLE_ASYNC with several processes per host in one local "
                             "group (BYTEPS_LOCAL_SIZE=%d) is not supported: run one process per "
                             "host, or train synchronously" % config.local_size)
        else:
            self._join_group(config, group_address(
                config.root_uri, str(config.root_port),
                "" if config.worker_id is None else str(config.worker_id)))

    def _join_group(self, config: Config, address: str) -> None:
        """Join the host's local group: as its root (local rank 0, the host's worker in the
        cluster) or as a member that reduces through it."""
        if config.local_member:
            self._group = self._kv = LocalMember(address, config.local_rank,
                                                 config.request_timeout)
            self._set_group_ranks(config, self._group.welcome["rank"],
                                  self._group.welcome["workers"])
            close_at_exit(self.shutdown)
            return
        kv = self._kv = mx.kv.create("dist_byteps")
        self._set_group_ranks(config, kv.rank, kv.num_workers)
        self._group = LocalRoot(address, config.local_size, kv, config.request_timeout,
                                {"rank": kv.rank, "workers": kv.num_workers})
        if kv.rank == 0:
            announce(config, "BytePS/Horovod API: %s x %s = %s (size()); local rank 0 of each "
                     "host is its dist_byteps worker" % (
                         count(kv.num_workers, "worker host"),
                         count(config.local_size, "process", "processes"),
                         count(kv.num_workers * config.local_size, "process", "processes")))
        self._group.wait_members(config.start_timeout)

    def _set_group_ranks(self, config: Config, host_rank: int, hosts: int) -> None:
        """BytePS's ranks: host's worker rank x local size + local rank, hosts x local size."""
        self._ranks = (host_rank * config.local_size + config.local_rank,
                       hosts * config.local_size)

    @staticmethod
    def grouped(config: Optional[Config] = None) -> bool:
        """Whether this host's processes form one local group (DMLC_NUM_WORKER counts hosts
        and there are several processes here)."""
        config = config or _config()
        return config.local_groups and config.local_size > 1

    @property
    def started(self) -> bool:
        """Whether :meth:`start` ran (and :meth:`shutdown` did not)."""
        return self._kv is not None

    def shutdown(self) -> None:
        """Finish pending work and leave the job (the store's exit sequence). Idempotent."""
        with self._lock:
            kv, self._kv = self._kv, None
            group, self._group = self._group, None
            self._names.clear()
            self._uses.clear()
        if kv is None:
            return
        mx.nd.waitall()          # the group's rounds finish before its links close
        if group is not None:
            group.close()
        if kv is not group:
            kv.close()

    def joining(self) -> bool:
        """Whether this process took a departed worker's place in an elastic job and has
        not joined yet (kvstore_byteps.elastic.State joins it): its start-up broadcasts are
        no-ops, the others passed theirs long ago."""
        joins = getattr(getattr(self._kv, "_engine", None), "joins", None)
        return bool(joins is not None and joins.joining)

    @property
    def kv(self):
        """The store (a local member's link to its root); ValueError before init()."""
        kv = self._kv
        if kv is None:
            raise ValueError("not initialised: call init() first")
        return kv

    # ------------------------------------------------------------------ ranks
    def rank(self) -> int:
        """This process's rank: the store's, or in a local group worker rank x local size +
        local rank (BytePS's global rank)."""
        return self._joined()[0]

    def size(self) -> int:
        """Every process of the job; in an elastic job (one process a worker) those in it
        now: it follows the workers that leave and join."""
        ranks = self._joined()
        return self._kv.num_workers if self._elastic_scale else ranks[1]

    def scale_size(self) -> int:
        """The processes the job's sums are scaled to, what an average divides by: size()
        at the start, DMLC_NUM_WORKER in an elastic job (whose servers scale each round to
        that many workers, whoever is in it), the same on every process."""
        ranks = self._joined()
        return self._elastic_scale or ranks[1]

    def _joined(self):
        """(rank, size); ValueError before init()."""
        self.kv                      # raises before init()
        return self._ranks

    @staticmethod
    def local_rank() -> int:
        return _config().local_rank

    @staticmethod
    def local_size() -> int:
        return _config().local_size

    # ------------------------------------------------------------------ names and keys
    def auto_name(self, prefix: str) -> str:
        """A generated name (``prefix.N``): the same on every worker that makes its unnamed
        calls in the same order."""
        with self._lock:
            self._auto += 1
            return "%s.%d" % (prefix, self._auto)

    @property
    def asynchronous(self) -> bool:
        """Whether the job trains asynchronously (BYTEPS_ENABLE_ASYNC=1); known once started."""
        return self._asynchronous

    def declare(self, name: str, like, initial=None) -> int:
        """The key of ``name``, initialised on the servers the first time (blocking) with rank
        0's ``initial`` (default: zeros shaped like ``like``). ValueError if another name of
        this job has the same key."""
        key = key_of(name)
        kv = self.kv
        with self._lock:
            known = self._names.get(key)
            if known is not None and known != name:
                raise ValueError("tensor names %r and %r have the same key (%d); rename one"
                                 % (known, name, key))
            if known is None:
                self._names[key] = name
        if not isinstance(kv, LocalMember) and not kv.declared(key):
            kv.declare(key, mx.nd.zeros(like.shape, dtype=like.dtype) if initial is None
                       else initial)
        return key

    # ------------------------------------------------------------------ reductions
    def reduce(self, tensor, out, name: str, priority: int = 0, prescale: float = 1.0,
               postscale: float = 1.0):
        """``out`` = ``postscale`` x the sum over workers of ``prescale`` x ``tensor``
        (``out`` may be ``tensor``). Asynchronous: reading ``out`` waits for it."""
        key = self.declare(name, tensor)
        source = tensor
        if prescale != 1.0:
            if out is tensor:
                tensor *= prescale
            else:
                source = tensor * prescale      # the input stays as it is
        if self._asynchronous:      # no rounds to sum in: BytePS's async push_pull
            self.kv.add_to_shared(key, source, out, priority)
        elif self._group is None:
            self.kv.pushpull(key, source, out=out, priority=priority)
        else:
            self._reduce_in_group(key, name, source, out, priority)
        if postscale != 1.0:
            out *= postscale
        return out


    def share(self, name: str, initial, change, out, priority: int = 0):
        """Asynchronous training: add ``change`` into the servers' copy of ``name`` (made the
        first time from rank 0's ``initial``) and read it back into ``out``. Asynchronous:
        reading ``out`` waits for it."""
        key = self.declare(name, change, initial=initial)
        self.kv.add_to_shared(key, change, out, priority)
        return out

    def broadcast(self, name: str, tensor) -> None:
        """Asynchronous training: ``tensor`` takes rank 0's value of it (the declaration of
        ``name`` with it, read back). Blocking."""
        key = self.declare(name, tensor, initial=tensor)
        self.kv.pull(key, out=tensor)
        tensor.wait_to_read()

    def _reduce_in_group(self, key: int, name: str, source, out, priority: int) -> None:
        """The sum over the host's processes (through its root) and all hosts, as an
        operation of MXNet's engine reading ``source`` and writing ``out``. Tensors on a GPU
        pass through a host copy (the group's processes exchange host memory)."""
        if out.context.device_type != "cpu":
            staging = source.as_in_context(mx.cpu())
            self._reduce_in_group(key, name, staging, staging, priority)
            staging.copyto(out)
            return
        with self._lock:
            seq = self._uses[name] = self._uses.get(name, -1) + 1
        group = self._group

        def run(done):
            src, dst = host_view(source), host_view(out)
            if isinstance(group, LocalRoot):
                group.reduce(key, name, seq, src, dst, priority, done)
            else:
                group.reduce(name, seq, src, dst, done)
        push_async(run, const_arrays=[] if source is out else [source], mutable_arrays=[out],
                   priority=priority, name="local_reduce_%s" % name)


#: the process's collective (BytePS's and Horovod's APIs share it)
COLLECTIVE = Collective()
