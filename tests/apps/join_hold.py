"""A test's hold of an elastic job's end until its late worker asks to join
(``HOLD_FOR_JOIN=<file>``), for the test apps: a restarted or fifth worker whose start takes
longer than the others' training (MXNet's import on a loaded machine) would find no commit left
to join at, and the test would check the race instead of the join. The late worker makes the
file as its ``State()`` starts to ask; the others, at the commit that ``held(state)`` picks (two
or more commits before their last), wait for it (60 s at most), then half a second more for
its ask to reach server rank 0, and the late worker joins at one of their next commits."""
import os
import time

from kvstore_byteps.elastic import State

__all__ = ["install"]

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
            deadline = time.monotonic() + WAIT_S
            while not os.path.exists(path) and time.monotonic() < deadline:
                time.sleep(0.05)
            time.sleep(0.5)
        return commit(self)
    State._join, State.commit = asking, holding
