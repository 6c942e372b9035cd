"""MXNet's server profiling for our server: ``kSetProfilerParams``, a Chrome trace per server.

MXNet 1.9.1 workers drive it with ``mx.profiler.set_config(..., profile_process='server')``,
``set_state(...)`` and ``dump(...)``: rank 0 sends the command to every server, its body the
parameters followed by one digit naming the command (MXNet's ``KVStoreServerProfilerCommand``):

* ``0`` set config: ``key:value`` pairs joined by commas; the server prefixes ``filename`` with
  ``rank<server rank>_`` (so ``filename=p.json`` gives ``rank0_p.json``, ``rank1_p.json``, ...
  in each server's working directory) and starts over (the old file is removed, as MXNet does);
* ``1`` state: the first digit, 1 run, 0 stop;
* ``2`` pause: the first digit, 1 pause, 0 resume;
* ``3`` dump: write the file now (the first digit: 1 finished, recording stops).

MXNet's C++ server profiles its own engine operations and writes the file when the process
exits. This one records our server's stages, as Chrome trace duration events on the thread
that ran them: each request (``push``, ``pull``, ``pushpull`` with the key, sender and bytes),
each command, each optimizer update and each summation task of the BytePS data path; it writes
the file when profiling stops, on ``dump``, and when the server exits. Recording costs one
attribute test per stage while profiling is off.
"""
import json
import logging
import os
import threading
import time
from typing import Any, Callable, Dict, List, Optional

from ..errors import ProtocolError

__all__ = ["ServerProfiler"]

log = logging.getLogger(__name__)

_SET_CONFIG, _STATE, _PAUSE, _DUMP = "0", "1", "2", "3"


class ServerProfiler:
    """One server's profile. ``command`` and the recording methods are thread-safe."""

    def __init__(self, directory: str = "."):
        self.directory = directory
        self.rank = 0                      # the server's rank (set once the cluster formed)
        self.path: Optional[str] = None    # where the trace goes (after set config)
        self.config: Dict[str, str] = {}
        #: whether stages are being recorded now (run, and not paused)
        self.recording = False
        self._running = False
        self._paused = False
        self._events: List[Dict[str, Any]] = []
        self._dumped = 0                   # events already in the file
        self._lock = threading.Lock()

    # -- MXNet's command --------------------------------------------------------------------
    def command(self, body: bytes) -> None:
        """Handle a kSetProfilerParams body; ProtocolError if it is not one."""
        text = body.decode("utf-8", "replace")
        if not text or text[-1] not in (_SET_CONFIG, _STATE, _PAUSE, _DUMP):
            raise ProtocolError("server profiler command %r: it must end with 0-3" % text[:80])
        kind, payload = text[-1], text[:-1]
        if kind == _SET_CONFIG:
            self._set_config(payload)
        elif not payload or payload[0] not in "01":
            raise ProtocolError("server profiler command %r: expected 0 or 1 first" % text[:80])
        elif kind == _STATE:
            self._set_state(payload[0] == "1")
        elif kind == _PAUSE:
            with self._lock:
                self._paused = payload[0] == "1"
                self._update_recording()
        else:
            self.dump(finished=payload[0] == "1")

    def _set_config(self, payload: str) -> None:
        config = {}
        for item in filter(None, payload.split(",")):
            name, sep, value = item.partition(":")
            if not sep or not name or not value:
                raise ProtocolError("server profiler config %r: expected name:value pairs"
                                    % payload[:200])
            config[name] = value
        filename = config.get("filename", "profile.json")
        path = os.path.normpath(os.path.join(self.directory, "rank%d_%s" % (self.rank, filename)))
        if os.path.relpath(path, self.directory).startswith(os.pardir):
            raise ProtocolError("server profiler filename %r leaves the server's directory"
                                % filename)
        with self._lock:
            self.config, self.path = config, path
            self._events, self._dumped = [], 0
        try:
            os.unlink(path)                 # as MXNet's profiler does: start over
        except OSError:
            pass
        log.info("server profiler: will write %s", path)

    def _set_state(self, run: bool) -> None:
        if self.path is None:
            raise ProtocolError("server profiler: set_config (with a filename) must come "
                                "before set_state")
        with self._lock:
            self._running = run
            self._update_recording()
        if not run:
            self.dump(finished=False)

    def _update_recording(self) -> None:
        self.recording = self._running and not self._paused

    # -- recording ------------------------------------------------------------------------------
    def record(self, name: str, category: str, start_ns: int, end_ns: int,
               args: Optional[Dict[str, Any]] = None) -> None:
        """One stage that ran on this thread from ``start_ns`` to ``end_ns``
        (``time.perf_counter_ns``)."""
        if not self.recording:
            return
        event = {"name": name, "cat": category, "ph": "X", "ts": start_ns / 1000.0,
                 "dur": (end_ns - start_ns) / 1000.0, "pid": "server rank %d" % self.rank,
                 "tid": threading.current_thread().name}
        if args:
            event["args"] = args
        self._events.append(event)         # atomic under the GIL

    def timed(self, category: str, fn: Callable, describe: Callable[..., tuple]) -> Callable:
        """``fn`` recorded as a stage; ``describe(*args)`` gives its ``(name, args)``."""
        def run(*args):
            if not self.recording:
                return fn(*args)
            start = time.perf_counter_ns()
            try:
                return fn(*args)
            finally:
                name, details = describe(*args)
                self.record(name, category, start, time.perf_counter_ns(), details)
        return run

    # -- output ---------------------------------------------------------------------------------
    def dump(self, finished: bool = False) -> Optional[str]:
        """Write every event so far to the trace file (None: never configured)."""
        with self._lock:
            if self.path is None:
                return None
            events, path = list(self._events), self.path
            self._dumped = len(events)
            if finished:
                self._running = False
                self._update_recording()
        trace = {"traceEvents": [{"name": "process_name", "ph": "M",
                                  "pid": "server rank %d" % self.rank,
                                  "args": {"name": "kvstore-byteps server rank %d"
                                                   % self.rank}}] + events,
                 "displayTimeUnit": "ms"}
        with open(path, "w") as out:
            json.dump(trace, out)
        log.info("server profiler: wrote %d events to %s", len(events), path)
        return path

    def close(self) -> None:
        """At the server's exit: write what was recorded since the last dump (as MXNet's
        profiler does at exit)."""
        if self.path is not None and len(self._events) > self._dumped:
            try:
                self.dump(finished=True)
            except OSError as exc:
                log.error("server profiler: could not write %s: %s", self.path, exc)
