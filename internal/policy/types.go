package policy

import (
	"net/netip"
	"strconv"
	"time"
)

// Mode is the network default.
type Mode string

const (
	AllowAll    Mode = "allow-all"    // everything not denied or always closed
	DenyAll     Mode = "deny-all"     // nothing; allow rules and host_ports are then an error
	DefaultDeny Mode = "default-deny" // only what an allow rule names (the default)
	// AskMode is default-deny, but what no rule names is asked of the
	// host user instead of refused (see Decision.Ask).
	AskMode Mode = "ask"
)

// Network is the `network:` section.
type Network struct {
	Mode      Mode
	ModePos   Pos // where mode was set; zero when it took the default
	Allow     []NetRule
	Deny      []NetRule
	Ask       []NetRule  // what these name is asked of the host user (network.ask)
	HostPorts []HostPort // ports of host loopback services reachable as host.smx.internal:PORT
}

// NetRule names a destination by domain or by CIDR, with optional ports and
// protocol.
type NetRule struct {
	Domain string       // lower case, no trailing dot; "*.example.com" for a wildcard; "" for a CIDR rule
	CIDR   netip.Prefix // zero for a domain rule
	Ports  []PortRange  // empty: any port
	Proto  string       // "tcp", "udp", or "" for both
	Pos    Pos
	Where  string // e.g. "network.allow[3]"
}

// PortRange is an inclusive range of ports; Lo == Hi for a single port.
type PortRange struct{ Lo, Hi uint16 }

func (r PortRange) String() string {
	if r.Lo == r.Hi {
		return strconv.Itoa(int(r.Lo))
	}
	return strconv.Itoa(int(r.Lo)) + "-" + strconv.Itoa(int(r.Hi))
}

// HostPort is one host loopback port exposed to the guest.
type HostPort struct {
	Port uint16
	Pos  Pos
}

// Access is what a files rule grants.
type Access string

const (
	ReadWrite Access = "rw"
	ReadOnly  Access = "ro"
	NoAccess  Access = "deny"
	// AskAccess asks the host user before any access, read or write.
	AskAccess Access = "ask"
	// AskWrite allows reading and asks the host user before a write.
	AskWrite Access = "ask-write"
)

// Files is the `files:` section. Rules match guest paths.
type Files struct {
	Mounts []Mount
	Rules  []FileRule
	// Caches are the named package caches every sandbox of the profile
	// uses, in --volume-cache notation (internal/cache).
	Caches []Cache
}

// Cache is one files.caches entry: NAME[:GUESTPATH][:ro|shared].
type Cache struct {
	Spec string
	Pos  Pos
}

// Mount shares a host directory at a guest path.
type Mount struct {
	Host, Guest string // absolute, clean
	// UID and GID own the host user's files in the guest, as -v's
	// uid=N,gid=N do (0:0 unless given; see internal/fsgw).
	UID, GID uint32
	Pos      Pos
}

// FileRule grants (rw, ro) or denies access to the guest paths matching Path.
type FileRule struct {
	Path   string // absolute glob; `*` and `?` within a path element, `**` for any number of elements
	Access Access
	Pos    Pos
	Where  string
}

// Verdict is an allow/deny setting that may be left unset.
type Verdict int8

const (
	Unset Verdict = iota
	Allow
	Deny
	// Ask holds the operation until the host user answers (push, delete
	// and force_push only).
	Ask
)

func (v Verdict) String() string {
	switch v {
	case Allow:
		return "allow"
	case Deny:
		return "deny"
	case Ask:
		return "ask"
	}
	return "unset"
}

// Git is the `git:` section.
type Git struct {
	Repos []RepoRule
}

// RepoRule sets permissions on the repositories matching Repo
// ("forge/owner/name" glob, lower case).
type RepoRule struct {
	Repo                          string
	Read, Push, Delete, ForcePush Verdict
	Refs                          []RefRule
	// PushOptions names the push options (`git push -o NAME[=VALUE]`)
	// a push to these repositories may carry: option names, `*` globs
	// within a name. A push with any other option is refused whole.
	PushOptions []string
	Pos         Pos
	Where       string
}

// RefRule sets push permissions on the refs matching Ref (a glob over full
// ref names such as "refs/heads/feature/*").
type RefRule struct {
	Ref                     string
	Push, Delete, ForcePush Verdict
	Pos                     Pos
	Where                   string
}

// SSH is the `ssh:` section.
type SSH struct {
	CertTTL time.Duration // lifetime of the certificates the SSH gateway signs
	Allow   []SSHRule
	Deny    []SSHRule
}

// DefaultCertTTL is the SSH certificate lifetime when a profile sets none.
const DefaultCertTTL = 5 * time.Minute

// SSHRule matches SSH connections by host glob (`*` matches any run of
// characters, `?` one), user (glob; "" or "*" for any) and port.
type SSHRule struct {
	Host  string
	User  string
	Ports []PortRange // never empty after parsing; [22] by default
	Pos   Pos
	Where string

	// Ask (allow rules only) holds a connection the rule matches until
	// the host user answers; once approved, the options below apply.
	Ask bool

	// What an allow rule lets a session do beyond exec and shell (deny
	// rules set none of these).
	SFTP    Verdict  // the sftp subsystem and scp (both modes); denied unless Allow
	Forward []string // "local" (-L, -D, -J), "remote" (-R), "agent" (-A), "x11" (-X); none unless listed
	Env     []string // names (globs) of environment variables passed on; nil means DefaultSSHEnv
	HostKey string   // "SHA256:..." pin of the upstream host key; "" means the host user's known_hosts
	// GitRoot says the host is a plain sshd + git-shell server whose
	// user's home directory (where git resolves relative paths, ~ and
	// ~USER) is this absolute path: Git over SSH maps every spelling of a
	// repository path to the one under it, and refuses absolute paths
	// elsewhere. "" means the server parses the path itself (a forge).
	GitRoot string
}

// DefaultSSHEnv are the environment variables an SSH session may pass on
// when its rule lists none (OpenSSH clients send these by default).
var DefaultSSHEnv = []string{"LANG", "LC_*"}

// SSH forwarding kinds an allow rule can list.
const (
	ForwardLocal  = "local"  // direct-tcpip channels: -L, -D, -J
	ForwardRemote = "remote" // tcpip-forward requests: -R
	ForwardAgent  = "agent"  // auth-agent-req: -A
	ForwardX11    = "x11"    // x11-req: -X, -Y
)

// Forwards reports whether r allows the forwarding kind.
func (r SSHRule) Forwards(kind string) bool {
	for _, f := range r.Forward {
		if f == kind {
			return true
		}
	}
	return false
}

// SSHAgentSecret as a credential's From (with SSHHost) means the keys of
// the host user's ssh-agent rather than a secret in the store: the user's
// explicit opt-in, per host.
const SSHAgentSecret = "@ssh-agent"

// Credential binds a secret from the host-side store to the one place it
// may be used: exactly one of Domain (with Header), Forge or SSHHost is set.
type Credential struct {
	Name    string
	From    string // secret name in the host-side store
	Domain  string // HTTP(S) destination; exact or "*.example.com"
	Header  string // header to set, with Domain
	Format  string // header value with "{}" replaced by the secret; "{}" when unset
	Forge   string // Git forge host, e.g. "github.com"
	SSHHost string // SSH host glob (never "*")
	// Methods, Paths and Headers limit an HTTP binding to some requests:
	// upper-case methods, absolute path globs (`*` within an element, `**`
	// any number of elements), and header value globs. A domain binding without them is used on every
	// request to its domain; a forge binding without them only on Git
	// requests for allowed repositories. See MatchRequest.
	Methods []string
	Paths   []string
	Headers []HeaderMatch // all must match; sorted by name
	// DenyPaths (domain bindings only) are path globs refused outright on
	// the bound domain, whatever the request carries: endpoints where the
	// secret would buy another credential (an API key minted from a
	// sign-in). Deny beats Paths. See Denies.
	DenyPaths []string
	// Budget (domain bindings only) caps what the guest may spend through
	// this credential; nil means no cap. See Budget.
	Budget *Budget
	// Ask holds the first use of the binding in a sandbox until the host
	// user answers (the broker asks before adding the secret).
	Ask bool
	Pos Pos
}

// Budget caps the model requests a domain credential goes with, and the
// tokens the model's own responses report for them: the broker counts
// both and, past either, answers the next request with the provider's
// quota error instead of forwarding it. Per says over what the count runs.
type Budget struct {
	Tokens   int64  // input + output tokens (cached input included); 0: no cap
	Requests int64  // requests the credential was sent with; 0: no cap
	Per      string // BudgetPerSandbox or BudgetPerDay
	// Ask puts the next request past the budget to the host user instead
	// of refusing it: allowed once, it goes on (and is counted); allowed
	// for the sandbox, the budget no longer stops this sandbox; denied or
	// unanswered, it gets the quota error.
	Ask bool
	Pos Pos // where `budget:` is written
}

// Budget periods: the sandbox's whole life, or one UTC calendar day of it.
const (
	BudgetPerSandbox = "sandbox"
	BudgetPerDay     = "day"
)

// HeaderMatch requires a request header (canonical name) with a value
// matching a glob (`*` any run of characters, `?` one).
type HeaderMatch struct {
	Name, Value string
}

// Log is the `log:` section: how the audit log records commands.
type Log struct {
	// Redact holds regular expressions (RE2) whose matches in recorded
	// command arguments are replaced before anything is written; a
	// pattern with a group replaces only the group. Built-in token shapes
	// are redacted whatever the profile says (audit.Redactor).
	Redact []RedactRule
}

// RedactRule is one log.redact pattern.
type RedactRule struct {
	Pattern string
	Pos     Pos
}

// AskSettings is the `ask:` section: how long a held request waits for the
// host user's answer, and how many may wait at once per sandbox.
type AskSettings struct {
	Timeout time.Duration // 0 means DefaultAskTimeout
	Max     int           // 0 means DefaultAskMax
	Pos     Pos
}

// Defaults for AskSettings.
const (
	DefaultAskTimeout = 60 * time.Second
	DefaultAskMax     = 16
)

// AskTimeout is how long a held request waits before it is refused.
func (p *Profile) AskTimeout() time.Duration {
	if p.Ask.Timeout > 0 {
		return p.Ask.Timeout
	}
	return DefaultAskTimeout
}

// AskMax is how many requests a sandbox may hold at once.
func (p *Profile) AskMax() int {
	if p.Ask.Max > 0 {
		return p.Ask.Max
	}
	return DefaultAskMax
}
