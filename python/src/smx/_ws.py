"""A minimal WebSocket (RFC 6455) client codec: what the exec stream needs."""

from __future__ import annotations

import base64
import hashlib
import os
import struct
from typing import Dict, Optional, Tuple

GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
OP_CONT, OP_TEXT, OP_BINARY, OP_CLOSE, OP_PING, OP_PONG = 0x0, 0x1, 0x2, 0x8, 0x9, 0xA
SUBPROTOCOL = "smx.exec.v1"


def handshake(path: str, host: str, token: Optional[str]) -> Tuple[bytes, str]:
    """The upgrade request and the Sec-WebSocket-Accept value to expect."""
    key = base64.b64encode(os.urandom(16)).decode()
    lines = [
        f"GET {path} HTTP/1.1",
        f"Host: {host}",
        "Upgrade: websocket",
        "Connection: Upgrade",
        f"Sec-WebSocket-Key: {key}",
        "Sec-WebSocket-Version: 13",
        f"Sec-WebSocket-Protocol: {SUBPROTOCOL}",
    ]
    if token:
        lines.append(f"Authorization: Bearer {token}")
    accept = base64.b64encode(hashlib.sha1((key + GUID).encode()).digest()).decode()
    return ("\r\n".join(lines) + "\r\n\r\n").encode(), accept


def parse_head(head: bytes) -> Tuple[int, Dict[str, str]]:
    """Status code and lower-cased headers of an HTTP response head."""
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ", 2)[1])
    headers: Dict[str, str] = {}
    for line in lines[1:]:
        if ":" in line:
            k, v = line.split(":", 1)
            headers[k.strip().lower()] = v.strip()
    return status, headers


def encode(opcode: int, payload: bytes) -> bytes:
    """One final, masked client frame."""
    n = len(payload)
    head = bytearray([0x80 | opcode])
    if n < 126:
        head.append(0x80 | n)
    elif n < 1 << 16:
        head.append(0x80 | 126)
        head += struct.pack("!H", n)
    else:
        head.append(0x80 | 127)
        head += struct.pack("!Q", n)
    mask = os.urandom(4)
    head += mask
    # XOR with the mask, a word at a time through int arithmetic.
    m = (mask * (n // 4 + 1))[:n]
    masked = (int.from_bytes(payload, "big") ^ int.from_bytes(m, "big")).to_bytes(n, "big") if n else b""
    return bytes(head) + masked


def header_len(first2: bytes) -> Tuple[bool, int, int, int]:
    """fin, opcode, extra header bytes to read, and the 7-bit length."""
    b0, b1 = first2[0], first2[1]
    fin, opcode, masked, n = bool(b0 & 0x80), b0 & 0x0F, bool(b1 & 0x80), b1 & 0x7F
    extra = (2 if n == 126 else 8 if n == 127 else 0) + (4 if masked else 0)
    return fin, opcode, extra, n


def payload_len(n: int, ext: bytes) -> Tuple[int, bytes]:
    """The payload length and the mask key (empty from a server)."""
    if n == 126:
        n, ext = struct.unpack("!H", ext[:2])[0], ext[2:]
    elif n == 127:
        n, ext = struct.unpack("!Q", ext[:8])[0], ext[8:]
    return n, ext


def unmask(data: bytes, key: bytes) -> bytes:
    if not key:
        return data
    return bytes(b ^ key[i % 4] for i, b in enumerate(data))
