"""The one place that reads the environment: one variable at a time, parse failures turned
into ConfigError quoting the variable and the value, with this process's own defaults
(:func:`set_default`) for what the environment leaves unset. Nothing else in the package reads
``os.environ`` (tests/unit/test_layers.py checks it)."""
import os
from typing import Callable, Dict, Mapping, Optional, Sequence, TypeVar

from ..errors import ConfigError
from . import parsers

T = TypeVar("T")


#: This process's own defaults (:func:`set_default`): name -> text, read as if the variable
#: were set whenever the environment leaves it unset or empty.
_process_defaults: Dict[str, str] = {}


def set_default(name: str, text: str) -> None:
    """From now on this process's configs read ``name`` as ``text`` where ``os.environ`` leaves
    it unset or empty: what an API chooses for the ``dist_byteps`` store it creates (the store
    reads its own Config). Nothing is written into ``os.environ``, so the processes this one
    starts see the environment it was given. Validated as every value is, when read."""
    _process_defaults[name] = text


def _source(environ: Optional[Mapping[str, str]], only: Optional[Sequence[str]]):
    """``(environ, defaults)`` for an :class:`EnvReader`: this process's environment with its
    own defaults, or the given mapping alone; just the ``only`` names if given."""
    if environ is None:
        environ, defaults = os.environ, dict(_process_defaults)
    else:
        defaults = {}
    if only is not None:
        environ = {name: environ[name] for name in only if name in environ}
        defaults = {name: defaults[name] for name in only if name in defaults}
    return environ, defaults


class EnvReader:
    """Reads one variable at a time, turning parse failures into ConfigError."""

    def __init__(self, environ: Mapping[str, str], defaults: Optional[Mapping[str, str]] = None):
        self._environ = environ
        self._defaults = defaults or {}

    def get(self, name: str, parse: Callable[[str], T], default: T) -> T:
        text = self._environ.get(name)
        if text is None or text.strip() == "":
            text = self._defaults.get(name)
        if text is None or text.strip() == "":
            return default
        try:
            return parse(text.strip())
        except (ValueError, TypeError) as exc:
            raise ConfigError("%s=%r is invalid: %s" % (name, text, exc)) from None

    def flag(self, name: str, default: bool) -> bool:
        return self.get(name, parsers.flag, default)


def reader(environ: Optional[Mapping[str, str]], only: Optional[Sequence[str]]) -> "EnvReader":
    """The reader of ``environ`` (None: this process's environment with its own defaults),
    of just the ``only`` names if given."""
    return EnvReader(*_source(environ, only))


def env_flag(environ: Mapping[str, str], name: str, default: bool) -> bool:
    """The flag ``name`` of ``environ`` read as Config reads every flag (``1``/``true``/``yes``/
    ``on``, ``0``/``false``/``no``/``off``, any case; unset or empty: ``default``), for the
    few readers outside Config (bpslaunch). ConfigError quotes a bad value."""
    return EnvReader(environ).flag(name, default)


def env_int(environ: Mapping[str, str], name: str, default: Optional[int] = None,
            minimum: int = 0) -> Optional[int]:
    """The integer ``name`` of ``environ`` read as Config reads its integers (``minimum`` 0:
    as DMLC_WORKER_ID, 1: as DMLC_NUM_WORKER; unset or empty: ``default``), for the few
    readers outside Config (bpslaunch). ConfigError quotes a bad value."""
    parser = {0: parsers.nonnegative_int, 1: parsers.positive_int}[minimum]
    return EnvReader(environ).get(name, parser, default)

