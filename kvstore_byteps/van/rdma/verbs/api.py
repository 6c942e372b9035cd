"""The narrow verbs interface the byteps_rdma van uses, and its two providers' common types.

Only what a reliable-connected (RC) van needs: a device context, protection domains, memory
regions, completion queues, queue pairs with their INIT -> RTR -> RTS transitions, and
``post_send`` / ``post_recv`` / ``poll``. Names follow ibverbs (``ibv_*``). Two providers
implement it: ``pyverbs`` (real devices, :mod:`.pyverbs_provider`) and ``soft`` (in-host,
strict, for tests: :mod:`.soft`).

The semantics the van may rely on, and which the soft provider enforces (hardware does too):

* a QP posts sends only in RTS, receives in INIT, RTR or RTS; other transitions than
  RESET -> INIT -> RTR -> RTS (and any -> ERROR or RESET) are refused;
* at most ``max_send_wr`` sends and ``max_recv_wr`` receives outstanding per QP (a send is
  outstanding until a later signaled completion of that QP retires it);
* every scatter/gather element lies inside the memory region its ``lkey`` names; remote
  writes need ``rkey``'s region to be registered with REMOTE_WRITE, to cover the range, and the
  target QP to allow remote writes;
* a SEND or RDMA_WRITE_WITH_IMM consumes one posted receive at the target; with none posted the
  sender's work request fails with RNR_RETRY_EXC_ERR (the soft provider retries zero times)
  and the QP goes to ERROR; a receive too small for a SEND fails both sides;
* completions of one QP arrive in posting order; a QP in ERROR completes everything
  outstanding with WR_FLUSH_ERR.

A completion queue's ``fileno()`` is a descriptor that becomes readable after ``req_notify``
once a completion comes (``ack_events`` consumes it), or None where the provider has none to
give (pyverbs of rdma-core < 46): the van then polls.
"""
import dataclasses
import enum
from typing import List, Optional


class VerbsError(Exception):
    """A verbs call was refused (what ibverbs reports with an errno)."""


class Access(enum.IntFlag):
    """Memory region and queue pair access flags (``IBV_ACCESS_*``)."""

    LOCAL_WRITE = 1
    REMOTE_WRITE = 2
    REMOTE_READ = 4


class QPState(enum.Enum):
    RESET = "RESET"
    INIT = "INIT"
    RTR = "RTR"
    RTS = "RTS"
    ERROR = "ERROR"


class Opcode(enum.Enum):
    """Send work request opcodes (``IBV_WR_*``) used by the van."""

    SEND = "SEND"
    SEND_WITH_IMM = "SEND_WITH_IMM"
    RDMA_WRITE = "RDMA_WRITE"
    RDMA_WRITE_WITH_IMM = "RDMA_WRITE_WITH_IMM"


class WCOpcode(enum.Enum):
    """What a completion completes (``IBV_WC_*``)."""

    SEND = "SEND"
    RDMA_WRITE = "RDMA_WRITE"
    RECV = "RECV"
    RECV_RDMA_WITH_IMM = "RECV_RDMA_WITH_IMM"


class WCStatus(enum.Enum):
    """Completion status (``IBV_WC_*``); anything but SUCCESS moved the QP to ERROR."""

    SUCCESS = "SUCCESS"
    LOC_LEN_ERR = "LOC_LEN_ERR"
    LOC_PROT_ERR = "LOC_PROT_ERR"
    REM_ACCESS_ERR = "REM_ACCESS_ERR"
    REM_INV_REQ_ERR = "REM_INV_REQ_ERR"
    RNR_RETRY_EXC_ERR = "RNR_RETRY_EXC_ERR"
    RETRY_EXC_ERR = "RETRY_EXC_ERR"
    WR_FLUSH_ERR = "WR_FLUSH_ERR"
    OTHER_ERR = "OTHER_ERR"            # any other IBV_WC_* error a device reports


@dataclasses.dataclass(frozen=True)
class SGE:
    """One scatter/gather element: ``length`` bytes at address ``addr`` of region ``lkey``."""

    addr: int
    length: int
    lkey: int


@dataclasses.dataclass(frozen=True)
class SendWR:
    wr_id: int
    opcode: Opcode
    sg_list: List[SGE]
    remote_addr: int = 0
    rkey: int = 0
    imm_data: Optional[int] = None     # a 32-bit value for the *_WITH_IMM opcodes
    signaled: bool = True


@dataclasses.dataclass(frozen=True)
class RecvWR:
    wr_id: int
    sg_list: List[SGE]


@dataclasses.dataclass(frozen=True)
class Completion:
    """One work completion (``ibv_wc``)."""

    wr_id: int
    status: WCStatus
    opcode: Optional[WCOpcode]         # None on a failed completion (undefined in ibverbs)
    qp_num: int
    byte_len: int = 0
    imm_data: Optional[int] = None


@dataclasses.dataclass(frozen=True)
class QPCaps:
    """A queue pair's limits (``ibv_qp_cap``)."""

    max_send_wr: int = 128
    max_recv_wr: int = 128
    max_sge: int = 1


@dataclasses.dataclass(frozen=True)
class Endpoint:
    """What a peer needs to connect its QP to ours (exchanged over the control channel): the
    device's address (a GID for RoCE/InfiniBand, a socket path for ``soft``) and the QP number."""

    address: str
    qp_num: int
