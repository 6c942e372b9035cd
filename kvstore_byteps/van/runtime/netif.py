"""The address a server or worker advertises: its host chosen by ps-lite's rules (spec §3.1),
its port bound by the van."""
import fcntl
import socket
import struct
from typing import Optional

from ...config import Config, Role
from ...errors import ConfigError
from ...ports import free_port
from ..wire.message import K_EMPTY, Node

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


def bind_node(config: Config, van) -> Node:
    """This server's or worker's node, bound by ``van`` and as it advertises it: the host of
    :func:`choose_host`, the port of ``PORT`` or else a free one (retried if taken meanwhile);
    a worker asks for the rank of ``DMLC_WORKER_ID``."""
    if not config.root_port:
        raise ConfigError("DMLC_PS_ROOT_PORT must be set (the scheduler's port)")
    host = choose_host(config.node_host, config.interface)
    hint = config.worker_id if config.role is Role.WORKER else None
    me = Node(config.role, K_EMPTY, host, config.port or free_port(""), rank_hint=hint)
    if config.port:     # asked for by the user: another port would surprise them
        try:
            me.port = van.bind(me, max_retry=0)
        except ConfigError as exc:
            raise ConfigError("PORT=%d: %s (unset PORT to let the node pick a free one)"
                              % (config.port, exc)) from None
    else:            # our pick may have been taken meanwhile: retry with others
        me.port = van.bind(me, max_retry=40)
    return van.advertise(me)
