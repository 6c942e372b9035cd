"""The in-memory van for tests: nodes of one process joined without sockets."""
