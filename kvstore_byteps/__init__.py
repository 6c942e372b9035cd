"""kvstore-byteps: a BytePS parameter-server communication layer for unmodified MXNet 1.9.1."""
from .errors import TrainingOver
from .training import finish_training

__version__ = "0.1.0"
__all__ = ["TrainingOver", "finish_training"]
