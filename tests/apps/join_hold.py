"""The test apps' holds of an elastic job's end for a late worker, so that a test checks what
it means to, not a race with the machine's load (MXNet's import may take seconds):

* ``HOLD_FOR_JOIN=<file>`` (:func:`install`): the late worker joins. It makes the file as its
  ``State()`` starts to ask; the others, at the commit that ``held(state)`` picks (two or more
  commits before their last), wait for it, then half a second more for its ask to reach
  server rank 0, and the late worker joins at one of their next commits.
* ``HOLD_END_FOR=<file>`` (:func:`asking`, :func:`end`): the late worker does not join. It
  makes the file (then sleeps ``HOLD_END_PAUSE`` seconds) before its ``State()``; the others
  end their program, with no commit after their loop, only once the file is there and a
  second more has passed."""
import os
import time

from kvstore_byteps.elastic import State

__all__ = ["asking", "end", "install"]

#: the longest the others wait for the late worker's ask
WAIT_S = 60.0


def install(held) -> None:
    """With HOLD_FOR_JOIN set, hold the workers that started with the job at the commit where
    ``held(state)`` is true until the late worker asks to join."""
    path = os.environ.get("HOLD_FOR_JOIN")
    if not path:
        return
    join, commit = State._join, State.commit

    def asking(self, joins):
        open(path, "w").close()
        return join(self, joins)

    def holding(self):
        if not self.joined_late and held(self) and not os.path.exists(path):
            _wait_for(path)
            time.sleep(0.5)
        return commit(self)
    State._join, State.commit = asking, holding


def asking() -> None:
    """With HOLD_END_FOR set, on the late worker before its ``State()``: make the file, then
    sleep HOLD_END_PAUSE seconds (the others end meanwhile)."""
    path = os.environ.get("HOLD_END_FOR")
    if path:
        open(path, "w").close()
        time.sleep(float(os.environ.get("HOLD_END_PAUSE", "0")))


def end() -> None:
    """With HOLD_END_FOR set, on the others after their loop: wait for the file, then a
    second more (the late worker asks to join meanwhile)."""
    path = os.environ.get("HOLD_END_FOR")
    if path:
        _wait_for(path)
        time.sleep(1.0)


def _wait_for(path: str) -> None:
    """Until ``path`` exists, WAIT_S at most."""
    deadline = time.monotonic() + WAIT_S
    while not os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.05)
