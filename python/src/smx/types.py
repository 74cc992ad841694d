"""Typed shapes of the API's JSON objects (see api/openapi.yaml).

Each has its required fields; the optional ones come from a total=False
base (NotRequired needs Python 3.11)."""

from __future__ import annotations

from typing import Any, Dict, List, TypedDict


class _SandboxOptional(TypedDict, total=False):
    started: str
    snapshot: str
    timeout: str
    idle_stop: str
    stop_reason: str
    qemu_args: List[str]
    error: str


class Sandbox(_SandboxOptional):
    name: str
    status: str
    image: str
    profile: str
    profile_hash: str
    cpus: int
    memory_mib: int
    disk_bytes: int
    created: str
    refusals: int


class Image(TypedDict):
    name: str
    source: str
    digest: str
    created: str
    size: int
    disk_bytes: int


class _ExecResultOptional(TypedDict, total=False):
    signal: int
    truncated: bool


class ExecResult(_ExecResultOptional):
    exit_code: int
    stdout: str
    stderr: str


class _SnapshotOptional(TypedDict, total=False):
    verified: bool


class Snapshot(_SnapshotOptional):
    name: str
    source: str
    created: str
    image: str
    profile: str
    memory_state_bytes: int
    disk_file_bytes: int
    memory_digest: str
    disk_digest: str
    save_ms: int


class _ProfileOptional(TypedDict, total=False):
    hash: str
    network_mode: str
    yaml: str


class Profile(_ProfileOptional):
    name: str
    source: str


class _CheckResultOptional(TypedDict, total=False):
    hash: str
    problems: List[str]
    warnings: List[str]


class CheckResult(_CheckResultOptional):
    ok: bool


class Explanation(TypedDict):
    profile: str
    request: str
    allow: bool
    rule: str
    reason: str


class PolicyResult(TypedDict):
    sandbox: str
    profile: str
    hash: str
    applied: bool
    closed_flows: int


class PortBinding(TypedDict, total=False):
    host_ip: str
    host_port: int  # as published; 0 asks for a free port at each start
    guest_port: int
    bound: int  # the host port served now; 0 while the sandbox does not run
    external: bool


class PortList(TypedDict):
    sandbox: str
    running: bool
    ports: List[PortBinding]


class Record(TypedDict):
    seq: int
    time: str
    sandbox: str
    kind: str
    fields: Dict[str, Any]
    prev: str
    hash: str


class _VerifyReportOptional(TypedDict, total=False):
    problems: List[str]
    key: str  # how the signing key was checked: pinned, unpinned, replaced, given


class VerifyReport(_VerifyReportOptional):
    sandbox: str
    log_id: str
    ok: bool
    records: int
    checkpoints: int
    closed: bool
    summary: str


class _EventOptional(TypedDict, total=False):
    status: str
    refusal: bool
    record: Record


class Event(_EventOptional):
    time: str
    sandbox: str
    type: str


class _AgentOptional(TypedDict, total=False):
    workspace: str
    user: str
    workdir: str
    remove: bool
    exit_code: int
    exited: str


class Agent(_AgentOptional):
    """A sandbox that runs a preset's agent; exit_code once it has exited."""
    sandbox: Sandbox
    preset: str
    command: List[str]


class _AgentEventOptional(TypedDict, total=False):
    stage: str
    message: str
    agent: Agent
    error: Dict[str, Any]


class AgentEvent(_AgentEventOptional):
    """One line of POST /v1/agents: type progress, agent or error."""
    type: str
