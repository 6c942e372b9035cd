"""Python work as an asynchronous operation of MXNet 1.9.1's dependency engine (ctypes).

:func:`push_async` pushes ``fn`` with ``MXEnginePushAsyncND``; the engine treats it like any
operator that reads ``const_arrays`` and writes ``mutable_arrays``: it starts once earlier writers
of those arrays are done, and later readers and writers wait for it. ``push_async`` returns at
once; reading an output (``asnumpy``, ``wait_to_read``, a dependent operator) waits until ``fn``'s
``done`` callback is called.

Facts about MXNet 1.9.1 this relies on (checked against ``include/mxnet/c_api.h``,
``include/mxnet/engine.h`` and ``libmxnet.so`` of the pip wheel, and exercised by the tests):

* ``MXEnginePushAsyncND(EngineAsyncFunc f, void* param, EngineFuncParamDeleter deleter,
  ContextHandle ctx, NDArrayHandle* const_nds, int n_const, NDArrayHandle* mutable_nds,
  int n_mutable, EngineFnPropertyHandle prop, int priority, const char* name, bool wait)``;
  ``EngineAsyncFunc`` is ``void(void* run_ctx, void* on_complete, void* param)`` and
  ``ContextHandle`` points at ``mxnet::Context`` = ``{int32 dev_type; int32 dev_id}``
  (1 = cpu, 2 = gpu, 3 = cpu_pinned, 5 = cpu_shared).
* ``on_complete`` points at a ``CallbackOnComplete`` on the engine thread's stack: three pointers
  ``{void (*fn)(Engine*, void* param, const dmlc::Error* error); Engine* engine; void* param}``.
  We copy it before returning and later call ``fn(engine, param, error)`` from any thread.
* With ``error != NULL`` the engine stores a copy of the ``dmlc::Error`` as the operator's
  exception: the next read of an output (or of anything computed from it) raises it, once, as
  for MXNet's own failing operators. The message is ``"<ClassName>: <text>"``; MXNet's FFI turns
  that into the class registered under that name (builtins such as ValueError and TypeError,
  and, registered here, every kvstore_byteps error class), else ``MXNetError``.
  A ``dmlc::Error`` is a ``std::runtime_error`` with no extra members; we build one with
  libstdc++'s exported ``std::runtime_error(const char*)`` constructor and point its vtable at
  ``dmlc::Error``'s (``_ZTVN4dmlc5ErrorE``, exported by ``libmxnet.so``). If that is not possible on some build,
  the error is kept and :func:`raise_pending_error` raises it (the outputs are then released
  without an error).
* Under ``MXNET_ENGINE_TYPE=NaiveEngine`` the engine runs the operation inside the push call and
  assumes it finished when it returns; we detect that (the callback runs while its own thread is
  still inside ``MXEnginePushAsyncND``) and wait for ``done`` there.

Inside ``fn`` never call MXNet functions that wait for the operation's own arrays
(``asnumpy``, ``wait_to_read``): they would wait for ``fn`` itself. Use :func:`host_view` for
CPU arrays' memory instead. The arrays stay referenced until ``done``.
"""
import ctypes
import itertools
import queue
import threading
from typing import Any, Callable, Dict, Optional, Sequence

import numpy as np
from mxnet import base as _mxbase

from kvstore_byteps import errors as _errors
from kvstore_byteps.errors import DeadlineError, KVStoreBytePSError

__all__ = ["push_async", "push_prepared", "Operands", "host_view", "raise_pending_error",
           "engine_errors_supported", "AsyncOperationError"]

Done = Callable[..., None]

_ASYNC_FUNC = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p)
# Pushing an operation and completing one are short C calls that never wait (with wait=False a
# CPU or GPU operation is queued for an engine thread, never run inside the push; completing
# one only queues the operations that waited for it), so both keep the GIL: ctypes' CDLL and
# CFUNCTYPE release it around every call, and on a worker whose threads run on several cores
# each release was a GIL hand-off (futex calls, a wake-up on another core) per key.
# Measured, 1 worker x 1 server, 1000 x 4 KB keys: 92-106 -> 62-72 ms per step, and the
# worker's system time per step 56-61 -> 33-34 ms.
_ON_COMPLETE = ctypes.PYFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p)
#: libmxnet.so once more, through PyDLL: its functions are called with the GIL held
_LIB_KEEPING_GIL = ctypes.PyDLL(_mxbase._LIB._name)
# A ctypes callback on a thread Python did not start (an MXNet engine thread) makes a new
# Python thread state for every call and deletes it on return (PyGILState_Ensure/Release).
# That was most of an operation's cost: 1000 no-op operations took 28 us of CPU each, 8.5 us
# with the thread state kept. One extra PyGILState_Ensure that is never released keeps the
# engine thread's state (and its threading.local data) for the thread's life; the GIL itself
# is still released after every callback.
#: argument types declared once: ctypes then converts plain ints, bytes and arrays itself
#: instead of a c_int, c_void_p, c_char_p and c_bool object made per call (and per key)
_PUSH = _LIB_KEEPING_GIL.MXEnginePushAsyncND
_PUSH.argtypes = [_ASYNC_FUNC, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p,
                  ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p, ctypes.c_int,
                  ctypes.c_void_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_bool]
_PUSH.restype = ctypes.c_int
_PyGILState_Ensure = ctypes.pythonapi.PyGILState_Ensure
_PyGILState_Ensure.restype = ctypes.c_int
_PyGILState_Ensure.argtypes = []
_CPU_TYPES = {"cpu": 1, "cpu_pinned": 3, "cpu_shared": 5}
#: Longest wait for ``done`` when the engine runs the operation synchronously (NaiveEngine).
SYNCHRONOUS_DONE_TIMEOUT_S = 3600.0


class AsyncOperationError(KVStoreBytePSError):
    """An engine operation pushed by :func:`push_async` failed (when MXNet cannot carry it)."""


class _CallbackOnComplete(ctypes.Structure):
    _fields_ = [("function", ctypes.c_void_p), ("engine", ctypes.c_void_p),
                ("param", ctypes.c_void_p)]


class _Context(ctypes.Structure):
    _fields_ = [("dev_type", ctypes.c_int32), ("dev_id", ctypes.c_int32)]


class _DmlcErrors:
    """Builds ``dmlc::Error`` objects in ctypes memory (see the module docstring)."""

    def __init__(self):
        try:
            libstdcxx = ctypes.CDLL("libstdc++.so.6")
            self._construct = libstdcxx._ZNSt13runtime_errorC2EPKc
            self._destroy = libstdcxx._ZNSt13runtime_errorD2Ev
            table = ctypes.c_void_p.in_dll(_mxbase._LIB, "_ZTVN4dmlc5ErrorE")
        except (OSError, AttributeError, ValueError):
            self.supported = False
            return
        self._construct.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
        self._construct.restype = None
        self._destroy.argtypes = [ctypes.c_void_p]
        self._destroy.restype = None
        # A vtable pointer points past the offset-to-top and typeinfo slots.
        self._vptr = ctypes.addressof(table) + 2 * ctypes.sizeof(ctypes.c_void_p)
        self.supported = True

    def complete_with(self, on_complete: "_Completion", message: str) -> None:
        """Call the engine's completion function with a dmlc::Error carrying ``message``."""
        storage = ctypes.create_string_buffer(8 * ctypes.sizeof(ctypes.c_void_p))
        self._construct(storage, message.encode("utf-8", "replace"))
        ctypes.c_void_p.from_buffer(storage).value = self._vptr
        try:
            on_complete.call(ctypes.addressof(storage))
        finally:
            self._destroy(storage)   # the engine keeps its own copy


#: the engine's completion functions (one or two in a process) by address: a ctypes function
#: object per operation was one more object for the cyclic garbage collector, which with
#: thousands of keys in flight ran as much as the rest of the worker (bench_cost.py)
_COMPLETION_FUNCTIONS: Dict[int, Any] = {}


class _Completion:
    """A copy of MXNet's CallbackOnComplete; callable from any thread."""

    __slots__ = ("_function", "_engine", "_param")

    def __init__(self, address: int):
        source = _CallbackOnComplete.from_address(address)
        function = _COMPLETION_FUNCTIONS.get(source.function)
        if function is None:
            function = _COMPLETION_FUNCTIONS[source.function] = _ON_COMPLETE(source.function)
        self._function = function
        self._engine, self._param = source.engine, source.param

    def call(self, error_address: Optional[int]) -> None:
        self._function(self._engine, self._param, error_address)


class _Operation:
    """Everything one pushed operation needs until its ``done`` (keeps ctypes objects alive).
    The operation is itself the ``done`` handed to ``fn`` (no bound method per operation)."""

    __slots__ = ("fn", "operands", "inline", "finished", "completion", "_lock", "_called")

    def __init__(self, fn: Callable[[Done], None], operands: "Operands", inline: bool):
        self.fn, self.operands, self.inline = fn, operands, inline
        #: set by done(); made only for an operation run inside its push call (NaiveEngine),
        #: whose pusher waits on it (an Event per operation cost 1/7 of pushpull's own time)
        self.finished: Optional[threading.Event] = None
        self.completion: Optional[_Completion] = None
        self._lock = threading.Lock()
        self._called = False

    def done(self, error: Any = None) -> None:
        """Release the outputs; ``error`` (exception or text) makes reading them raise."""
        with self._lock:
            if self._called:
                return
            self._called = True
        try:
            _REGISTRY.complete(self, error)
        finally:
            finished = self.finished
            if finished is not None:
                finished.set()

    __call__ = done


class _Registry:
    """Operations between push and start, the dispatcher thread, and unreportable errors."""

    def __init__(self):
        self._lock = threading.Lock()
        self._waiting: Dict[int, _Operation] = {}
        self._ids = itertools.count(1)
        self._errors = _DmlcErrors()
        self._pending_errors = []
        self._work: "queue.SimpleQueue[_Operation]" = queue.SimpleQueue()
        self._dispatcher: Optional[threading.Thread] = None
        self.trampoline = _ASYNC_FUNC(self._on_start)   # lives as long as the process

    def add(self, operation: _Operation) -> int:
        with self._lock:
            op_id = next(self._ids)
            self._waiting[op_id] = operation
            if not operation.inline and self._dispatcher is None:
                self._dispatcher = threading.Thread(target=self._dispatch, daemon=True,
                                                    name="kvstore-byteps-engine-ops")
                self._dispatcher.start()
        return op_id

    def discard(self, op_id: int) -> None:
        with self._lock:
            self._waiting.pop(op_id, None)

    def _on_start(self, _run_ctx, on_complete, param) -> None:
        """Runs on an MXNet engine thread (or the pusher's, for NaiveEngine): hand off, return."""
        with self._lock:
            operation = self._waiting.pop(param, None)
        if operation is None:   # cannot happen unless MXNet calls us twice; never raise here
            return
        operation.completion = _Completion(on_complete)
        synchronous = getattr(_PUSHING, "active", False)   # called back inside the push call
        if not synchronous and not getattr(_ENGINE_THREAD, "kept", False):
            _PyGILState_Ensure()                           # see _PyGILState_Ensure
            _ENGINE_THREAD.kept = True
        if synchronous:
            operation.finished = threading.Event()          # before anything can call done()
        if operation.inline or synchronous:
            _run(operation)
        else:
            self._work.put(operation)
        if synchronous and not operation.finished.wait(SYNCHRONOUS_DONE_TIMEOUT_S):
            operation.done(DeadlineError("engine operation %r: done() was not called within "
                                         "%.0f s" % (operation.operands.name,
                                                     SYNCHRONOUS_DONE_TIMEOUT_S)))

    def _dispatch(self) -> None:
        while True:
            _run(self._work.get())

    def complete(self, operation: _Operation, error: Any) -> None:
        if error is None:
            operation.completion.call(None)
            return
        message = _describe(error)
        if self._errors.supported:
            self._errors.complete_with(operation.completion, message)
            return
        with self._lock:
            self._pending_errors.append(AsyncOperationError(
                "engine operation %s failed: %s" % (operation.operands.name.decode(), message)))
        operation.completion.call(None)

    def pop_pending_error(self) -> Optional[AsyncOperationError]:
        with self._lock:
            return self._pending_errors.pop(0) if self._pending_errors else None


def _describe(error: Any) -> str:
    if not isinstance(error, BaseException):
        return str(error)
    notes = "".join("\n" + note for note in getattr(error, "__notes__", ()))
    return "%s: %s%s" % (type(error).__name__, error, notes)


def _run(operation: _Operation) -> None:
    """Call the user's ``fn``; an exception it raises completes the operation with that error."""
    try:
        operation.fn(operation)
    except Exception as exc:  # the failure belongs to whoever reads the outputs
        operation.done(exc)


_REGISTRY = _Registry()


def _register_error_types() -> None:
    """Let MXNet raise our own exception classes: its FFI maps "Name: text" to class Name."""
    classes = [value for value in vars(_errors).values()
               if isinstance(value, type) and issubclass(value, KVStoreBytePSError)]
    for cls in classes + [AsyncOperationError]:
        if cls.__name__ not in _mxbase.error_types:
            _mxbase.register_error(cls.__name__, cls)


_register_error_types()
#: ``active`` is True on a thread while it is inside MXEnginePushAsyncND.
_PUSHING = threading.local()
#: ``kept`` is True on an engine thread whose Python thread state is kept between callbacks
#: (a threading.local lives exactly as long as its thread state)
_ENGINE_THREAD = threading.local()


_HANDLE_ARRAYS = [ctypes.c_void_p * n for n in range(4)]   # the usual sizes, made once


def _handles(arrays: Sequence[Any]):
    n = len(arrays)
    kind = _HANDLE_ARRAYS[n] if n < len(_HANDLE_ARRAYS) else ctypes.c_void_p * n
    return kind(*[array.handle.value for array in arrays])


_CPU_CONTEXT = _Context(1, 0)        # the default, made once (lives as long as the module)


def _context(ctx: Any) -> _Context:
    if ctx is None:
        return _CPU_CONTEXT
    return _Context(ctx.device_typeid, ctx.device_id)


class Operands:
    """What an engine operation reads (``const_arrays``) and writes (``mutable_arrays``), the
    context it is scheduled on and its name, in the form MXNet's push takes them: made once
    and pushed with :func:`push_prepared` as often as needed (a key's pushpull with the same
    arrays every step; building the handle arrays was a tenth of a pushpull call). Keeps the
    arrays alive, and with them their handles."""

    __slots__ = ("arrays", "const_count", "mutable_count", "const_handles", "mutable_handles",
                 "context", "name")

    def __init__(self, const_arrays: Sequence[Any] = (), mutable_arrays: Sequence[Any] = (),
                 name: str = "kvstore_byteps", ctx: Any = None):
        arrays = [*const_arrays, *mutable_arrays]
        for array in arrays:
            if not hasattr(array, "handle"):
                raise TypeError("push_async takes mxnet NDArrays, got %r"
                                % type(array).__name__)
        self.arrays = arrays
        self.const_count, self.mutable_count = len(const_arrays), len(mutable_arrays)
        self.const_handles, self.mutable_handles = _handles(const_arrays), _handles(mutable_arrays)
        self.context = _context(ctx)
        self.name = name.encode("utf-8")


def push_async(fn: Callable[[Done], None], const_arrays: Sequence[Any] = (),
               mutable_arrays: Sequence[Any] = (), priority: int = 0,
               name: str = "kvstore_byteps", ctx: Any = None, inline: bool = False) -> None:
    """Push ``fn`` as an engine operation reading ``const_arrays`` and writing ``mutable_arrays``.

    When the inputs are ready, ``fn(done)`` is called on our dispatcher thread (or, with
    ``inline=True``, on the engine thread: only for functions that return within microseconds).
    ``fn`` starts the work and returns; ``done()`` or ``done(error)`` must then be called exactly
    once, from any thread (later calls are ignored). An exception raised by ``fn`` counts as
    ``done(exception)``. ``ctx`` is the mxnet.Context the engine schedules on (default CPU 0,
    whose start also waits for GPU producers of the inputs). Thread-safe.
    """
    push_prepared(fn, Operands(const_arrays, mutable_arrays, name, ctx), priority, inline)


def push_prepared(fn: Callable[[Done], None], operands: Operands, priority: int = 0,
                  inline: bool = False) -> None:
    """:func:`push_async` of ``fn`` on ``operands`` made beforehand."""
    operation = _Operation(fn, operands, inline)
    op_id = _REGISTRY.add(operation)
    _PUSHING.active = True
    try:
        _mxbase.check_call(_PUSH(
            _REGISTRY.trampoline, op_id, None, ctypes.byref(operands.context),
            operands.const_handles, operands.const_count, operands.mutable_handles,
            operands.mutable_count, None, priority, operands.name, False))
    except Exception:
        _REGISTRY.discard(op_id)
        raise
    finally:
        _PUSHING.active = False


def host_view(array: Any) -> np.ndarray:
    """A numpy view of a CPU NDArray's memory, without waiting for the engine.

    Its contents are only meaningful while an operation that holds the array (as const or
    mutable) runs; raises ValueError for GPU or sparse arrays. The view (and every slice of
    it, and every message frame made from one) keeps ``array`` alive, so its memory stays
    mapped for as long as anything can read it: a message kept for resending (PS_RESEND) may
    be read again after the operation completed and the caller dropped the array.
    """
    if array.context.device_type not in _CPU_TYPES:
        raise ValueError("host_view needs a CPU array, got one on %s" % array.context)
    if array.stype != "default":
        raise ValueError("host_view needs a dense array, got stype %r" % array.stype)
    dtype, shape = np.dtype(array.dtype), tuple(array.shape)
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if nbytes == 0:
        return np.empty(shape, dtype=dtype)
    raw = (ctypes.c_uint8 * nbytes).from_address(data_pointer(array))
    raw.owner = array     # numpy views keep ``raw`` as their base, and ``raw`` the array
    return np.frombuffer(raw, dtype=dtype).reshape(shape)


def data_pointer(array: Any) -> int:
    """Address of an NDArray's memory (one C call, no engine wait)."""
    pointer = ctypes.c_void_p()
    _mxbase.check_call(_mxbase._LIB.MXNDArrayGetData(array.handle, ctypes.byref(pointer)))
    return pointer.value or 0


def engine_errors_supported() -> bool:
    """Whether errors reach readers of the outputs through MXNet (else: raise_pending_error)."""
    return _REGISTRY._errors.supported


def raise_pending_error() -> None:
    """Raise the oldest error MXNet could not carry (only when engine errors are unsupported)."""
    error = _REGISTRY.pop_pending_error()
    if error is not None:
        raise error
