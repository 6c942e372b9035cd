"""Small helpers for the words of messages. Pure."""


def count(number: int, noun: str, plural: str = "") -> str:
    """``number`` and ``noun``, made plural unless it is one: ``1 worker``, ``2 workers``,
    ``0 servers``; ``plural`` where adding ``s`` is wrong (``count(2, "process", "processes")``).
    The noun's last word is the one that changes: ``count(1, "backup worker")``."""
    return "%d %s" % (number, noun if number == 1 else plural or noun + "s")
