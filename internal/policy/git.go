package policy

import (
	"fmt"
	"net/url"
	"path"
	"slices"
	"strconv"
	"strings"

	"github.com/smx-dev/smx/internal/errdefs"
)

// NormalizeRepo turns the ways a repository can be spelled into the one
// identity git rules are decided on: "forge/owner/name", lower case, no
// ".git" suffix. It accepts a bare "forge/owner/name", an https:// or ssh://
// URL (a user@ and a :port are dropped; the forge is the host) and
// scp-like "git@forge:owner/name". Percent-encodings are decoded once
// (%2e is "."), "//" and "." elements are dropped and ".." removes the
// element before it; a ".." above the repository path, an encoded "/" or
// "%" (double encoding), and control or glob characters are refused rather
// than guessed at. The Git gateways call it on what they are asked for, so
// a rule decides whatever spelling the guest chose. Errors are
// errdefs.ErrInvalid.
func NormalizeRepo(s string) (string, error) {
	repo, bad := normalizeRepo(s)
	if bad != "" {
		return "", fmt.Errorf("policy: repo %q: %w: %s", s, errdefs.ErrInvalid, bad)
	}
	return repo, nil
}

func normalizeRepo(s string) (string, string) {
	host, path := "", s
	switch {
	case strings.Contains(s, "://"):
		u, err := url.Parse(s)
		if err != nil || u.Host == "" || u.Opaque != "" {
			return "", "not a URL with a host"
		}
		if u.Scheme != "https" && u.Scheme != "http" && u.Scheme != "ssh" && u.Scheme != "git" {
			return "", "scheme " + u.Scheme + " is not https, http, ssh or git"
		}
		host, path = u.Hostname(), u.EscapedPath()
	default:
		// scp-like user@host:path, or forge/owner/name.
		if h, p, ok := strings.Cut(s, ":"); ok && !strings.Contains(h, "/") {
			if _, hh, ok := strings.Cut(h, "@"); ok {
				h = hh
			}
			host, path = h, p
		} else {
			if at := strings.IndexByte(s, '@'); at >= 0 && at < strings.IndexByte(s+"/", '/') {
				s = s[at+1:]
			}
			host, path, _ = strings.Cut(s, "/")
		}
	}
	clean, bad := CleanRepoPath(path)
	if bad != "" {
		return "", bad
	}
	return normRepo(strings.TrimSuffix(strings.ToLower(host), ".") + "/" + clean)
}

// CleanRepoPath decodes and cleans the path part of a repository address
// (see NormalizeRepo), keeping its case and any ".git" suffix so it can be
// forwarded as decided. It returns the path without leading or trailing
// slashes, or a reason it is refused.
func CleanRepoPath(p string) (string, string) {
	var out []string
	for _, el := range strings.Split(p, "/") {
		if strings.Contains(strings.ToLower(el), "%2f") || strings.Contains(strings.ToLower(el), "%5c") {
			return "", "an encoded / or \\ in the path"
		}
		dec, err := url.PathUnescape(el)
		if err != nil {
			return "", "bad percent-encoding"
		}
		if strings.ContainsAny(dec, "%\\") {
			return "", "% or \\ in the path (double encoding?)"
		}
		for i := 0; i < len(dec); i++ {
			if c := dec[i]; c < ' ' || c >= 0x7f {
				return "", "control or non-ASCII character in the path"
			}
		}
		switch dec {
		case "", ".":
		case "..":
			if len(out) == 0 {
				return "", ".. above the repository path"
			}
			out = out[:len(out)-1]
		default:
			out = append(out, dec)
		}
	}
	if len(out) == 0 {
		return "", "no repository path"
	}
	return strings.Join(out, "/"), ""
}

// IsForge reports whether host is a Git forge the profile names: the forge
// of a git repo rule (its first element, which may be a glob) or of a
// credential's forge binding. The gateway terminates TLS to these hosts so
// that git rules are enforced whatever else allowed the connection.
func (p *Profile) IsForge(host string) bool {
	host = strings.TrimSuffix(strings.ToLower(host), ".")
	if host == "" {
		return false
	}
	for i := range p.c.repos {
		if segs := p.c.repos[i].segs; len(segs) > 0 && forgeName(segs[0]) && matchDomain(segs[0], host) {
			return true
		}
	}
	for _, c := range p.Credentials {
		if c.Forge == host {
			return true
		}
	}
	return false
}

// forgeName reports whether a repo glob's first element names forges the
// way a domain rule names hosts: an exact host or "*." and a host of two
// or more labels. Other globs ("**", "*", "git*") match hosts for deciding
// but name no forge: the gateway does not take over every HTTPS
// connection on their account.
func forgeName(el string) bool {
	rest := strings.TrimPrefix(el, "*.")
	return !strings.ContainsAny(rest, "*?") && strings.Contains(rest, ".") && checkHostname(rest) == ""
}

// HasForges reports whether the profile names any Git forge (see IsForge).
func (p *Profile) HasForges() bool {
	for i := range p.c.repos {
		if segs := p.c.repos[i].segs; len(segs) > 0 && forgeName(segs[0]) {
			return true
		}
	}
	for _, c := range p.Credentials {
		if c.Forge != "" {
			return true
		}
	}
	return false
}

// HasMatchers reports whether c is limited to the requests its Methods
// and Paths match.
func (c Credential) HasMatchers() bool {
	return len(c.Methods) > 0 || len(c.Paths) > 0 || len(c.Headers) > 0
}

// Denies reports whether a request to rawPath (as sent, still
// percent-encoded) on c's domain is refused outright: its path matches
// one of DenyPaths. The path is decoded once, "." and ".." elements and
// repeated slashes are resolved as a server would, and the match ignores
// case, so no other spelling of a denied endpoint gets by; a path that
// does not decode is denied too, when there are DenyPaths.
func (c Credential) Denies(rawPath string) bool {
	if len(c.DenyPaths) == 0 {
		return false
	}
	dec, err := url.PathUnescape(rawPath)
	if err != nil {
		return true
	}
	p := strings.ToLower(path.Clean("/" + strings.ReplaceAll(dec, "\\", "/")))
	for _, g := range c.DenyPaths {
		if matchSegments(splitGlob(strings.ToLower(g)), strings.TrimPrefix(p, "/")) {
			return true
		}
	}
	return false
}

// MatchRequest reports whether an HTTP request may carry c: its method is
// one of Methods, its path matches one of Paths, and every Headers entry
// matches a value of that header (header is keyed by canonical names, as
// http.Header is); an empty list matches anything. rawPath is the request's path as sent (still
// percent-encoded). It is decoded once and matched whole; a path with an
// empty, "." or ".." element, an encoded "/" or "\", or a "%" left after
// decoding matches no path rule, so a request cannot be steered to
// another resource after it matched.
func (c Credential) MatchRequest(method, rawPath string, header map[string][]string) bool {
	if len(c.Methods) > 0 && !slices.Contains(c.Methods, method) {
		return false
	}
	for _, h := range c.Headers {
		if !slices.ContainsFunc(header[h.Name], func(v string) bool { return matchElement(h.Value, v) }) {
			return false
		}
	}
	if len(c.Paths) == 0 {
		return true
	}
	low := strings.ToLower(rawPath)
	if !strings.HasPrefix(rawPath, "/") || strings.Contains(low, "%2f") || strings.Contains(low, "%5c") {
		return false
	}
	dec, err := url.PathUnescape(rawPath)
	if err != nil || strings.ContainsAny(dec, "%\\") {
		return false
	}
	p := dec[1:]
	if p != "" {
		for _, el := range strings.Split(p, "/") {
			if el == "" || el == "." || el == ".." {
				return false
			}
		}
	}
	for _, g := range c.Paths {
		if matchSegments(splitGlob(g), p) {
			return true
		}
	}
	return false
}

// DecidePushOption decides one push option (`git push -o NAME[=VALUE]`,
// as the client sent it) on a push to repo: allowed when a git rule
// matching repo lists NAME (or a glob matching it) in push_options.
// Options ask the forge for things besides ref updates (GitLab's
// merge_request.create, ci.variable=...), so none is allowed unless
// named; the value is not decided.
func (p *Profile) DecidePushOption(repo, option string) Decision {
	name, _, _ := strings.Cut(option, "=")
	if !validOptionName(name) {
		return deny("builtin: malformed request", "push option "+strconv.Quote(option)+" has no plain name")
	}
	norm, bad := normRepo(repo)
	if bad != "" {
		return deny("builtin: malformed request", "repo "+strconv.Quote(repo)+": "+bad)
	}
	for i := range p.c.repos {
		rr := &p.c.repos[i]
		if !matchSegments(rr.segs, norm) {
			continue
		}
		for _, g := range rr.pushOptions {
			if matchElement(g, name) {
				return allow(rr.rule, "push option "+name+" is allowed on "+norm)
			}
		}
	}
	return deny(ruleDefault, "push option "+name+" is not allowed on "+norm+"; a git rule for it must list it in push_options")
}

func validOptionName(s string) bool {
	if s == "" || len(s) > 256 {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}

// DefaultDeny reports whether d is the verdict for a request no rule
// decided (default deny), rather than one a rule denied or allowed.
func (d Decision) DefaultDeny() bool { return !d.Allow && d.Rule == ruleDefault }

// UnreachableForge is a forge the profile's git rules or credentials name
// that its network rules do not let the guest reach over HTTPS.
type UnreachableForge struct {
	Forge    string   // the forge's host
	Pos      Pos      // where it is named first
	Named    string   // what names it: `git.repos[0] repo github.com/acme/*` or `credential gh`
	Decision Decision // the network rules' refusal of TCP to the forge on port 443
}

func (u UnreachableForge) String() string {
	how := "add a network.allow rule `domain: " + u.Forge + "` with `ports: [443]`"
	if u.Decision.Rule != ruleDefault {
		how = "the rule " + u.Decision.Rule + " refuses it"
	}
	return u.Pos.String() + ": " + u.Named + " names the forge " + u.Forge +
		", but the network rules do not allow HTTPS to it (" + u.Decision.Reason + "), so the guest cannot resolve or reach it: " + how
}

// UnreachableForges lists, once each, the forges named by a git rule that
// allows something or by a forge credential, whose exact host the network
// rules refuse on TCP port 443. Naming a forge in git opens no network
// path to it (the network section alone decides what the guest reaches;
// the git section decides what Git may do there), so such a forge is
// named in vain; `smx profile check` says so. Wildcard forges
// ("*.corp.example") are not checked: the hosts they mean are not known.
func (p *Profile) UnreachableForges() []UnreachableForge {
	var out []UnreachableForge
	seen := map[string]bool{}
	check := func(forge string, pos Pos, named string) {
		if seen[forge] || strings.HasPrefix(forge, "*.") {
			return
		}
		seen[forge] = true
		// An ask opens it once the host user answers: not unreachable.
		if d := p.Decide(Request{Kind: KindNet, Proto: "tcp", Host: forge, Port: 443}); !d.Allow && !d.Ask {
			d.Reason = strings.TrimSuffix(d.Reason, p.forgeHint(forge)) // String says it
			out = append(out, UnreachableForge{Forge: forge, Pos: pos, Named: named, Decision: d})
		}
	}
	for i, r := range p.Git.Repos {
		segs := splitGlob(r.Repo)
		if len(segs) == 0 || !forgeName(segs[0]) || !r.allowsAny() {
			continue
		}
		where := r.Where
		if where == "" {
			where = "git.repos[" + strconv.Itoa(i) + "]"
		}
		check(strings.ToLower(segs[0]), r.Pos, where+" repo "+r.Repo)
	}
	for _, c := range p.Credentials {
		if c.Forge != "" {
			check(c.Forge, c.Pos, "credential "+c.Name)
		}
	}
	return out
}

// allowsAny reports whether r allows some Git access.
func (r RepoRule) allowsAny() bool {
	for _, v := range []Verdict{r.Read, r.Push, r.Delete, r.ForcePush} {
		if v == Allow {
			return true
		}
	}
	for _, f := range r.Refs {
		if f.Push == Allow || f.Delete == Allow || f.ForcePush == Allow {
			return true
		}
	}
	return false
}
