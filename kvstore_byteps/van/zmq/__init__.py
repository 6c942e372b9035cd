"""The ZeroMQ van (MXNet's own transport) and its CURVE authentication."""
