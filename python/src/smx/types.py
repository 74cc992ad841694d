"""Typed shapes of the API's JSON objects: one TypedDict per schema in
api/openapi.yaml, field by field (internal/api's TestOneSchema holds them to
it). Each has its required fields; the optional ones come from a
total=False base (NotRequired needs Python 3.11). A field named by a Python
keyword ("class") is declared in the functional form."""

from __future__ import annotations

from typing import Any, Dict, List, Type, TypedDict


_ErrorRequired = TypedDict("_ErrorRequired", {"class": str, "message": str})


class Error(_ErrorRequired, total=False):
    exit_code: int


class Info(TypedDict):
    api: str
    version: str
    state_dir: str


class Image(TypedDict):
    name: str
    source: str
    digest: str
    created: str
    size: int
    disk_bytes: int


_ImageRequestOptional = TypedDict("_ImageRequestOptional", {"from": str, "packages": List[str], "ref": str}, total=False)


class ImageRequest(_ImageRequestOptional):
    name: str


class _BudgetOptional(TypedDict, total=False):
    tokens: int
    requests: int


class Budget(_BudgetOptional):
    per: str


class Worktree(TypedDict):
    """A sandbox's own Git worktree (--worktree) and the one branch it may push."""

    repo: str
    path: str
    branch: str


class _CredentialUsageOptional(TypedDict, total=False):
    cache_read_tokens: int
    cache_write_tokens: int
    day: str
    day_requests: int
    day_tokens: int
    budget: Budget


class CredentialUsage(_CredentialUsageOptional):
    """What the guest spent through one model credential."""

    credential: str
    requests: int
    input_tokens: int
    output_tokens: int


class _SandboxOptional(TypedDict, total=False):
    env: List[str]
    mounts: List[str]
    snapshot: str
    kernel: str
    started: str
    stopped: str
    accel: str
    boot_ms: int
    restored_from: str
    timeout: str
    idle_stop: str
    stop_reason: str
    usage: List[CredentialUsage]
    worktree: Worktree
    caches: List[str]
    error: str
    console_tail: List[str]
    supervisor_pid: int
    qemu_pid: int
    qemu_args: List[str]
    uptime_seconds: int
    template: str
    preset: str
    workspace: str
    agent_exit_code: int
    cpu_seconds: float  # host CPU time of its QEMU (live sandboxes)
    rss_bytes: int  # host memory its QEMU holds (live sandboxes)


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


class _CredentialOptional(TypedDict, total=False):
    presets: List[str]
    sign_in: bool


class Credential(_CredentialOptional):
    """A host-side secret, described; no route ever returns its value."""
    name: str
    bytes: int
    sha256_prefix: str
    updated: str


class _LoginResultOptional(TypedDict, total=False):
    bytes: int
    header: str
    file: str
    what: str
    expires: str


class LoginResult(_LoginResultOptional):
    preset: str
    secret: str


class _SSHCAOptional(TypedDict, total=False):
    replaced: str


class SSHCA(_SSHCAOptional):
    """The SSH user CA's public key and the lines a target host installs."""
    public_key: str
    fingerprint: str
    trusted_user_ca_keys: str
    authorized_keys: str


class CredentialRequest(TypedDict):
    value: str


_LoginRequestOptional = TypedDict("_LoginRequestOptional", {"key": str, "import": bool, "file": str}, total=False)


class LoginRequest(_LoginRequestOptional):
    preset: str


class KernelBuildRequest(TypedDict, total=False):
    jobs: int
    nice: bool
    work_dir: str


class LogPruneRequest(TypedDict, total=False):
    names: List[str]
    all: bool


class LogPruneResult(TypedDict):
    pruned: List[str]


class Kernel(TypedDict):
    version: str
    default: bool
    own: bool
    sandboxes: List[str]
    snapshots: List[str]


class _RequirementOptional(TypedDict, total=False):
    detail: str
    fix: str
    optional: bool


class Requirement(_RequirementOptional):
    name: str
    found: bool


class DoctorReport(TypedDict):
    requirements: List[Requirement]
    accel: str
    accel_reason: str
    state_dir: str
    disk_free_bytes: int
    ok: bool


class CreateRequest(TypedDict, total=False):
    name: str
    image: str
    profile: str
    cpus: int
    memory: str
    disk: str
    accel: str
    env: List[str]
    mounts: List[str]
    caches: List[str]
    ports: List[str]
    publish_external: bool
    timeout: str
    idle_stop: str
    start: bool
    cold: bool


class _ExecRequestOptional(TypedDict, total=False):
    env: List[str]
    dir: str
    user: str
    tty: bool
    rows: int
    cols: int
    stdin: bool
    stdin_data: str


class ExecRequest(_ExecRequestOptional):
    args: List[str]


class _ExecResultOptional(TypedDict, total=False):
    signal: int
    truncated: bool


class ExecResult(_ExecResultOptional):
    exit_code: int
    stdout: str
    stderr: str


_ExecControlOptional = TypedDict("_ExecControlOptional", {"pid": int, "code": int, "signal": int, "rows": int, "cols": int, "class": str, "message": str, "exit_code": int}, total=False)


class ExecControl(_ExecControlOptional):
    type: str


class CopyResult(TypedDict):
    bytes: int


class SnapshotRequest(TypedDict, total=False):
    name: str
    stop: bool


class _SnapshotOptional(TypedDict, total=False):
    parent: str
    image_digest: str
    kernel: str
    qemu_version: str
    verified: bool
    initramfs_hash: str
    accel: str
    machine: str
    cpu: str
    cpu_flags: List[str]
    template: str
    env: List[str]
    mounts: List[str]
    ports: List[str]
    timeout: str
    idle_stop: str
    shared_ram_bytes: int


class Snapshot(_SnapshotOptional):
    name: str
    source: str
    created: str
    image: str
    profile: str
    profile_hash: str
    cpus: int
    memory_mib: int
    disk_bytes: int
    memory_state_bytes: int
    disk_file_bytes: int
    memory_digest: str
    disk_digest: str
    save_ms: int


class _ForkRequestOptional(TypedDict, total=False):
    profile: str
    ports: List[str]
    keep_ports: bool
    publish_external: bool
    timeout: str
    idle_stop: str


class ForkRequest(_ForkRequestOptional):
    name: str


class _PushRequestOptional(TypedDict, total=False):
    compress: str
    with_kernel: bool


class PushRequest(_PushRequestOptional):
    ref: str


class PushedLayer(TypedDict):
    role: str
    media_type: str
    digest: str
    size: int
    diff_id: str
    diff_size: int
    sent: bool


class PushResult(TypedDict):
    kind: str
    snapshot: str
    ref: str
    digest: str
    signer: str
    layers: List[PushedLayer]
    bytes_total: int
    bytes_sent: int
    memory_bytes: int
    memory_stored: int
    compress_ms: int
    duration_ms: int


class _PullRequestOptional(TypedDict, total=False):
    name: str
    keys: List[str]


class PullRequest(_PullRequestOptional):
    ref: str


class _PullResultOptional(TypedDict, total=False):
    present: bool
    image: str
    image_digest: str
    image_on_host: bool


class PullResult(_PullResultOptional):
    kind: str
    snapshot: str
    ref: str
    digest: str
    signer: str
    bytes: int
    duration_ms: int


class _PortRequestOptional(TypedDict, total=False):
    publish_external: bool


class PortRequest(_PortRequestOptional):
    port: str


class _PortBindingOptional(TypedDict, total=False):
    external: bool


class PortBinding(_PortBindingOptional):
    host_ip: str
    host_port: int  # as published; 0 asks for a free port at each start
    guest_port: int
    bound: int  # the host port served now; 0 while the sandbox does not run


class PortList(TypedDict):
    sandbox: str
    running: bool
    ports: List[PortBinding]


class MountRequest(TypedDict):
    mount: str  # HOST:GUEST[:ro,uid=N,gid=N,protect=off], as -v


class MountList(TypedDict):
    sandbox: str
    mounts: List[str]  # HOST:GUEST[:OPTIONS], as -v


class _ProfileOptional(TypedDict, total=False):
    hash: str
    network_mode: str
    yaml: str
    error: str


class Profile(_ProfileOptional):
    name: str
    source: str


class _CheckRequestOptional(TypedDict, total=False):
    file: str


class CheckRequest(_CheckRequestOptional):
    yaml: str


class _CheckResultOptional(TypedDict, total=False):
    hash: str
    problems: List[str]
    warnings: List[str]


class CheckResult(_CheckResultOptional):
    ok: bool


class ExplainRequest(TypedDict):
    request: str


class _ExplanationOptional(TypedDict, total=False):
    ask: bool
    details: List[str]


class Explanation(_ExplanationOptional):
    profile: str
    request: str
    allow: bool
    rule: str
    reason: str


class PolicyRequest(TypedDict):
    profile: str


class _ApprovalOptional(TypedDict, total=False):
    source: str
    decision: str  # deny, once, sandbox, always
    by: str
    rule_written: str
    profile_file: str


class Approval(_ApprovalOptional):
    """A request a gateway holds because a rule says ask (GET /v1/approvals)."""

    id: str
    sandbox: str
    channel: str  # network, file, git, ssh, credential
    what: str
    rule: str
    created: str
    expires: str
    state: str  # pending, granted, denied, timeout


class Approvals(TypedDict):
    approvals: List[Approval]


class ApprovalDecision(TypedDict):
    decision: str  # deny, once, sandbox, always


class PolicyResult(TypedDict):
    sandbox: str
    profile: str
    hash: str
    applied: bool
    closed_flows: int


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
    notes: List[str]
    key: str  # how the signing key was checked: pinned, unpinned, replaced, given


class VerifyReport(_VerifyReportOptional):
    sandbox: str
    log_id: str
    ok: bool
    records: int
    checkpoints: int
    closed: bool
    uncovered: int
    first_bad: int
    summary: str


class _EventOptional(TypedDict, total=False):
    status: str
    refusal: bool
    record: Record
    approval: Approval


class Event(_EventOptional):
    time: str
    sandbox: str
    type: str


class _AgentRequestOptional(TypedDict, total=False):
    args: List[str]
    name: str
    profile: str
    cpus: int
    memory: str
    disk: str
    accel: str
    mounts: List[str]
    caches: List[str]
    ports: List[str]
    publish_external: bool
    timeout: str
    idle_stop: str
    cold: bool
    term: str
    remove: bool
    import_config: bool
    docker: bool


class AgentRequest(_AgentRequestOptional):
    preset: str
    workspace: str


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
    error: Error


class AgentEvent(_AgentEventOptional):
    """One line of POST /v1/agents: type progress, agent or error."""
    type: str


def _body(kind: Type[Any], **fields: Any) -> Dict[str, Any]:
    """The JSON body of a request of schema kind: the fields given, less
    the absent (None) ones. A key kind does not have is a bug in the client."""
    unknown = set(fields) - kind.__required_keys__ - kind.__optional_keys__
    if unknown:
        raise TypeError("%s has no field %s" % (kind.__name__, ", ".join(sorted(unknown))))
    return {k: v for k, v in fields.items() if v is not None}
