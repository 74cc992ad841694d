"""The synchronous client of `smx serve` (standard library only)."""

from __future__ import annotations

import http.client
import json
import os
import socket
import threading
from typing import IO, Any, Callable, Dict, Iterator, List, Optional, Tuple, Union, cast
from urllib.parse import quote, urlencode

from . import _ws
from .errors import SmxError, error_from
from .types import (
    Agent,
    AgentEvent,
    AgentRequest,
    CheckRequest,
    CheckResult,
    CreateRequest,
    Credential,
    CredentialRequest,
    DoctorReport,
    Event,
    ExecRequest,
    ExecResult,
    Approval,
    ApprovalDecision,
    Explanation,
    ExplainRequest,
    ForkRequest,
    Image,
    ImageRequest,
    PolicyRequest,
    Kernel,
    KernelBuildRequest,
    LoginRequest,
    LoginResult,
    LogPruneRequest,
    PolicyResult,
    MountList,
    MountRequest,
    PortList,
    PortRequest,
    Profile,
    PullRequest,
    PullResult,
    PushRequest,
    PushResult,
    Record,
    Sandbox,
    Snapshot,
    SnapshotRequest,
    SSHCA,
    VerifyReport,
    _body,
)

Output = Optional[Union[Callable[[bytes], Any], IO[bytes]]]


def default_socket() -> str:
    """$SMX_HOME/smx.sock, with SMX_HOME defaulting as smx's does."""
    home = os.environ.get("SMX_HOME")
    if not home:
        if os.geteuid() == 0:
            home = "/var/lib/smx"
        elif os.environ.get("XDG_STATE_HOME"):
            home = os.path.join(os.environ["XDG_STATE_HOME"], "smx")
        else:
            home = os.path.join(os.path.expanduser("~"), ".local", "state", "smx")
    return os.path.join(home, "smx.sock")


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: Optional[float]) -> None:
        super().__init__("smx", timeout=timeout)
        self._path = path

    def connect(self) -> None:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(self.timeout)
        s.connect(self._path)
        self.sock = s


def _sandbox_path(name: str) -> str:
    return "/v1/sandboxes/" + quote(name, safe="")


def _writer(out: Output) -> Callable[[bytes], Any]:
    if out is None:
        return lambda b: None
    if callable(out):
        return out
    return out.write


class ExitStatus(Tuple[int, int]):
    """How a process ended: (code, signal); code is 128+signal when killed."""

    @property
    def code(self) -> int:
        return self[0]

    @property
    def signal(self) -> int:
        return self[1]


def _exec_message(args: List[str], env: Optional[List[str]], dir: Optional[str], user: Optional[str],
                  tty: bool, stdin: bool, rows: int = 0, cols: int = 0) -> bytes:
    sized = tty and rows and cols
    req = _body(ExecRequest, args=list(args), stdin=stdin, env=list(env) if env else None, dir=dir or None,
                user=user or None, tty=tty or None, rows=rows if sized else None, cols=cols if sized else None)
    return json.dumps(req).encode()


class ExecSession:
    """A process running in a sandbox, its streams on a WebSocket.

    Iterate it for ("stdout"|"stderr", bytes) chunks as they come; wait()
    returns the ExitStatus. send(), close_stdin(), signal() and resize() may be
    called from another thread. Closing the session kills the process.
    """

    def __init__(self, sock: socket.socket, rfile: IO[bytes]) -> None:
        self._sock = sock
        self._rfile = rfile
        self._wlock = threading.Lock()
        self.pid = 0
        self.status: Optional[ExitStatus] = None
        self._closed = False

    def _send(self, opcode: int, payload: bytes) -> None:
        with self._wlock:
            self._sock.sendall(_ws.encode(opcode, payload))

    def _control(self, **m: Any) -> None:
        self._send(_ws.OP_TEXT, json.dumps(m).encode())

    def send(self, data: bytes) -> None:
        """Write data to the process's stdin."""
        for i in range(0, len(data), 32 << 10):
            self._send(_ws.OP_BINARY, data[i:i + (32 << 10)])

    def close_stdin(self) -> None:
        self._control(type="stdin_eof")

    def signal(self, sig: int) -> None:
        self._control(type="signal", signal=int(sig))

    def resize(self, rows: int, cols: int) -> None:
        self._control(type="resize", rows=rows, cols=cols)

    def _read_exact(self, n: int) -> bytes:
        b = self._rfile.read(n)
        if b is None or len(b) < n:
            raise ConnectionError("smx api: exec: connection lost before the process exited")
        return b

    def _message(self) -> Tuple[int, bytes]:
        parts: List[bytes] = []
        first_op = -1
        while True:
            fin, opcode, extra, n = _ws.header_len(self._read_exact(2))
            n, key = _ws.payload_len(n, self._read_exact(extra) if extra else b"")
            data = _ws.unmask(self._read_exact(n) if n else b"", key)
            if opcode == _ws.OP_PING:
                self._send(_ws.OP_PONG, data)
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

    def __iter__(self) -> Iterator[Tuple[str, bytes]]:
        while self.status is None:
            opcode, data = self._message()
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
                self.close()
                raise error_from(0, data, m.get("class"))
        self.close()

    def wait(self, stdout: Output = None, stderr: Output = None) -> ExitStatus:
        """Copy the output to stdout/stderr (callables or binary files) until
        the process ends; return how it ended."""
        out, err = _writer(stdout), _writer(stderr)
        for stream, data in self:
            (err if stream == "stderr" else out)(data)
        assert self.status is not None
        return self.status

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            with self._wlock:
                self._sock.sendall(_ws.encode(_ws.OP_CLOSE, b"\x03\xe8"))
        except OSError:
            pass
        self._sock.close()

    def __enter__(self) -> "ExecSession":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class Client:
    """A client of one `smx serve`: its unix socket (default
    $SMX_HOME/smx.sock), or tcp=("host", port) with a bearer token."""

    def __init__(self, socket_path: Optional[str] = None, *, tcp: Optional[Tuple[str, int]] = None,
                 token: Optional[str] = None, timeout: Optional[float] = None) -> None:
        self.socket_path = socket_path or default_socket()
        self.tcp = tcp
        self.token = token
        self.timeout = timeout

    # Transport.

    def _connection(self, timeout: Optional[float] = None) -> http.client.HTTPConnection:
        t = timeout if timeout is not None else self.timeout
        if self.tcp:
            return http.client.HTTPConnection(self.tcp[0], self.tcp[1], timeout=t)
        return _UnixConnection(self.socket_path, t)

    def _open(self, method: str, path: str, query: Optional[Dict[str, Any]] = None, body: Any = None,
              content_type: Optional[str] = None, stream: bool = False) -> Tuple[http.client.HTTPConnection, http.client.HTTPResponse]:
        if query:
            q = {k: ("true" if v is True else "false" if v is False else v) for k, v in query.items() if v is not None}
            if q:
                path += "?" + urlencode(q, doseq=True)
        headers = {"Host": "smx"}
        if self.token:
            headers["Authorization"] = "Bearer " + self.token
        data = body
        if body is not None and content_type is None:
            data = json.dumps(body).encode()
            content_type = "application/json"
        if content_type:
            headers["Content-Type"] = content_type
        conn = self._connection(None if not stream else self.timeout)
        conn.request(method, path, body=data, headers=headers)
        resp = conn.getresponse()
        if resp.status >= 300:
            body_bytes = resp.read()
            conn.close()
            raise error_from(resp.status, body_bytes)
        return conn, resp

    def _json(self, method: str, path: str, query: Optional[Dict[str, Any]] = None, body: Any = None) -> Any:
        conn, resp = self._open(method, path, query, body)
        try:
            data = resp.read()
        finally:
            conn.close()
        return json.loads(data) if data else None

    def _lines(self, path: str, query: Dict[str, Any]) -> Iterator[Dict[str, Any]]:
        conn, resp = self._open("GET", path, query, stream=True)
        try:
            while True:
                line = resp.readline()
                if not line:
                    return
                if line.strip():
                    yield json.loads(line)
        finally:
            conn.close()

    # Agents.

    def run_agent(self, preset: str, workspace: str, *, args: Optional[List[str]] = None, name: Optional[str] = None,
                  profile: Optional[str] = None, cpus: Optional[int] = None, memory: Optional[str] = None,
                  disk: Optional[str] = None, mounts: Optional[List[str]] = None, caches: Optional[List[str]] = None, remove: bool = False,
                  accel: Optional[str] = None, ports: Optional[List[str]] = None,
                  publish_external: bool = False, timeout: Optional[str] = None,
                  idle_stop: Optional[str] = None, term: Optional[str] = None,
                  cold: bool = False, import_config: bool = False, docker: bool = False,
                  progress: Optional[Callable[[AgentEvent], Any]] = None) -> Agent:
        """Launch a preset's coding agent (claude, codex, gemini, shell, docker) detached in a
        new sandbox on workspace (an absolute folder on the server's host, at /work).
        The first launch of a preset builds its image (minutes): progress gets each
        progress event (stage "build": one line of the build's output). When the
        agent exits its sandbox stops (is removed with remove); agent() then
        reports its exit_code."""
        body = _body(AgentRequest, preset=preset, workspace=workspace, args=args, name=name, profile=profile,
                     cpus=cpus, memory=memory, disk=disk, accel=accel, mounts=mounts, caches=caches, ports=ports,
                     publish_external=publish_external or None, timeout=timeout, idle_stop=idle_stop,
                     cold=cold or None, term=term, remove=remove or None,
                     import_config=import_config or None, docker=docker or None)
        conn, resp = self._open("POST", "/v1/agents", body=body, stream=True)
        try:
            while True:
                line = resp.readline()
                if not line:
                    raise SmxError(0, "internal", "POST /v1/agents: the answer ended before the agent started")
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
            conn.close()

    def agent(self, name: str) -> Agent:
        """A sandbox that runs a preset's agent, with exit_code once it has exited."""
        return cast(Agent, self._json("GET", "/v1/agents/" + quote(name, safe="")))

    # Images and sandboxes.

    def info(self) -> Dict[str, str]:
        return cast(Dict[str, str], self._json("GET", "/v1/info"))

    def images(self) -> List[Image]:
        return cast(List[Image], self._json("GET", "/v1/images"))

    def build_image(self, name: str, *, from_: Optional[str] = None, packages: Optional[List[str]] = None,
                    ref: Optional[str] = None) -> Image:
        """Build an image from busybox or debian, or import ref
        (docker-archive:FILE or oci-layout:DIR on the server's host)."""
        body = _body(ImageRequest, name=name, **{"from": from_ or None}, packages=packages or None, ref=ref or None)
        return cast(Image, self._json("POST", "/v1/images", body=body))

    def inspect_image(self, name: str) -> Image:
        return cast(Image, self._json("GET", "/v1/images/" + quote(name, safe="")))

    def remove_image(self, name: str) -> None:
        self._json("DELETE", "/v1/images/" + quote(name, safe=""))

    # Host-side secrets: stored and described, never read back.

    def creds(self) -> List[Credential]:
        return cast(List[Credential], self._json("GET", "/v1/creds"))

    def set_cred(self, name: str, value: Union[str, bytes]) -> Credential:
        """Store a secret under name (a trailing newline is dropped)."""
        v = value.decode() if isinstance(value, bytes) else value
        return cast(Credential, self._json("PUT", "/v1/creds/" + quote(name, safe=""), body=_body(CredentialRequest, value=v)))

    def remove_cred(self, name: str) -> None:
        self._json("DELETE", "/v1/creds/" + quote(name, safe=""))

    def login(self, preset: str, *, key: Optional[str] = None, import_: bool = False,
              file: Optional[str] = None) -> LoginResult:
        """Store preset's model API key, or (import_) import the server's
        user's own sign-in of the agent, from file or the preset's default."""
        body = _body(LoginRequest, preset=preset, key=key or None, file=file or None, **{"import": import_ or None})
        return cast(LoginResult, self._json("POST", "/v1/creds/login", body=body))

    def ssh_ca(self) -> SSHCA:
        """The SSH user CA (created on first use) and the lines a target
        host installs to trust it."""
        return cast(SSHCA, self._json("GET", "/v1/ssh-ca"))

    def rotate_ssh_ca(self) -> SSHCA:
        return cast(SSHCA, self._json("POST", "/v1/ssh-ca/rotate"))

    def kernels(self) -> List[Kernel]:
        return cast(List[Kernel], self._json("GET", "/v1/kernels"))

    def build_kernel(self, *, jobs: int = 0, nice: bool = False, work_dir: Optional[str] = None) -> Kernel:
        """Build smx's own guest kernel on the server's host (minutes)."""
        body = _body(KernelBuildRequest, jobs=jobs or None, nice=nice or None, work_dir=work_dir or None)
        return cast(Kernel, self._json("POST", "/v1/kernels", body=body))

    def remove_kernel(self, version: str) -> None:
        self._json("DELETE", "/v1/kernels/" + quote(version, safe=""))

    def doctor(self) -> DoctorReport:
        """Check the server's host."""
        return cast(DoctorReport, self._json("GET", "/v1/doctor"))

    def templates(self) -> List[Snapshot]:
        """Boot templates (saved post-boot guests)."""
        return cast(List[Snapshot], self._json("GET", "/v1/templates"))

    def remove_template(self, name: str) -> None:
        self._json("DELETE", "/v1/templates/" + quote(name, safe=""))

    def push_template(self, name: str, ref: str, *, compress: Optional[str] = None, with_kernel: bool = False) -> PushResult:
        """Send a boot template to a registry, signed by the server's log key (its CAs' private keys stay behind)."""
        body = _body(PushRequest, ref=ref, compress=compress, with_kernel=with_kernel or None)
        return cast(PushResult, self._json("POST", "/v1/templates/" + quote(name, safe="") + "/push", body=body))

    def pull_template(self, ref: str, *, keys: Optional[List[str]] = None) -> PullResult:
        """Fetch a signed boot template; present already is not an error."""
        body = _body(PullRequest, ref=ref, keys=keys or None)
        return cast(PullResult, self._json("POST", "/v1/templates/pull", body=body))

    def push_snapshot(self, name: str, ref: str, *, compress: Optional[str] = None, with_kernel: bool = False) -> PushResult:
        """Send a snapshot to a registry, signed by the server's log key."""
        body = _body(PushRequest, ref=ref, compress=compress, with_kernel=with_kernel or None)
        return cast(PushResult, self._json("POST", "/v1/snapshots/" + quote(name, safe="") + "/push", body=body))

    def pull_snapshot(self, ref: str, *, name: Optional[str] = None, keys: Optional[List[str]] = None) -> PullResult:
        """Fetch a signed snapshot (refused, leaving nothing, unless it verifies); fork then starts it."""
        body = _body(PullRequest, ref=ref, name=name, keys=keys or None)
        return cast(PullResult, self._json("POST", "/v1/snapshots/pull", body=body))

    def log_names(self) -> List[str]:
        """Every sandbox log, removed sandboxes' included."""
        return cast(List[str], self._json("GET", "/v1/logs"))

    def prune_logs(self, names: Optional[List[str]] = None, *, all: bool = False) -> List[str]:
        """Delete the logs of removed sandboxes; returns those pruned."""
        body = _body(LogPruneRequest, names=names or None, all=None if names else all)
        return cast(List[str], self._json("POST", "/v1/logs/prune", body=body)["pruned"])

    def list(self) -> List[Sandbox]:
        return cast(List[Sandbox], self._json("GET", "/v1/sandboxes"))

    def inspect(self, name: str) -> Sandbox:
        return cast(Sandbox, self._json("GET", _sandbox_path(name)))

    def create(self, name: Optional[str] = None, *, image: Optional[str] = None, profile: Optional[str] = None,
               cpus: Optional[int] = None, memory: Optional[str] = None, disk: Optional[str] = None,
               env: Optional[List[str]] = None, mounts: Optional[List[str]] = None, caches: Optional[List[str]] = None, start: bool = False,
               cold: bool = False, ports: Optional[List[str]] = None, publish_external: bool = False,
               timeout: Optional[str] = None, idle_stop: Optional[str] = None,
               accel: Optional[str] = None) -> Sandbox:
        """Create a sandbox; with start, boot it too (with cold, never from a boot template). timeout and idle_stop (Go durations
        such as "10m") stop it after that long running, or that long without activity."""
        req = _body(CreateRequest, name=name, image=image, profile=profile, cpus=cpus, memory=memory, disk=disk,
                    accel=accel, env=env, mounts=mounts, caches=caches, ports=ports, publish_external=publish_external or None,
                    timeout=timeout, idle_stop=idle_stop, start=start or None, cold=cold or None)
        return cast(Sandbox, self._json("POST", "/v1/sandboxes", body=req))

    def start(self, name: str, cold: bool = False) -> Sandbox:
        return cast(Sandbox, self._json("POST", _sandbox_path(name) + "/start", {"cold": cold or None}))

    def stop(self, name: str, timeout: Optional[float] = None) -> Sandbox:
        q = {"timeout": f"{timeout}s"} if timeout is not None else None
        return cast(Sandbox, self._json("POST", _sandbox_path(name) + "/stop", q))

    def pause(self, name: str) -> Sandbox:
        return cast(Sandbox, self._json("POST", _sandbox_path(name) + "/pause"))

    def resume(self, name: str) -> Sandbox:
        return cast(Sandbox, self._json("POST", _sandbox_path(name) + "/resume"))

    def suspend(self, name: str) -> Sandbox:
        return cast(Sandbox, self._json("POST", _sandbox_path(name) + "/suspend"))

    def remove(self, name: str, force: bool = False) -> None:
        self._json("DELETE", _sandbox_path(name), {"force": force})

    # Exec.

    def run(self, name: str, args: List[str], *, stdin: Optional[bytes] = None, env: Optional[List[str]] = None,
            dir: Optional[str] = None, user: Optional[str] = None) -> ExecResult:
        """Run a command to its end; answer its exit code and output."""
        req = _body(ExecRequest, args=list(args), stdin_data=stdin.decode() if stdin else None, env=env or None,
                    dir=dir or None, user=user or None)
        return cast(ExecResult, self._json("POST", _sandbox_path(name) + "/exec", body=req))

    def exec_session(self, name: str, args: List[str], *, stdin: bool = False, env: Optional[List[str]] = None,
                     dir: Optional[str] = None, user: Optional[str] = None, tty: bool = False,
                     rows: int = 0, cols: int = 0) -> ExecSession:
        """Start a command with its streams on a WebSocket (see ExecSession)."""
        if self.tcp:
            sock = socket.create_connection(self.tcp, timeout=self.timeout)
        else:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.settimeout(self.timeout)
            sock.connect(self.socket_path)
        try:
            req, accept = _ws.handshake(_sandbox_path(name) + "/exec", "smx", self.token)
            sock.sendall(req)
            rfile = sock.makefile("rb")
            head = b""
            while not head.endswith(b"\r\n\r\n"):
                line = rfile.readline()
                if not line:
                    raise ConnectionError("smx api: exec: no answer to the upgrade")
                head += line
            status, headers = _ws.parse_head(head)
            if status != 101:
                n = int(headers.get("content-length", "0"))
                raise error_from(status, rfile.read(n) if n else b"")
            if headers.get("sec-websocket-accept") != accept:
                raise ConnectionError("smx api: exec: bad WebSocket accept")
            session = ExecSession(sock, rfile)
            session._send(_ws.OP_TEXT, _exec_message(args, env, dir, user, tty, stdin, rows, cols))
            return session
        except BaseException:
            sock.close()
            raise

    def exec(self, name: str, args: List[str], *, stdin: Optional[bytes] = None, stdout: Output = None,
             stderr: Output = None, env: Optional[List[str]] = None, dir: Optional[str] = None,
             user: Optional[str] = None, tty: bool = False) -> ExitStatus:
        """Run a command, streaming its output to stdout/stderr (callables
        taking bytes, or binary files) as it comes; return its ExitStatus."""
        with self.exec_session(name, args, stdin=stdin is not None, env=env, dir=dir, user=user, tty=tty) as s:
            if stdin is not None:
                data: bytes = stdin

                def feed() -> None:
                    try:
                        s.send(data)
                        s.close_stdin()
                    except OSError:
                        pass
                threading.Thread(target=feed, daemon=True).start()
            return s.wait(stdout, stderr)

    # Files.

    def copy_in(self, name: str, dir: str, tar: Union[bytes, IO[bytes]]) -> int:
        """Extract a tar archive into directory dir of the guest."""
        conn, resp = self._open("PUT", _sandbox_path(name) + "/files", {"path": dir}, body=tar,
                                content_type="application/x-tar")
        try:
            return int(json.loads(resp.read())["bytes"])
        finally:
            conn.close()

    def copy_out(self, name: str, path: str) -> bytes:
        """A tar archive of path in the guest (top entry: its base name)."""
        conn, resp = self._open("GET", _sandbox_path(name) + "/files", {"path": path})
        try:
            return resp.read()
        finally:
            conn.close()

    # Snapshots.

    def snapshot(self, name: str, snapshot: Optional[str] = None, stop: bool = False) -> Snapshot:
        body = _body(SnapshotRequest, name=snapshot, stop=stop or None)
        return cast(Snapshot, self._json("POST", _sandbox_path(name) + "/snapshots", body=body))

    def snapshots(self) -> List[Snapshot]:
        return cast(List[Snapshot], self._json("GET", "/v1/snapshots"))

    def get_snapshot(self, name: str, verify: bool = False) -> Snapshot:
        return cast(Snapshot, self._json("GET", "/v1/snapshots/" + quote(name, safe=""), {"verify": verify}))

    def remove_snapshot(self, name: str) -> None:
        self._json("DELETE", "/v1/snapshots/" + quote(name, safe=""))

    def fork(self, snapshot: str, name: str, profile: Optional[str] = None, *, ports: Optional[List[str]] = None,
             keep_ports: bool = False, publish_external: bool = False,
             timeout: Optional[str] = None, idle_stop: Optional[str] = None) -> Sandbox:
        """A new sandbox from a snapshot; ports are published on it (the snapshot's own only with keep_ports).
        It keeps the source's timeout and idle_stop unless given here ("0" removes one)."""
        body = _body(ForkRequest, name=name, profile=profile or None, ports=ports, keep_ports=keep_ports or None,
                     publish_external=publish_external or None, timeout=timeout, idle_stop=idle_stop)
        return cast(Sandbox, self._json("POST", "/v1/snapshots/" + quote(snapshot, safe="") + "/fork", body=body))

    # Profiles and policy.

    def profiles(self) -> List[Profile]:
        return cast(List[Profile], self._json("GET", "/v1/profiles"))

    def show_profile(self, ref: str) -> Profile:
        return cast(Profile, self._json("GET", "/v1/profiles/" + quote(ref, safe="")))

    def check_profile(self, yaml: str, file: Optional[str] = None) -> CheckResult:
        """Check a profile's YAML; problems name file (default profile.yaml)."""
        return cast(CheckResult, self._json("POST", "/v1/profiles/check", body=_body(CheckRequest, yaml=yaml, file=file)))

    def explain(self, ref: str, request: str) -> Explanation:
        return cast(Explanation, self._json("POST", "/v1/profiles/" + quote(ref, safe="") + "/explain", body=_body(ExplainRequest, request=request)))

    def approvals(self, sandbox: Optional[str] = None) -> List[Approval]:
        """The requests that wait for the host user's answer, oldest first."""
        q = {"sandbox": sandbox} if sandbox else None
        return cast(List[Approval], (self._json("GET", "/v1/approvals", query=q))["approvals"])

    def answer(self, approval_id: str, decision: str) -> Approval:
        """Answer a held request: deny, once, sandbox or always (always writes the rule into the profile file)."""
        return cast(Approval, self._json("POST", "/v1/approvals/" + quote(approval_id, safe=""), body=_body(ApprovalDecision, decision=decision)))

    def set_policy(self, name: str, profile: str) -> PolicyResult:
        return cast(PolicyResult, self._json("PUT", _sandbox_path(name) + "/policy", body=_body(PolicyRequest, profile=profile)))

    def ports(self, name: str) -> PortList:
        """The sandbox's published ports (bound ones while it runs)."""
        return cast(PortList, self._json("GET", _sandbox_path(name) + "/ports"))

    def add_port(self, name: str, port: str, *, publish_external: bool = False) -> PortList:
        """Publish a guest port on the host: [HOSTIP:]HOSTPORT:GUESTPORT, 127.0.0.1 unless HOSTIP and publish_external."""
        body = _body(PortRequest, port=port, publish_external=publish_external or None)
        return cast(PortList, self._json("POST", _sandbox_path(name) + "/ports", body=body))

    def remove_port(self, name: str, port: str) -> PortList:
        """Withdraw a published port, named [HOSTIP:]HOSTPORT[:GUESTPORT]."""
        return cast(PortList, self._json("DELETE", _sandbox_path(name) + "/ports", {"port": port}))

    def add_mount(self, name: str, mount: str) -> MountList:
        """Mount a host folder in a running sandbox: HOST:GUEST[:ro], as -v (QEMU 8.2 or newer)."""
        return cast(MountList, self._json("POST", _sandbox_path(name) + "/mounts", body=_body(MountRequest, mount=mount)))

    def remove_mount(self, name: str, guest: str) -> MountList:
        """Unmount the mount at guest path guest; files the guest holds open there fail from then on."""
        return cast(MountList, self._json("DELETE", _sandbox_path(name) + "/mounts", {"guest": guest}))

    # Logs and events.

    def logs(self, name: str, *, follow: bool = False, refusals: bool = False, since: Optional[str] = None) -> Iterator[Record]:
        """The sandbox's log records; with follow, new ones as they come."""
        q = {"follow": follow or None, "refusals": refusals or None, "since": since}
        return cast(Iterator[Record], self._lines(_sandbox_path(name) + "/logs", q))

    def verify_log(self, name: str) -> VerifyReport:
        return cast(VerifyReport, self._json("GET", _sandbox_path(name) + "/logs/verify"))

    def events(self, sandboxes: Optional[List[str]] = None, all: bool = False) -> Iterator[Event]:
        """Lifecycle changes and refusals as they happen (never ends by itself)."""
        return cast(Iterator[Event], self._lines("/v1/events", {"sandbox": sandboxes or None, "all": all or None}))


__all__ = ["Client", "ExecSession", "ExitStatus", "SmxError", "default_socket"]
