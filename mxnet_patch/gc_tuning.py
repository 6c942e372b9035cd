"""The cyclic garbage collector's settings of a ``dist_byteps`` worker process, made once at the
store's start-up (``BYTEPS_GC_FREEZE``, ``BYTEPS_GC_YOUNG_THRESHOLD``): the objects alive then
frozen, the youngest generation collected less often."""
import gc

__all__ = ["tune_collector", "freeze_startup_objects", "collect_young_less_often"]


def tune_collector(config) -> None:
    """The collector as ``config`` (a ``kvstore_byteps.config.Config``) says."""
    if config.gc_freeze:
        freeze_startup_objects()
    if config.gc_young_threshold:
        collect_young_less_often(config.gc_young_threshold)


def freeze_startup_objects() -> None:
    """Start-up step of ``dist_byteps`` (``BYTEPS_GC_FREEZE=1``, the default): move every
    object alive now out of the garbage collector's sight (``gc.freeze``).

    MXNet's import leaves tens of thousands of tracked objects; every full collection rescans
    them, and per-key garbage triggers collections often (measured: a quarter of the time of
    1000 small pushpulls). Frozen objects stay alive and usable, they are only not rescanned;
    objects created later are collected as usual.
    """
    gc.freeze()


def collect_young_less_often(threshold: int) -> None:
    """Start-up step of ``dist_byteps`` (``BYTEPS_GC_YOUNG_THRESHOLD``, default 10000): the
    cyclic garbage collector's youngest generation is collected once ``threshold`` more
    objects were made than freed, not after Python's 700.

    A round of many keys keeps thousands of objects alive until it is answered (requests,
    tasks, completions): every 700 of them a collection scanned the ones in flight, then moved
    them on to the older generations, where later collections scanned them again. With 10000,
    rounds of a thousand small keys cost a worker about a sixth less CPU (loopback 2x2,
    bench_cost's 1000 x 4 KB). Objects without cycles are still freed at once; only cyclic
    garbage waits a little longer."""
    gc.set_threshold(threshold, *gc.get_threshold()[1:])
