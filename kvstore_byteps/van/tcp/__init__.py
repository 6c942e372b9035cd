"""byteps_tcp: our TCP van and its pure parts (framing, reading, writing, receive buffers, claims)."""
