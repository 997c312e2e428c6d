"""gflowdist: asynchronous actor / learner / replay-buffer training on MPI and torch.distributed."""

from gflowdist.errors import (
    ConfigError,
    DeadlineError,
    GflowdistError,
    LayoutError,
    LedgerError,
    PeerLostError,
    ProtocolError,
    TransportError,
)

__version__ = "0.1.0"
