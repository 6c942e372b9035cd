"""The environment that selects a van in tests."""


def van_env(van: str) -> dict:
    """``DMLC_PS_VAN_TYPE=van``; "auto": unset, as users leave it; byteps_rdma runs on the soft
    provider (no RDMA device here)."""
    env = {} if van == "auto" else {"DMLC_PS_VAN_TYPE": van}
    if van == "byteps_rdma":
        env["BYTEPS_RDMA_DEVICE"] = "soft"
    return env

