package policy

import (
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"strconv"
	"strings"

	"github.com/smx-dev/smx/internal/errdefs"
)

// Kind says which section of a profile decides a request.
type Kind uint8

const (
	KindNet  Kind = iota + 1 // a TCP or UDP flow from the guest
	KindFile                 // a file access through the file gateway
	KindGit                  // a Git operation through the Git gateway
	KindSSH                  // an SSH connection through the SSH gateway
)

func (k Kind) String() string {
	switch k {
	case KindNet:
		return "net"
	case KindFile:
		return "file"
	case KindGit:
		return "git"
	case KindSSH:
		return "ssh"
	}
	return "kind(" + strconv.Itoa(int(k)) + ")"
}

// Request is one thing a sandbox attempts. Which fields matter depends on
// Kind:
//
//   - KindNet: Proto ("tcp" or "udp"; "" means tcp), Host (the name the guest
//     asked for, if any) and/or IP (the address actually dialled), Port.
//     A gateway that knows both must pass both: domain rules match Host,
//     CIDR rules and the always-closed ranges match IP.
//   - KindFile: Path (absolute guest path), Access "ro" or "rw".
//   - KindGit: Repo ("forge/owner/name", ".git" suffix ignored), Access "read",
//     "push", "delete" or "force-push", Ref (full ref name; not for read).
//   - KindSSH: Host (name or IP literal) and/or IP, User, Port (0 means 22).
type Request struct {
	Kind   Kind
	Proto  string
	Host   string
	IP     netip.Addr
	Port   uint16
	Path   string
	Access string
	Repo   string
	Ref    string
	User   string
}

// Decision is the verdict on a Request. Rule names what decided it: a
// profile rule as "file:line:col section[i] description", a built-in as
// "builtin: ...", or "default deny". Reason says why in words.
//
// Ask (never with Allow) says the rule that matched says `ask`: the
// gateway holds the request and puts the question to the host user. A
// gateway that cannot hold a request treats Ask as a refusal, which is
// what !Allow already says.
type Decision struct {
	Allow  bool
	Ask    bool
	Rule   string
	Reason string
}

const ruleDefault = "default deny"

// String renders a request in the form ParseRequest reads.
func (r Request) String() string {
	hostport := func(def uint16) string {
		h := r.Host
		if h == "" && r.IP.IsValid() {
			h = r.IP.String()
		}
		if r.Port == 0 && def != 0 {
			return net.JoinHostPort(h, strconv.Itoa(int(def)))
		}
		return net.JoinHostPort(h, strconv.Itoa(int(r.Port)))
	}
	switch r.Kind {
	case KindNet:
		proto := r.Proto
		if proto == "" {
			proto = "tcp"
		}
		return proto + ":" + hostport(0)
	case KindFile:
		return "file:" + r.Access + ":" + r.Path
	case KindGit:
		s := "git:" + r.Access + ":" + r.Repo
		if r.Ref != "" {
			s += ":" + r.Ref
		}
		return s
	case KindSSH:
		return "ssh:" + r.User + "@" + hostport(22)
	}
	return fmt.Sprintf("%#v", r)
}

// ParseRequest reads the request notation of `smx profile explain`:
//
//	https://api.example.com/v1      tcp to port 443 (http:// → 80; an explicit :port wins)
//	tcp:10.0.0.5:5432               udp:1.1.1.1:53    tcp:[2001:db8::1]:443
//	file:rw:/work/app/.env          file:ro:/work/app/README.md
//	git:read:github.com/acme/app    git:push:github.com/acme/app:refs/heads/main
//	git:delete:REPO:REF             git:force-push:REPO:REF
//	ssh:deploy@build1:22            ssh:deploy@build1 (port 22)
//
// IP addresses must be in standard form: decimal, octal or hex spellings
// such as 2130706433 or 0177.0.0.1 are rejected, not guessed at. Errors are
// errdefs.ErrInvalid.
func ParseRequest(s string) (Request, error) {
	r, err := parseRequest(strings.TrimSpace(s))
	if err != nil {
		return Request{}, fmt.Errorf("policy: request %q: %w: %v", s, errdefs.ErrInvalid, err)
	}
	return r, nil
}

func parseRequest(s string) (Request, error) {
	scheme, rest, ok := strings.Cut(s, ":")
	if !ok {
		return Request{}, fmt.Errorf("want KIND:..., e.g. https://HOST/, tcp:HOST:PORT, file:rw:PATH, git:push:REPO:REF, ssh:USER@HOST:PORT")
	}
	switch strings.ToLower(scheme) {
	case "http", "https":
		u, err := url.Parse(s)
		if err != nil {
			return Request{}, err
		}
		if u.Host == "" {
			return Request{}, fmt.Errorf("no host in URL")
		}
		port := uint16(443)
		if strings.EqualFold(u.Scheme, "http") {
			port = 80
		}
		if p := u.Port(); p != "" {
			n, err := parsePort(p)
			if err != nil {
				return Request{}, err
			}
			port = n
		}
		r := Request{Kind: KindNet, Proto: "tcp", Port: port}
		return r, setHost(&r, u.Hostname())
	case "tcp", "udp":
		h, p, err := net.SplitHostPort(rest)
		if err != nil {
			return Request{}, fmt.Errorf("want %s:HOST:PORT: %v", scheme, err)
		}
		port, err := parsePort(p)
		if err != nil {
			return Request{}, err
		}
		r := Request{Kind: KindNet, Proto: strings.ToLower(scheme), Port: port}
		return r, setHost(&r, h)
	case "file":
		access, p, ok := strings.Cut(rest, ":")
		if !ok || (access != "ro" && access != "rw") || !strings.HasPrefix(p, "/") {
			return Request{}, fmt.Errorf("want file:ro:/ABS/PATH or file:rw:/ABS/PATH")
		}
		return Request{Kind: KindFile, Access: access, Path: p}, nil
	case "git":
		parts := strings.Split(rest, ":")
		if len(parts) < 2 || len(parts) > 3 {
			return Request{}, fmt.Errorf("want git:ACCESS:FORGE/OWNER/REPO[:REF]")
		}
		r := Request{Kind: KindGit, Access: parts[0], Repo: parts[1]}
		if len(parts) == 3 {
			r.Ref = parts[2]
		}
		switch r.Access {
		case "read":
			if r.Ref != "" {
				return Request{}, fmt.Errorf("git:read takes no ref")
			}
		case "push", "delete", "force-push":
			if r.Ref == "" {
				return Request{}, fmt.Errorf("git:%s needs a ref, e.g. refs/heads/main", r.Access)
			}
		default:
			return Request{}, fmt.Errorf("git access %q is not read, push, delete or force-push", r.Access)
		}
		if _, bad := normRepo(r.Repo); bad != "" {
			return Request{}, fmt.Errorf("repo %q: %s", r.Repo, bad)
		}
		if r.Ref != "" {
			if bad := checkRefName(r.Ref); bad != "" {
				return Request{}, fmt.Errorf("ref %q: %s", r.Ref, bad)
			}
		}
		return r, nil
	case "ssh":
		user, hp, ok := strings.Cut(rest, "@")
		if !ok || user == "" {
			return Request{}, fmt.Errorf("want ssh:USER@HOST[:PORT]")
		}
		r := Request{Kind: KindSSH, User: user, Port: 22}
		h := hp
		if strings.HasPrefix(hp, "[") || strings.Count(hp, ":") == 1 {
			var p string
			var err error
			h, p, err = net.SplitHostPort(hp)
			if err != nil {
				if !strings.HasPrefix(hp, "[") || !strings.HasSuffix(hp, "]") {
					return Request{}, fmt.Errorf("want ssh:USER@HOST[:PORT]: %v", err)
				}
				h = strings.Trim(hp, "[]")
			} else if r.Port, err = parsePort(p); err != nil {
				return Request{}, err
			}
		}
		return r, setHost(&r, h)
	}
	return Request{}, fmt.Errorf("unknown kind %q: want https, http, tcp, udp, file, git or ssh", scheme)
}

// setHost puts a name in r.Host or an IP literal in r.IP, refusing
// ambiguous spellings.
func setHost(r *Request, h string) error {
	host, ip, bad := splitHost(h)
	if bad != "" {
		return fmt.Errorf("host %q: %s", h, bad)
	}
	if host == "" && !ip.IsValid() {
		return fmt.Errorf("no host")
	}
	r.Host, r.IP = host, ip
	return nil
}
