"""ps-lite's P3 van: ZeroMQ's wire, sends ordered by priority."""
