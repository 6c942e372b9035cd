"""The environment that selects a van in tests."""


def van_env(van: str) -> dict:
    """``DMLC_PS_VAN_TYPE=van``; byteps_rdma runs on the soft provider (no RDMA device here)."""
    env = {"DMLC_PS_VAN_TYPE": van}
    if van == "byteps_rdma":
        env["BYTEPS_RDMA_DEVICE"] = "soft"
    return env
