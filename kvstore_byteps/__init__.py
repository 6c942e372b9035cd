"""kvstore-byteps: a BytePS parameter-server communication layer for unmodified MXNet 1.9.1."""

__version__ = "0.1.0"
