"""Callbacks of the KV layer that the postoffice's receive thread runs on a membership event
(a restarted server, a worker that left): one that raises is logged, the others still run."""
import logging
from typing import Callable, List

log = logging.getLogger(__name__)

__all__ = ["Hooks"]


class Hooks:
    """The callbacks registered for one kind of event (``what``, for the log)."""

    def __init__(self, what: str):
        self._what = what
        self._hooks: List[Callable] = []

    def add(self, hook: Callable) -> None:
        self._hooks.append(hook)

    def run(self, *args) -> None:
        for hook in list(self._hooks):
            try:
                hook(*args)
            except Exception:
                log.exception("a %s hook failed", self._what)
