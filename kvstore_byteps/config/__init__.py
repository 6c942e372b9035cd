"""kvstore-byteps's settings, read from the environment in one place.

``Config.from_env()`` parses and validates every variable kvstore-byteps understands and
returns a frozen object; nothing else in the package reads ``os.environ`` (the launcher only
copies it into the environments of the processes it starts; tests/unit/test_layers.py checks
both). A bad value raises :class:`~kvstore_byteps.errors.ConfigError` quoting the variable and
the value.

Two small doors for code that needs less than a whole Config: :func:`env_flag` and
:func:`env_int` read one variable of a given mapping as Config reads it (bpslaunch reads the
environment it will hand to its children), and :func:`set_default` lets an API of this
process choose the default of a setting for the stores it creates (the BytePS and Horovod
APIs' ``djb2`` placement) without writing into ``os.environ``.

The parts, bottom up: ``vocabulary`` (the words a setting may take), ``variables`` (the
variables' names, :class:`Env`), ``training`` (the training mode and what it refuses),
``parsers`` (a value's text to the value), ``environment`` (the one reader, with this
process's defaults), ``readers`` (Config's fields a group of variables at a time) and
``settings`` (:class:`Config`).
"""
from ..errors import ConfigError
from .environment import env_flag, env_int, set_default
from .readers import default_server_summing_threads, usable_cores
from .settings import Config
from .training import TrainingMode
from .variables import Env
from .vocabulary import Role, ServerKind, Training, VanType

__all__ = ["Config", "ConfigError", "Env", "Role", "ServerKind", "Training", "TrainingMode",
           "VanType", "default_server_summing_threads", "env_flag", "env_int", "set_default",
           "usable_cores"]
