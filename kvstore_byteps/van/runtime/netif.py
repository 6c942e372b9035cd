"""Choosing the address a node advertises (ps-lite's rules, spec §3.1)."""
import fcntl
import socket
import struct
from typing import Optional

from ...errors import ConfigError

_SIOCGIFADDR = 0x8915


def interface_ipv4(name: str) -> Optional[str]:
    """IPv4 address of interface ``name`` or None when it has none."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        try:
            packed = fcntl.ioctl(sock.fileno(), _SIOCGIFADDR,
                                 struct.pack("256s", name.encode()[:15]))
        except OSError:
            return None
    return socket.inet_ntoa(packed[20:24])


def choose_host(node_host: Optional[str], interface: Optional[str]) -> str:
    """``DMLC_NODE_HOST`` verbatim, else the first IPv4 of an interface whose name starts with
    ``DMLC_INTERFACE``, else the first non-loopback IPv4 interface (127.0.0.1 if none)."""
    if node_host:
        return node_host
    names = [name for _, name in socket.if_nameindex()]
    if interface:
        for name in names:
            address = name.startswith(interface) and interface_ipv4(name)
            if address:
                return address
        raise ConfigError("DMLC_INTERFACE=%r matches no interface with an IPv4 address "
                          "(interfaces: %s)" % (interface, ", ".join(names)))
    for name in names:
        address = interface_ipv4(name)
        if address and not address.startswith("127."):
            return address
    return "127.0.0.1"

