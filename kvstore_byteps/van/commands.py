"""SimpleApp command ids shared by workers and servers (MXNet's, spec §5.3, plus ours)."""
import enum


class Command(enum.IntEnum):
    """``Meta.head`` of a SimpleApp command a worker sends to every server."""

    CONTROLLER = 0                 # body: pickle.dumps(optimizer, 0)
    SET_MULTI_PRECISION = 1
    STOP_SERVER = 2
    SYNC_MODE = 3
    SET_GRADIENT_COMPRESSION = 4   # body: "<type>[,<threshold>]"
    SET_PROFILER_PARAMS = 5
    #: ours: "which server are you?" BytePSServer answers PROBE_ANSWER; upstream MXNet's server
    #: ignores unknown commands and answers with an empty body.
    BYTEPS_PROBE = 100


PROBE_ANSWER = b"byteps"
