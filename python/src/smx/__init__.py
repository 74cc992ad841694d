"""Client of smx's local API (`smx serve`): create sandboxes (microVMs behind a
host-side permission gateway), run commands with streamed output, copy files,
snapshot and fork them, and read their verified logs.

    import smx
    c = smx.Client()                       # $SMX_HOME/smx.sock
    sb = c.create("dev", start=True)       # created and booted
    code = c.exec("dev", ["sh", "-c", "echo hi"], stdout=sys.stdout.buffer.write)
    c.remove("dev", force=True)

smx.AsyncClient has the same methods for asyncio. Standard library only.
"""

from .aio import AsyncClient, AsyncExecSession
from .client import Client, ExecSession, ExitStatus, default_socket
from .errors import (
    Denied,
    ExecStartError,
    Exists,
    FailedPrecondition,
    InUse,
    Invalid,
    NotFound,
    SmxError,
    Unavailable,
)

__version__ = "0.1.0"

__all__ = [
    "AsyncClient",
    "AsyncExecSession",
    "Client",
    "Denied",
    "ExecSession",
    "ExecStartError",
    "Exists",
    "ExitStatus",
    "FailedPrecondition",
    "InUse",
    "Invalid",
    "NotFound",
    "SmxError",
    "Unavailable",
    "default_socket",
]
