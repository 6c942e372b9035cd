"""kvstore-byteps: a BytePS parameter-server communication layer for unmodified MXNet 1.9.1."""
from . import compiled as _compiled

_compiled.honour_environment()     # before any compiled module is imported

from .errors import TrainingOver  # noqa: E402
from .training import finish_training  # noqa: E402
from . import elastic  # noqa: E402  (kvstore_byteps.elastic.State)

__version__ = "0.2.0"
__all__ = ["TrainingOver", "elastic", "finish_training"]
