"""The parsers of variables' values: text in, a value out, ValueError saying what was
expected (the reader quotes the variable and the value around it). Pure."""
from .vocabulary import ServerKind, VanType


def flag(text: str) -> bool:
    lowered = text.lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise ValueError("expected 0/1/true/false")


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise ValueError("expected an integer") from None



def positive_int(text: str) -> int:
    value = _int(text)
    if value <= 0:
        raise ValueError("expected a positive integer")
    return value


def nonnegative_int(text: str) -> int:
    value = _int(text)
    if value < 0:
        raise ValueError("expected a non-negative integer")
    return value


def percent(text: str) -> int:
    value = _int(text)
    if not 0 <= value <= 100:
        raise ValueError("expected a percentage in [0, 100]")
    return value


def port(text: str) -> int:
    value = _int(text)
    if not 1 <= value <= 65535:
        raise ValueError("expected a TCP port in [1, 65535]")
    return value


def _float(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise ValueError("expected a number") from None


def positive_float(text: str) -> float:
    value = _float(text)
    if not value > 0:
        raise ValueError("expected a positive number")
    return value


def nonnegative_float(text: str) -> float:
    value = _float(text)
    if not value >= 0:
        raise ValueError("expected a non-negative number")
    return value


def nonempty(text: str) -> str:
    return text


def van_type(text: str) -> VanType:
    aliases = {"auto": VanType.AUTO, "zmq": VanType.ZMQ, "p3": VanType.P3,
               "byteps_tcp": VanType.BYTEPS_TCP,
               "byteps_rdma": VanType.BYTEPS_RDMA, "rdma": VanType.BYTEPS_RDMA}
    try:
        return aliases[text.lower()]
    except KeyError:
        raise ValueError("expected one of auto, zmq, p3, byteps_tcp, byteps_rdma") from None


def server_kind(text: str) -> ServerKind:
    try:
        return ServerKind(text.lower())
    except ValueError:
        raise ValueError("expected byteps or mxnet") from None


def choice(choices):
    def parse(text: str) -> str:
        if text not in choices:
            raise ValueError("expected one of %s" % ", ".join(choices))
        return text
    return parse


def upper_choice(choices):
    """Like :func:`choice`, in any case (``info`` reads as ``INFO``)."""
    parse = choice(choices)
    return lambda text: parse(text.upper())
