package netstack

import (
	"net/netip"
	"strconv"
	"time"

	"github.com/smx-dev/smx/internal/audit"
	"github.com/smx-dev/smx/internal/policy"
	"github.com/smx-dev/smx/internal/usage"
)

// HostInternal is the name under which the guest reaches host loopback
// services listed in Config.HostPorts. The DNS server answers it with the
// gateway address; the policy package knows it by the same name.
const HostInternal = "host.smx.internal"

// Protocols of a Flow.
const (
	ProtoTCP = "tcp"
	ProtoUDP = "udp"
	// ProtoDNS marks a name lookup: may Host be resolved at all? Dst is
	// zero. A policy that answers no makes the DNS server reply NXDOMAIN
	// without asking the host's resolver, so a denied name never leaves the
	// host (no DNS exfiltration through the host's resolver).
	ProtoDNS = "dns"
)

// Flow is one thing the guest attempts through the gateway: a TCP
// connection, a UDP session (one guest address and port to one destination
// address and port), or a name lookup.
type Flow struct {
	Proto string         // ProtoTCP, ProtoUDP or ProtoDNS
	Src   netip.AddrPort // the guest's end; zero for ProtoDNS
	Dst   netip.AddrPort // as the guest addressed it; zero for ProtoDNS
	// Host is the name the flow is for: the name looked up (ProtoDNS),
	// HostInternal for a host port, or the name our DNS server answered
	// with Dst's address, if it did (the newest such name that the policy
	// allows). Empty for a raw-IP flow, which is judged by IP rules only.
	Host string
}

func (f Flow) String() string {
	if f.Proto == ProtoDNS {
		return "dns " + f.Host
	}
	s := f.Proto + " " + f.Dst.String()
	if f.Host != "" {
		s += " (" + f.Host + ")"
	}
	return s
}

// Request is the policy request for f. A host-port flow is reported by name
// only: what is dialled is host loopback, which the policy opens only
// through network.host_ports. A ProtoDNS flow has no single request; see
// ProfilePolicy.
func (f Flow) Request() policy.Request {
	r := policy.Request{Kind: policy.KindNet, Proto: f.Proto, Host: f.Host, Port: f.Dst.Port()}
	if f.Host != HostInternal {
		r.IP = f.Dst.Addr()
	}
	return r
}

// PolicyFunc decides a Flow. It is called on the packet path: it must be
// quick, must not block, and must be safe for concurrent use.
type PolicyFunc func(Flow) policy.Decision

// ProfilePolicy adapts a security profile to a PolicyFunc: TCP and UDP
// flows are decided by p.Decide(f.Request()), name lookups (ProtoDNS) by
// p.DecideName.
func ProfilePolicy(p *policy.Profile) PolicyFunc {
	return func(f Flow) policy.Decision {
		if f.Proto == ProtoDNS {
			return p.DecideName(f.Host)
		}
		return p.Decide(f.Request())
	}
}

// Event is something the audit log should hold: a refusal (Kind
// audit.KindNetRefused) or the summary of a flow that ended (Kind
// audit.KindNetFlow).
type Event struct {
	Kind     string
	Time     time.Time
	Flow     Flow
	Decision policy.Decision // what allowed or refused it; for refusals by the gateway itself Rule starts "netstack:"
	BytesOut int64           // guest → destination
	BytesIn  int64           // destination → guest
	Duration time.Duration
	Dropped  int64  // packets dropped by the UDP rate limit in the interval
	Count    int64  // a summarised refusal: how many times it happened in its window (drops.go)
	Err      string // why an allowed flow failed or ended abnormally

	// What an inspected flow named (see inspect.go), and for brokered
	// requests the credential used: names only, never a secret's value.
	SNI        string // TLS server name
	HTTPHost   string // HTTP Host (or absolute-form authority)
	Connect    string // HTTP CONNECT target
	Credential string // the profile's credential name
	Secret     string // the host store's secret name
	Header     string // the header the gateway set
	Format     string // the header value's template from the profile ("Bearer {}"), never the value
	Method     string
	Path       string // URL path, without the query
	// WebSocket is a client message on a brokered WebSocket session:
	// "text" or "binary", its payload size in BytesOut.
	WebSocket string
	// Usage is what a brokered model request cost (Kind
	// audit.KindCredUsage), and a refusal's provider when a budget is
	// spent.
	Usage *UsageReport
}

// UsageReport is one answer's usage and the credential's running totals
// after it.
type UsageReport struct {
	Provider usage.Provider
	Model    string
	Status   int
	Tokens   usage.Tokens
	Found    bool   // the answer carried usage
	Unread   string // why the answer could not be read (an encoding the gateway does not decode)
	Spent    usage.Spent
}

// Fields renders e as audit record fields.
func (e Event) Fields() map[string]any {
	m := map[string]any{}
	if e.Flow.Proto != "" {
		m["proto"] = e.Flow.Proto
	}
	addr := func(a netip.AddrPort) string {
		if a.Port() == 0 {
			return a.Addr().String() // a packet without ports (ICMP, other protocols)
		}
		return a.String()
	}
	if e.Flow.Src.IsValid() {
		m["src"] = addr(e.Flow.Src)
	}
	if e.Flow.Dst.IsValid() {
		m["dst"] = addr(e.Flow.Dst)
	}
	if e.Flow.Host != "" {
		m["host"] = e.Flow.Host
	}
	if e.Decision.Rule != "" {
		m["rule"] = e.Decision.Rule
	}
	if e.Decision.Reason != "" {
		m["reason"] = e.Decision.Reason
	}
	if e.Kind == audit.KindNetFlow {
		m["bytes_out"] = e.BytesOut
		m["bytes_in"] = e.BytesIn
		m["duration_ms"] = e.Duration.Milliseconds()
	}
	if e.WebSocket != "" {
		m["websocket"] = e.WebSocket
		m["bytes"] = e.BytesOut
	}
	if u := e.Usage; u != nil {
		if u.Provider != "" {
			m["provider"] = string(u.Provider)
		}
		if e.Kind == audit.KindCredUsage {
			if u.Model != "" {
				m["model"] = u.Model
			}
			m["status"] = u.Status
			m["input_tokens"] = u.Tokens.Input
			m["output_tokens"] = u.Tokens.Output
			m["cache_read_tokens"] = u.Tokens.CacheRead
			m["cache_write_tokens"] = u.Tokens.CacheWrite
			if !u.Found {
				m["usage_missing"] = true
			}
			if u.Unread != "" {
				m["usage_unread"] = u.Unread
			}
			m["total_requests"] = u.Spent.Requests
			m["total_tokens"] = u.Spent.Total()
			m["day_tokens"] = u.Spent.DayTokens
		}
	}
	if e.Dropped != 0 {
		m["dropped"] = e.Dropped
	}
	if e.Count != 0 {
		m["count"] = e.Count
	}
	if e.Err != "" {
		m["error"] = e.Err
	}
	if e.Format != "" && e.Format != "{}" {
		m["format"] = e.Format // how `smx profile learn` writes the binding again
	}
	for k, v := range map[string]string{"sni": e.SNI, "http_host": e.HTTPHost, "connect": e.Connect,
		"credential": e.Credential, "secret": e.Secret, "header": e.Header, "method": e.Method, "path": e.Path} {
		if v != "" {
			m[k] = v
		}
	}
	return m
}

func (e Event) String() string {
	s := e.Kind + " " + e.Flow.String()
	if e.Decision.Rule != "" {
		s += " [" + e.Decision.Rule + "]"
	}
	if e.Kind == audit.KindNetFlow {
		s += " out=" + strconv.FormatInt(e.BytesOut, 10) + " in=" + strconv.FormatInt(e.BytesIn, 10)
	}
	if e.SNI != "" {
		s += " sni=" + e.SNI
	}
	if e.HTTPHost != "" {
		s += " host=" + e.HTTPHost
	}
	if e.Connect != "" {
		s += " connect=" + e.Connect
	}
	if e.Credential != "" {
		s += " credential=" + e.Credential + " " + e.Method + " " + e.Path
	}
	if e.Err != "" {
		s += " err=" + e.Err
	}
	return s
}

// Builtin refusals made by the gateway itself, before or besides the policy.
const (
	RuleOtherResolver = "netstack: other resolver"
	RuleGatewayPort   = "netstack: gateway port not served"
	RuleMaxFlows      = "netstack: too many flows"
	RuleUDPRate       = "netstack: udp rate limit"
	RuleNoPolicy      = "netstack: no policy"
)
