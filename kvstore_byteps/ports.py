"""Free TCP ports: the one helper for launcher, nodes, benchmarks and tests. Imports nothing of ours."""
import socket

__all__ = ["free_port"]


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port on ``host`` that is free now (ps-lite's way: bind a throw-away socket to port
    0 and read the port the OS chose; ``""``: every interface). Whoever asked binds it moments
    later."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]
