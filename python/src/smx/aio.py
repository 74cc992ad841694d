"""The asyncio client of `smx serve` (standard library only)."""

from __future__ import annotations

import asyncio
import json
from typing import Any, AsyncIterator, Callable, Dict, List, Optional, Tuple, Union, cast
from urllib.parse import quote, urlencode

from . import _ws
from .client import ExitStatus, _exec_message, _sandbox_path, default_socket
from .errors import SmxError, error_from
from .types import (Agent, AgentEvent, AgentRequest, Approval, ApprovalDecision, CheckRequest, CheckResult, CreateRequest, Credential, CredentialRequest,
                    DoctorReport, Event, ExecRequest, ExecResult, Explanation, ExplainRequest, ForkRequest, Image, ImageRequest,
                    Kernel, KernelBuildRequest, LoginRequest, LoginResult, LogPruneRequest, MountList, MountRequest, PolicyRequest, PolicyResult, PortList, PortRequest, Profile, PullRequest, PullResult, PushRequest, PushResult, Record, Sandbox, Snapshot,
                    SnapshotRequest, SSHCA, VerifyReport, _body)

Sink = Optional[Callable[[bytes], Any]]


class _Response:
    def __init__(self, status: int, headers: Dict[str, str], reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.status, self.headers, self._r, self._w = status, headers, reader, writer
        self._chunked = "chunked" in headers.get("transfer-encoding", "")
        self._left = int(headers.get("content-length", "-1"))
        self._buf = b""
        self._eof = False

    async def _more(self) -> bytes:
        """The next piece of the body, b"" at its end."""
        if self._eof:
            return b""
        if self._chunked:
            size = int((await self._r.readline()).split(b";")[0].strip() or b"0", 16)
            if size == 0:
                await self._r.readline()
                self._eof = True
                return b""
            data = await self._r.readexactly(size)
            await self._r.readexactly(2)
            return data
        if self._left >= 0:
            if self._left == 0:
                self._eof = True
                return b""
            data = await self._r.read(min(self._left, 64 << 10))
            if not data:
                raise ConnectionError("smx api: answer cut short")
            self._left -= len(data)
            return data
        data = await self._r.read(64 << 10)
        if not data:
            self._eof = True
        return data

    async def read(self) -> bytes:
        parts = [self._buf]
        self._buf = b""
        while True:
            d = await self._more()
            if not d:
                return b"".join(parts)
            parts.append(d)

    async def lines(self) -> AsyncIterator[bytes]:
        while True:
            i = self._buf.find(b"\n")
            if i >= 0:
                line, self._buf = self._buf[:i], self._buf[i + 1:]
                yield line
                continue
            d = await self._more()
            if not d:
                if self._buf:
                    yield self._buf
                return
            self._buf += d

    def close(self) -> None:
        self._w.close()


class AsyncExecSession:
    """A process running in a sandbox (see smx.ExecSession), for asyncio."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._r, self._w = reader, writer
        self._lock = asyncio.Lock()
        self.pid = 0
        self.status: Optional[ExitStatus] = None

    async def _send(self, opcode: int, payload: bytes) -> None:
        async with self._lock:
            self._w.write(_ws.encode(opcode, payload))
            await self._w.drain()

    async def _control(self, **m: Any) -> None:
        await self._send(_ws.OP_TEXT, json.dumps(m).encode())

    async def send(self, data: bytes) -> None:
        for i in range(0, len(data), 32 << 10):
            await self._send(_ws.OP_BINARY, data[i:i + (32 << 10)])

    async def close_stdin(self) -> None:
        await self._control(type="stdin_eof")

    async def signal(self, sig: int) -> None:
        await self._control(type="signal", signal=int(sig))

    async def resize(self, rows: int, cols: int) -> None:
        await self._control(type="resize", rows=rows, cols=cols)

    async def _message(self) -> Tuple[int, bytes]:
        parts: List[bytes] = []
        first_op = -1
        while True:
            fin, opcode, extra, n = _ws.header_len(await self._r.readexactly(2))
            n, key = _ws.payload_len(n, await self._r.readexactly(extra) if extra else b"")
            data = _ws.unmask(await self._r.readexactly(n) if n else b"", key)
            if opcode == _ws.OP_PING:
                await self._send(_ws.OP_PONG, data)
                continue
            if opcode == _ws.OP_PONG:
                continue
            if opcode == _ws.OP_CLOSE:
                return opcode, data
            if first_op < 0:
                first_op = opcode
            parts.append(data)
            if fin:
                return first_op, b"".join(parts)

    async def output(self) -> AsyncIterator[Tuple[str, bytes]]:
        """("stdout"|"stderr", bytes) chunks as they come, until the process ends."""
        while self.status is None:
            try:
                opcode, data = await self._message()
            except asyncio.IncompleteReadError:
                raise ConnectionError("smx api: exec: connection lost before the process exited") from None
            if opcode == _ws.OP_CLOSE:
                raise ConnectionError("smx api: exec: the server closed the stream before the exit status")
            if opcode == _ws.OP_BINARY:
                if data:
                    yield ("stderr" if data[0] == 2 else "stdout"), data[1:]
                continue
            m = json.loads(data)
            if m["type"] == "started":
                self.pid = m.get("pid", 0)
            elif m["type"] == "exit":
                self.status = ExitStatus((m.get("code", 0), m.get("signal", 0)))
            elif m["type"] == "error":
                await self.close()
                raise error_from(0, data, m.get("class"))
        await self.close()

    async def wait(self, stdout: Sink = None, stderr: Sink = None) -> ExitStatus:
        async for stream, data in self.output():
            sink = stderr if stream == "stderr" else stdout
            if sink is not None:
                sink(data)
        assert self.status is not None
        return self.status

    async def close(self) -> None:
        if self._w.is_closing():
            return
        try:
            self._w.write(_ws.encode(_ws.OP_CLOSE, b"\x03\xe8"))
        except OSError:
            pass
        self._w.close()

    async def __aenter__(self) -> "AsyncExecSession":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()


class AsyncClient:
    """The asyncio twin of smx.Client: same methods, awaited; logs() and
    events() are async iterators."""

    def __init__(self, socket_path: Optional[str] = None, *, tcp: Optional[Tuple[str, int]] = None,
                 token: Optional[str] = None) -> None:
        self.socket_path = socket_path or default_socket()
        self.tcp = tcp
        self.token = token

    async def _connect(self) -> Tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        if self.tcp:
            return await asyncio.open_connection(self.tcp[0], self.tcp[1], limit=1 << 22)
        return await asyncio.open_unix_connection(self.socket_path, limit=1 << 22)

    async def _head(self, reader: asyncio.StreamReader) -> Tuple[int, Dict[str, str]]:
        head = await reader.readuntil(b"\r\n\r\n")
        return _ws.parse_head(head)

    async def _open(self, method: str, path: str, query: Optional[Dict[str, Any]] = None, body: Any = None,
                    content_type: Optional[str] = None) -> _Response:
        if query:
            q = {k: ("true" if v is True else "false" if v is False else v) for k, v in query.items() if v is not None}
            if q:
                path += "?" + urlencode(q, doseq=True)
        data = b""
        if body is not None:
            if content_type is None:
                data, content_type = json.dumps(body).encode(), "application/json"
            else:
                data = body
        lines = [f"{method} {path} HTTP/1.1", "Host: smx", "Connection: close", f"Content-Length: {len(data)}"]
        if content_type:
            lines.append(f"Content-Type: {content_type}")
        if self.token:
            lines.append(f"Authorization: Bearer {self.token}")
        reader, writer = await self._connect()
        writer.write(("\r\n".join(lines) + "\r\n\r\n").encode() + data)
        await writer.drain()
        status, headers = await self._head(reader)
        resp = _Response(status, headers, reader, writer)
        if status >= 300:
            b = await resp.read()
            resp.close()
            raise error_from(status, b)
        return resp

    async def _json(self, method: str, path: str, query: Optional[Dict[str, Any]] = None, body: Any = None) -> Any:
        resp = await self._open(method, path, query, body)
        try:
            data = await resp.read()
        finally:
            resp.close()
        return json.loads(data) if data else None

    async def _lines(self, path: str, query: Dict[str, Any]) -> AsyncIterator[Any]:
        resp = await self._open("GET", path, query)
        try:
            async for line in resp.lines():
                if line.strip():
                    yield json.loads(line)
        finally:
            resp.close()

    async def run_agent(self, preset: str, workspace: str, *, args: Optional[List[str]] = None, name: Optional[str] = None,
                        profile: Optional[str] = None, cpus: Optional[int] = None, memory: Optional[str] = None,
                        disk: Optional[str] = None, mounts: Optional[List[str]] = None, caches: Optional[List[str]] = None, remove: bool = False,
                        accel: Optional[str] = None, ports: Optional[List[str]] = None,
                        publish_external: bool = False, timeout: Optional[str] = None,
                        idle_stop: Optional[str] = None, term: Optional[str] = None,
                        cold: bool = False, import_config: bool = False, docker: bool = False,
                        progress: Optional[Callable[[AgentEvent], Any]] = None) -> Agent:
        """Client.run_agent for asyncio."""
        body = _body(AgentRequest, preset=preset, workspace=workspace, args=args, name=name, profile=profile,
                     cpus=cpus, memory=memory, disk=disk, accel=accel, mounts=mounts, caches=caches, ports=ports,
                     publish_external=publish_external or None, timeout=timeout, idle_stop=idle_stop,
                     cold=cold or None, term=term, remove=remove or None,
                     import_config=import_config or None, docker=docker or None)
        resp = await self._open("POST", "/v1/agents", body=body)
        try:
            async for line in resp.lines():
                if not line.strip():
                    continue
                ev = cast(AgentEvent, json.loads(line))
                if ev["type"] == "agent" and "agent" in ev:
                    return ev["agent"]
                if ev["type"] == "error":
                    raise error_from(0, json.dumps(ev.get("error", {})).encode())
                if progress is not None:
                    progress(ev)
        finally:
            resp.close()
        raise SmxError(0, "internal", "POST /v1/agents: the answer ended before the agent started")

    async def agent(self, name: str) -> Agent:
        """Client.agent for asyncio."""
        return cast(Agent, await self._json("GET", "/v1/agents/" + quote(name, safe="")))

    async def info(self) -> Dict[str, str]:
        return cast(Dict[str, str], await self._json("GET", "/v1/info"))

    async def images(self) -> List[Image]:
        return cast(List[Image], await self._json("GET", "/v1/images"))

    async def build_image(self, name: str, *, from_: Optional[str] = None, packages: Optional[List[str]] = None,
                          ref: Optional[str] = None) -> Image:
        body = _body(ImageRequest, name=name, **{"from": from_ or None}, packages=packages or None, ref=ref or None)
        return cast(Image, await self._json("POST", "/v1/images", body=body))

    async def inspect_image(self, name: str) -> Image:
        return cast(Image, await self._json("GET", "/v1/images/" + quote(name, safe="")))

    async def remove_image(self, name: str) -> None:
        await self._json("DELETE", "/v1/images/" + quote(name, safe=""))

    async def creds(self) -> List[Credential]:
        return cast(List[Credential], await self._json("GET", "/v1/creds"))

    async def set_cred(self, name: str, value: Union[str, bytes]) -> Credential:
        v = value.decode() if isinstance(value, bytes) else value
        return cast(Credential, await self._json("PUT", "/v1/creds/" + quote(name, safe=""), body=_body(CredentialRequest, value=v)))

    async def remove_cred(self, name: str) -> None:
        await self._json("DELETE", "/v1/creds/" + quote(name, safe=""))

    async def login(self, preset: str, *, key: Optional[str] = None, import_: bool = False,
                    file: Optional[str] = None) -> LoginResult:
        body = _body(LoginRequest, preset=preset, key=key or None, file=file or None, **{"import": import_ or None})
        return cast(LoginResult, await self._json("POST", "/v1/creds/login", body=body))

    async def ssh_ca(self) -> SSHCA:
        return cast(SSHCA, await self._json("GET", "/v1/ssh-ca"))

    async def rotate_ssh_ca(self) -> SSHCA:
        return cast(SSHCA, await self._json("POST", "/v1/ssh-ca/rotate"))

    async def kernels(self) -> List[Kernel]:
        return cast(List[Kernel], await self._json("GET", "/v1/kernels"))

    async def build_kernel(self, *, jobs: int = 0, nice: bool = False, work_dir: Optional[str] = None) -> Kernel:
        body = _body(KernelBuildRequest, jobs=jobs or None, nice=nice or None, work_dir=work_dir or None)
        return cast(Kernel, await self._json("POST", "/v1/kernels", body=body))

    async def remove_kernel(self, version: str) -> None:
        await self._json("DELETE", "/v1/kernels/" + quote(version, safe=""))

    async def doctor(self) -> DoctorReport:
        return cast(DoctorReport, await self._json("GET", "/v1/doctor"))

    async def templates(self) -> List[Snapshot]:
        return cast(List[Snapshot], await self._json("GET", "/v1/templates"))

    async def remove_template(self, name: str) -> None:
        await self._json("DELETE", "/v1/templates/" + quote(name, safe=""))

    async def push_template(self, name: str, ref: str, *, compress: Optional[str] = None, with_kernel: bool = False) -> PushResult:
        body = _body(PushRequest, ref=ref, compress=compress, with_kernel=with_kernel or None)
        return cast(PushResult, await self._json("POST", "/v1/templates/" + quote(name, safe="") + "/push", body=body))

    async def pull_template(self, ref: str, *, keys: Optional[List[str]] = None) -> PullResult:
        body = _body(PullRequest, ref=ref, keys=keys or None)
        return cast(PullResult, await self._json("POST", "/v1/templates/pull", body=body))

    async def push_snapshot(self, name: str, ref: str, *, compress: Optional[str] = None, with_kernel: bool = False) -> PushResult:
        body = _body(PushRequest, ref=ref, compress=compress, with_kernel=with_kernel or None)
        return cast(PushResult, await self._json("POST", "/v1/snapshots/" + quote(name, safe="") + "/push", body=body))

    async def pull_snapshot(self, ref: str, *, name: Optional[str] = None, keys: Optional[List[str]] = None) -> PullResult:
        body = _body(PullRequest, ref=ref, name=name, keys=keys or None)
        return cast(PullResult, await self._json("POST", "/v1/snapshots/pull", body=body))

    async def log_names(self) -> List[str]:
        return cast(List[str], await self._json("GET", "/v1/logs"))

    async def prune_logs(self, names: Optional[List[str]] = None, *, all: bool = False) -> List[str]:
        body = _body(LogPruneRequest, names=names or None, all=None if names else all)
        return cast(List[str], (await self._json("POST", "/v1/logs/prune", body=body))["pruned"])

    async def list(self) -> List[Sandbox]:
        return cast(List[Sandbox], await self._json("GET", "/v1/sandboxes"))

    async def inspect(self, name: str) -> Sandbox:
        return cast(Sandbox, await self._json("GET", _sandbox_path(name)))

    async def create(self, name: Optional[str] = None, *, image: Optional[str] = None, profile: Optional[str] = None,
                     cpus: Optional[int] = None, memory: Optional[str] = None, disk: Optional[str] = None,
                     env: Optional[List[str]] = None, mounts: Optional[List[str]] = None, caches: Optional[List[str]] = None, start: bool = False,
                     cold: bool = False, ports: Optional[List[str]] = None, publish_external: bool = False,
                     timeout: Optional[str] = None, idle_stop: Optional[str] = None,
                     accel: Optional[str] = None) -> Sandbox:
        req = _body(CreateRequest, name=name, image=image, profile=profile, cpus=cpus, memory=memory, disk=disk,
                    accel=accel, env=env, mounts=mounts, caches=caches, ports=ports, publish_external=publish_external or None,
                    timeout=timeout, idle_stop=idle_stop, start=start or None, cold=cold or None)
        return cast(Sandbox, await self._json("POST", "/v1/sandboxes", body=req))

    async def start(self, name: str, cold: bool = False) -> Sandbox:
        return cast(Sandbox, await self._json("POST", _sandbox_path(name) + "/start", {"cold": cold or None}))

    async def stop(self, name: str, timeout: Optional[float] = None) -> Sandbox:
        q = {"timeout": f"{timeout}s"} if timeout is not None else None
        return cast(Sandbox, await self._json("POST", _sandbox_path(name) + "/stop", q))

    async def pause(self, name: str) -> Sandbox:
        return cast(Sandbox, await self._json("POST", _sandbox_path(name) + "/pause"))

    async def resume(self, name: str) -> Sandbox:
        return cast(Sandbox, await self._json("POST", _sandbox_path(name) + "/resume"))

    async def suspend(self, name: str) -> Sandbox:
        return cast(Sandbox, await self._json("POST", _sandbox_path(name) + "/suspend"))

    async def remove(self, name: str, force: bool = False) -> None:
        await self._json("DELETE", _sandbox_path(name), {"force": force})

    async def run(self, name: str, args: List[str], *, stdin: Optional[bytes] = None, env: Optional[List[str]] = None,
                  dir: Optional[str] = None, user: Optional[str] = None) -> ExecResult:
        req = _body(ExecRequest, args=list(args), stdin_data=stdin.decode() if stdin else None, env=env or None,
                    dir=dir or None, user=user or None)
        return cast(ExecResult, await self._json("POST", _sandbox_path(name) + "/exec", body=req))

    async def exec_session(self, name: str, args: List[str], *, stdin: bool = False, env: Optional[List[str]] = None,
                           dir: Optional[str] = None, user: Optional[str] = None, tty: bool = False,
                           rows: int = 0, cols: int = 0) -> AsyncExecSession:
        reader, writer = await self._connect()
        try:
            req, accept = _ws.handshake(_sandbox_path(name) + "/exec", "smx", self.token)
            writer.write(req)
            await writer.drain()
            status, headers = await self._head(reader)
            if status != 101:
                n = int(headers.get("content-length", "0"))
                raise error_from(status, await reader.readexactly(n) if n else b"")
            if headers.get("sec-websocket-accept") != accept:
                raise ConnectionError("smx api: exec: bad WebSocket accept")
            s = AsyncExecSession(reader, writer)
            await s._send(_ws.OP_TEXT, _exec_message(args, env, dir, user, tty, stdin, rows, cols))
            return s
        except BaseException:
            writer.close()
            raise

    async def exec(self, name: str, args: List[str], *, stdin: Optional[bytes] = None, stdout: Sink = None,
                   stderr: Sink = None, env: Optional[List[str]] = None, dir: Optional[str] = None,
                   user: Optional[str] = None, tty: bool = False) -> ExitStatus:
        """Run a command, passing its output to stdout/stderr (callables
        taking bytes) as it comes; return its ExitStatus."""
        async with await self.exec_session(name, args, stdin=stdin is not None, env=env, dir=dir, user=user, tty=tty) as s:
            feeder = None
            if stdin is not None:
                data: bytes = stdin

                async def feed() -> None:
                    await s.send(data)
                    await s.close_stdin()
                feeder = asyncio.ensure_future(feed())
            try:
                return await s.wait(stdout, stderr)
            finally:
                if feeder is not None:
                    feeder.cancel()

    async def copy_in(self, name: str, dir: str, tar: bytes) -> int:
        resp = await self._open("PUT", _sandbox_path(name) + "/files", {"path": dir}, body=tar, content_type="application/x-tar")
        try:
            return int(json.loads(await resp.read())["bytes"])
        finally:
            resp.close()

    async def copy_out(self, name: str, path: str) -> bytes:
        resp = await self._open("GET", _sandbox_path(name) + "/files", {"path": path})
        try:
            return await resp.read()
        finally:
            resp.close()

    async def snapshot(self, name: str, snapshot: Optional[str] = None, stop: bool = False) -> Snapshot:
        body = _body(SnapshotRequest, name=snapshot, stop=stop or None)
        return cast(Snapshot, await self._json("POST", _sandbox_path(name) + "/snapshots", body=body))

    async def snapshots(self) -> List[Snapshot]:
        return cast(List[Snapshot], await self._json("GET", "/v1/snapshots"))

    async def get_snapshot(self, name: str, verify: bool = False) -> Snapshot:
        return cast(Snapshot, await self._json("GET", "/v1/snapshots/" + quote(name, safe=""), {"verify": verify}))

    async def remove_snapshot(self, name: str) -> None:
        await self._json("DELETE", "/v1/snapshots/" + quote(name, safe=""))

    async def fork(self, snapshot: str, name: str, profile: Optional[str] = None, *, ports: Optional[List[str]] = None,
                   keep_ports: bool = False, publish_external: bool = False,
                   timeout: Optional[str] = None, idle_stop: Optional[str] = None) -> Sandbox:
        """A new sandbox from a snapshot; ports are published on it (the snapshot's own only with keep_ports).
        It keeps the source's timeout and idle_stop unless given here ("0" removes one)."""
        body = _body(ForkRequest, name=name, profile=profile or None, ports=ports, keep_ports=keep_ports or None,
                     publish_external=publish_external or None, timeout=timeout, idle_stop=idle_stop)
        return cast(Sandbox, await self._json("POST", "/v1/snapshots/" + quote(snapshot, safe="") + "/fork", body=body))

    async def profiles(self) -> List[Profile]:
        return cast(List[Profile], await self._json("GET", "/v1/profiles"))

    async def show_profile(self, ref: str) -> Profile:
        return cast(Profile, await self._json("GET", "/v1/profiles/" + quote(ref, safe="")))

    async def check_profile(self, yaml: str, file: Optional[str] = None) -> CheckResult:
        """Check a profile's YAML; problems name file (default profile.yaml)."""
        return cast(CheckResult, await self._json("POST", "/v1/profiles/check", body=_body(CheckRequest, yaml=yaml, file=file)))

    async def explain(self, ref: str, request: str) -> Explanation:
        return cast(Explanation, await self._json("POST", "/v1/profiles/" + quote(ref, safe="") + "/explain", body=_body(ExplainRequest, request=request)))

    async def approvals(self, sandbox: Optional[str] = None) -> List[Approval]:
        """The requests that wait for the host user's answer, oldest first."""
        q = {"sandbox": sandbox} if sandbox else None
        return cast(List[Approval], (await self._json("GET", "/v1/approvals", query=q))["approvals"])

    async def answer(self, approval_id: str, decision: str) -> Approval:
        """Answer a held request: deny, once, sandbox or always (always writes the rule into the profile file)."""
        return cast(Approval, await self._json("POST", "/v1/approvals/" + quote(approval_id, safe=""), body=_body(ApprovalDecision, decision=decision)))

    async def set_policy(self, name: str, profile: str) -> PolicyResult:
        return cast(PolicyResult, await self._json("PUT", _sandbox_path(name) + "/policy", body=_body(PolicyRequest, profile=profile)))

    async def ports(self, name: str) -> PortList:
        """The sandbox's published ports (bound ones while it runs)."""
        return cast(PortList, await self._json("GET", _sandbox_path(name) + "/ports"))

    async def add_port(self, name: str, port: str, *, publish_external: bool = False) -> PortList:
        """Publish a guest port on the host: [HOSTIP:]HOSTPORT:GUESTPORT, 127.0.0.1 unless HOSTIP and publish_external."""
        body = _body(PortRequest, port=port, publish_external=publish_external or None)
        return cast(PortList, await self._json("POST", _sandbox_path(name) + "/ports", body=body))

    async def remove_port(self, name: str, port: str) -> PortList:
        """Withdraw a published port, named [HOSTIP:]HOSTPORT[:GUESTPORT]."""
        return cast(PortList, await self._json("DELETE", _sandbox_path(name) + "/ports", {"port": port}))

    async def add_mount(self, name: str, mount: str) -> MountList:
        """Mount a host folder in a running sandbox: HOST:GUEST[:ro], as -v (QEMU 8.2 or newer)."""
        return cast(MountList, await self._json("POST", _sandbox_path(name) + "/mounts", body=_body(MountRequest, mount=mount)))

    async def remove_mount(self, name: str, guest: str) -> MountList:
        """Unmount the mount at guest path guest; files the guest holds open there fail from then on."""
        return cast(MountList, await self._json("DELETE", _sandbox_path(name) + "/mounts", {"guest": guest}))

    def logs(self, name: str, *, follow: bool = False, refusals: bool = False, since: Optional[str] = None) -> AsyncIterator[Record]:
        q = {"follow": follow or None, "refusals": refusals or None, "since": since}
        return cast(AsyncIterator[Record], self._lines(_sandbox_path(name) + "/logs", q))

    async def verify_log(self, name: str) -> VerifyReport:
        return cast(VerifyReport, await self._json("GET", _sandbox_path(name) + "/logs/verify"))

    def events(self, sandboxes: Optional[List[str]] = None, all: bool = False) -> AsyncIterator[Event]:
        return cast(AsyncIterator[Event], self._lines("/v1/events", {"sandbox": sandboxes or None, "all": all or None}))


__all__ = ["AsyncClient", "AsyncExecSession"]
