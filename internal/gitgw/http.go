package gitgw

import (
	"bytes"
	"compress/gzip"
	"encoding/base64"
	"errors"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strconv"
	"strings"
	"sync/atomic"

	"github.com/smx-dev/smx/internal/audit"
	"github.com/smx-dev/smx/internal/policy"
)

// Config wires a Gateway to the host.
type Config struct {
	// Secret reads a credential's value from the host store by name.
	Secret func(name string) ([]byte, error)
	// Log receives git.* and cred.use records (names, never values).
	Log func(kind string, fields map[string]any)
	// Mirrors caches the forge's history for fast-forward checks.
	Mirrors *Mirrors
	// Ask puts a ref update a rule says ask about to the host user
	// (AskRefs); nil refuses it.
	Ask AskFunc
}

// Gateway enforces a profile's git rules on Git smart HTTP. It is safe for
// concurrent use; SetProfile swaps the profile for requests that start
// afterwards.
type Gateway struct {
	cfg     Config
	profile atomic.Pointer[policy.Profile]
}

// New returns a Gateway deciding with p.
func New(cfg Config, p *policy.Profile) *Gateway {
	g := &Gateway{cfg: cfg}
	g.profile.Store(p)
	return g
}

// SetProfile replaces the profile.
func (g *Gateway) SetProfile(p *policy.Profile) { g.profile.Store(p) }

// IsForge reports whether the profile names host as a Git forge, so the
// network gateway must hand its HTTPS to Handler.
func (g *Gateway) IsForge(host string) bool {
	p := g.profile.Load()
	return p != nil && p.IsForge(host)
}

func (g *Gateway) log(kind string, f map[string]any) {
	if g.cfg.Log != nil {
		g.cfg.Log(kind, f)
	}
}

// Handler serves one guest connection's HTTP/1.1 requests to forge host
// (the TLS server name the guest asked for; the network gateway has
// terminated its TLS). base is https://host[:port]; rt reaches the
// address the guest dialled over TLS verified for host.
func (g *Gateway) Handler(host string, base *url.URL, rt http.RoundTripper) http.Handler {
	s := &session{g: g, host: host, base: base, rt: rt}
	return http.HandlerFunc(s.serve)
}

type session struct {
	g    *Gateway
	host string
	base *url.URL
	rt   http.RoundTripper
}

var discardLog = log.New(io.Discard, "", 0)

// Bounds on what a guest may send: an upload-pack request is held in
// memory, a pushed pack is spooled to a temporary file.
const (
	maxFetchRequest = 64 << 20
	maxPack         = 2 << 30
)

// target is a smart-HTTP request: which repository, which service.
type target struct {
	repo    string // identity for policy: forge/owner/name
	path    string // cleaned path to forward, without the service suffix
	service string // git-upload-pack or git-receive-pack
	advert  bool   // GET info/refs
}

// parseTarget recognises Git smart HTTP. git reports whether the request
// is (or pretends to be) a Git request; bad says why such a request is
// refused.
func parseTarget(forge string, r *http.Request) (t target, git bool, bad string) {
	raw := r.URL.EscapedPath()
	dec, _ := url.PathUnescape(raw)
	low := strings.ToLower(dec)
	if !strings.Contains(low, "git-upload-pack") && !strings.Contains(low, "git-receive-pack") && !strings.Contains(low, "info/refs") {
		return t, false, ""
	}
	clean, msg := policy.CleanRepoPath(raw)
	if msg != "" {
		return t, true, "path " + strconv.Quote(truncate(raw, 200)) + ": " + msg
	}
	switch {
	case strings.HasSuffix(clean, "/info/refs"):
		if r.Method != http.MethodGet {
			return t, true, "info/refs wants GET"
		}
		q := r.URL.Query()["service"]
		if len(q) != 1 || (q[0] != "git-upload-pack" && q[0] != "git-receive-pack") {
			return t, true, "dumb HTTP is not served; info/refs needs ?service=git-upload-pack or git-receive-pack"
		}
		t.service, t.advert, t.path = q[0], true, strings.TrimSuffix(clean, "/info/refs")
	case strings.HasSuffix(clean, "/git-upload-pack"), strings.HasSuffix(clean, "/git-receive-pack"):
		if r.Method != http.MethodPost {
			return t, true, "service requests want POST"
		}
		i := strings.LastIndexByte(clean, '/')
		t.service, t.path = clean[i+1:], clean[:i]
	default:
		return t, true, "not a smart-HTTP Git request"
	}
	repo, err := policy.NormalizeRepo(forge + "/" + t.path)
	if err != nil {
		return t, true, err.Error()
	}
	t.repo = repo
	return t, true, ""
}

func (s *session) serve(w http.ResponseWriter, r *http.Request) {
	if h := hostOnly(r.Host); h != s.host {
		s.g.log(audit.KindGitRefused, map[string]any{"forge": s.host, "http_host": r.Host, "method": r.Method, "path": r.URL.Path,
			"rule": RuleMalformed, "reason": "HTTP Host " + strconv.Quote(r.Host) + " is not the TLS server name " + s.host})
		http.Error(w, "smx: Host does not match the TLS server name", http.StatusMisdirectedRequest)
		return
	}
	p := s.g.profile.Load()
	t, isGit, bad := parseTarget(s.host, r)
	if !isGit {
		if s.underRepo(w, r, p) {
			return
		}
		s.other(w, r, p)
		return
	}
	if bad != "" && r.Method != http.MethodPost && len(r.URL.Query()["service"]) == 0 && s.underRepo(w, r, p) {
		return // dumb HTTP's info/refs, refused with its repository's rule
	}
	if bad != "" {
		s.g.log(audit.KindGitRefused, map[string]any{"forge": s.host, "method": r.Method, "path": r.URL.Path,
			"rule": RuleMalformed, "reason": bad})
		gitError(w, r, "git-upload-pack", true, "smx: refused: "+bad)
		return
	}
	rd := p.Decide(policy.Request{Kind: policy.KindGit, Access: "read", Repo: t.repo})
	fields := map[string]any{"repo": t.repo, "service": t.service, "rule": rd.Rule}
	if !rd.Allow {
		fields["reason"], fields["op"] = rd.Reason, opName(t)
		s.g.log(audit.KindGitRefused, fields)
		gitError(w, r, t.service, t.advert, ReadRefusal(t.repo, rd, p.Name))
		return
	}
	auth, cred, err := s.credential(p, t.repo)
	if cred.Name != "" {
		fields["credential"], fields["secret"] = cred.Name, cred.From
	}
	if err != nil {
		fields["reason"], fields["rule"], fields["op"] = err.Error(), "gitgw: credential missing", opName(t)
		s.g.log(audit.KindGitRefused, fields)
		gitError(w, r, t.service, t.advert, "smx: credential "+cred.Name+" for "+s.host+" is not available on the host: "+err.Error())
		return
	}
	switch {
	case t.advert:
		s.proxy(w, r, t, auth)
	case t.service == "git-upload-pack":
		s.fetch(w, r, t, auth, fields)
	default:
		s.push(w, r, p, t, auth, cred, fields)
	}
}

func opName(t target) string {
	if t.service == "git-receive-pack" {
		return "push"
	}
	return "fetch"
}

func hostOnly(h string) string {
	if host, _, err := net.SplitHostPort(h); err == nil {
		h = host
	}
	return strings.TrimSuffix(strings.ToLower(h), ".")
}

// credential returns the Authorization value for the forge's credential,
// if the profile binds one.
func (s *session) credential(p *policy.Profile, repo string) (string, policy.Credential, error) {
	cred, ok := p.CredentialFor(policy.Request{Kind: policy.KindGit, Repo: repo})
	if !ok {
		return "", cred, nil
	}
	if s.g.cfg.Secret == nil {
		return "", cred, errors.New("no credential store")
	}
	b, err := s.g.cfg.Secret(cred.From)
	if err != nil {
		return "", cred, err
	}
	v := strings.TrimRight(string(b), "\r\n")
	if v == "" {
		return "", cred, errors.New("the secret is empty")
	}
	if !strings.Contains(v, ":") {
		v = "x-access-token:" + v // the user name forges accept with a token
	}
	return "Basic " + base64.StdEncoding.EncodeToString([]byte(v)), cred, nil
}

// gitError answers in Git's own error channel: an ERR pkt-line, which the
// client prints as "remote error: MSG".
func gitError(w http.ResponseWriter, r *http.Request, service string, advert bool, msg string) {
	if advert {
		w.Header().Set("Content-Type", "application/x-"+service+"-advertisement")
	} else {
		w.Header().Set("Content-Type", "application/x-"+service+"-result")
	}
	w.Header().Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	w.Write(ErrLine(msg))
}

// upstreamURL is where t's request goes: the cleaned path (what was
// decided), never the guest's spelling.
func (s *session) upstreamURL(t target) *url.URL {
	u := *s.base
	if t.advert {
		u.Path = "/" + t.path + "/info/refs"
		u.RawQuery = "service=" + t.service
	} else {
		u.Path = "/" + t.path + "/" + t.service
		u.RawQuery = ""
	}
	u.RawPath = ""
	return &u
}

type countWriter struct {
	http.ResponseWriter
	n int64
}

func (c *countWriter) Write(p []byte) (int, error) {
	n, err := c.ResponseWriter.Write(p)
	c.n += int64(n)
	return n, err
}

func (c *countWriter) Flush() {
	if f, ok := c.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

// proxy forwards r to t's upstream URL with auth (if any) in place of
// whatever the guest sent, streaming the answer back. It returns the
// bytes sent to the guest and the upstream status.
func (s *session) proxy(w http.ResponseWriter, r *http.Request, t target, auth string) (int64, int) {
	cw := &countWriter{ResponseWriter: w}
	status := 0
	rp := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.Out.URL = s.upstreamURL(t)
			pr.Out.Host = r.Host
			if auth != "" {
				pr.Out.Header.Set("Authorization", auth)
			}
		},
		Transport:     s.rt,
		FlushInterval: -1,
		ErrorLog:      discardLog,
		ModifyResponse: func(resp *http.Response) error {
			status = resp.StatusCode
			return nil
		},
		ErrorHandler: func(w http.ResponseWriter, _ *http.Request, err error) {
			status = http.StatusBadGateway
			http.Error(w, "smx: forge "+s.host+": "+err.Error(), http.StatusBadGateway)
		},
	}
	rp.ServeHTTP(cw, r)
	return cw.n, status
}

// fetch forwards an upload-pack request and logs it (a clone or fetch is a
// request that wants objects; v2 ls-refs is not logged on its own).
func (s *session) fetch(w http.ResponseWriter, r *http.Request, t target, auth string, fields map[string]any) {
	body, err := io.ReadAll(io.LimitReader(r.Body, maxFetchRequest+1))
	if err != nil {
		return
	}
	if len(body) > maxFetchRequest {
		fields["op"], fields["rule"], fields["reason"] = "fetch", RuleMalformed, "upload-pack request over 64 MiB"
		s.g.log(audit.KindGitRefused, fields)
		gitError(w, r, t.service, false, "smx: refused: upload-pack request over 64 MiB")
		return
	}
	r.Body.Close()
	r.Body = io.NopCloser(bytes.NewReader(body))
	r.ContentLength = int64(len(body))
	r.TransferEncoding = nil // the whole body is known: sent with a length, as some servers require
	info := parseFetch(body, r.Header.Get("Content-Encoding") == "gzip")
	n, status := s.proxy(w, r, t, auth)
	if info.wants == 0 {
		return
	}
	fetchFields(fields, info, strings.Contains(r.Header.Get("Git-Protocol"), "version=2"), n)
	fields["status"] = status
	s.g.log(audit.KindGitFetch, fields)
}

type fetchInfo struct {
	wants, haves int
	ids, refs    []string
	depth        string
}

// parseFetch reads what an upload-pack request asks for, for the log.
func parseFetch(body []byte, gz bool) fetchInfo {
	var r io.Reader = bytes.NewReader(body)
	if gz {
		zr, err := gzip.NewReader(r)
		if err != nil {
			return fetchInfo{}
		}
		r = io.LimitReader(zr, 64<<20)
	}
	var fi fetchInfo
	pr := &PktReader{R: r}
	for {
		typ, line, err := pr.ReadPkt()
		if err != nil {
			return fi
		}
		if typ != PktData {
			continue
		}
		s := strings.TrimSuffix(string(line), "\n")
		switch {
		case strings.HasPrefix(s, "want "):
			fi.wants++
			if id, _, _ := strings.Cut(s[5:], " "); len(fi.ids) < 20 {
				fi.ids = append(fi.ids, id)
			}
		case strings.HasPrefix(s, "want-ref "):
			fi.wants++
			if len(fi.refs) < 20 {
				fi.refs = append(fi.refs, s[9:])
			}
		case strings.HasPrefix(s, "have "):
			fi.haves++
		case strings.HasPrefix(s, "deepen"):
			fi.depth = s
		}
	}
}

// other handles a request to the forge host that is not Git smart HTTP
// (the forge's web pages or API on the same name): forwarded as sent. The
// forge credential goes with it only when the credential has request
// matchers (methods:, paths:) and the request matches them; otherwise it
// goes as the guest sent it.
func (s *session) other(w http.ResponseWriter, r *http.Request, p *policy.Profile) {
	auth := ""
	for _, c := range p.Credentials {
		if c.Forge != s.host || !c.HasMatchers() || !c.MatchRequest(r.Method, r.URL.EscapedPath(), r.Header) {
			continue
		}
		a, _, err := s.credential(p, s.host+"/_")
		if err != nil {
			s.g.log(audit.KindGitRefused, map[string]any{"forge": s.host, "method": r.Method, "path": r.URL.Path,
				"credential": c.Name, "secret": c.From, "rule": "gitgw: credential missing", "reason": err.Error()})
			http.Error(w, "smx: credential "+c.Name+" for "+s.host+" is not available on the host", http.StatusBadGateway)
			return
		}
		auth = a
		s.g.log(audit.KindCredUse, map[string]any{"credential": c.Name, "secret": c.From, "header": "Authorization", "forge": s.host,
			"host": s.host, "method": r.Method, "path": r.URL.Path})
		break
	}
	rp := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(s.base)
			pr.Out.Host = r.Host
			if auth != "" {
				pr.Out.Header.Set("Authorization", auth)
			}
		},
		Transport:     s.rt,
		FlushInterval: -1,
		ErrorLog:      discardLog,
		ErrorHandler: func(w http.ResponseWriter, _ *http.Request, err error) {
			http.Error(w, "smx: forge "+s.host+": "+err.Error(), http.StatusBadGateway)
		},
	}
	rp.ServeHTTP(w, r)
}

// underRepo decides a request that is not Git smart HTTP by the rules of
// the repository its path lies under, and answers it when it is refused
// (reporting true). Where a repository's path ends is not written in a
// URL, so every leading run of path elements is taken as a repository
// that might be meant, the path decoded and cleaned as a server would
// (also decoded twice when a "%" is left):
//
//   - a path under a repository that a rule denies reading is refused,
//     whatever follows (dumb HTTP, an archive, a web page);
//   - Git's own files under a repository (HEAD, config, description,
//     packed-refs, refs/..., info/..., objects/...: dumb HTTP) are
//     refused: the gateway serves only smart HTTP, which it decides per
//     repository and ref. A path whose repository the profile names by no
//     rule counts when the repository is spelled with ".git" or the file
//     is one only Git serves (objects/..., info/...); HEAD, config, refs/
//     under a repository no rule names may be the forge's web pages;
//   - Git LFS (REPO/info/lfs/...) needs the repository to be readable.
//
// Every refusal is a git.refused record with the rule that made it.
func (s *session) underRepo(w http.ResponseWriter, r *http.Request, p *policy.Profile) bool {
readings:
	for _, els := range pathReadings(r.URL.EscapedPath()) {
		if len(els) > 64 {
			return s.refuseDumb(w, r, p, "", "path", policy.Decision{Rule: RuleMalformed, Reason: "more than 64 path elements"})
		}
		ds := make([]policy.Decision, len(els)+1)
		repos := make([]string, len(els)+1)
		for i := 1; i <= len(els); i++ {
			repo, err := policy.NormalizeRepo(s.host + "/" + strings.Join(els[:i], "/"))
			if err != nil {
				ds[i] = policy.Decision{Rule: RuleMalformed, Reason: err.Error()}
				continue
			}
			repos[i] = repo
			ds[i] = p.Decide(policy.Request{Kind: policy.KindGit, Access: "read", Repo: repo})
			if !ds[i].Allow && !ds[i].DefaultDeny() {
				return s.refuseDumb(w, r, p, repo, "read", ds[i])
			}
		}
		for i := 1; i < len(els); i++ {
			if repos[i] == "" {
				continue
			}
			kind, sure := gitFile(els[i:])
			dotGit := strings.HasSuffix(strings.ToLower(els[i-1]), ".git")
			switch {
			case kind == "" && !dotGit:
				continue
			case kind == "lfs":
				if !ds[i].Allow {
					return s.refuseDumb(w, r, p, repos[i], "lfs", ds[i])
				}
				continue readings
			case !sure && !dotGit && ds[i].DefaultDeny():
				continue
			case !ds[i].Allow:
				return s.refuseDumb(w, r, p, repos[i], "dumb-http", ds[i])
			}
			return s.refuseDumb(w, r, p, repos[i], "dumb-http", policy.Decision{Rule: RuleDumbHTTP,
				Reason: "dumb HTTP is not served; Git must use smart HTTP (" + repos[i] + ")"})
		}
	}
	return false
}

// RuleDumbHTTP is the gateway's refusal of Git's dumb HTTP protocol.
const RuleDumbHTTP = "gitgw: dumb HTTP"

func (s *session) refuseDumb(w http.ResponseWriter, r *http.Request, p *policy.Profile, repo, op string, d policy.Decision) bool {
	f := map[string]any{"forge": s.host, "method": r.Method, "path": truncate(r.URL.EscapedPath(), 512), "op": op,
		"rule": d.Rule, "reason": d.Reason}
	msg := "smx: refused: " + d.Reason
	if repo != "" {
		f["repo"] = repo
		if d.Rule != RuleDumbHTTP && d.Rule != RuleMalformed {
			msg = ReadRefusal(repo, d, p.Name)
		}
	}
	s.g.log(audit.KindGitRefused, f)
	http.Error(w, msg, http.StatusForbidden)
	return true
}

// pathReadings is a request path as a server may read it: decoded once
// (%2F too) and cleaned of "", "." and ".." elements, and, when a "%" is
// left, decoded once more. A path that does not decode is read as is.
func pathReadings(raw string) [][]string {
	var out [][]string
	for range 2 {
		dec, err := url.PathUnescape(raw)
		if err != nil {
			dec = raw
		}
		out = append(out, cleanElems(strings.ReplaceAll(dec, "\\", "/")))
		if !strings.Contains(dec, "%") || err != nil {
			break
		}
		raw = dec
	}
	return out
}

func cleanElems(p string) []string {
	var out []string
	for _, el := range strings.Split(p, "/") {
		switch el {
		case "", ".":
		case "..":
			if len(out) > 0 {
				out = out[:len(out)-1]
			}
		default:
			out = append(out, el)
		}
	}
	return out
}

// gitFile reports whether tail names a file in a Git repository as dumb
// HTTP or Git LFS asks for it: kind is "dumb" or "lfs" (or ""), and sure
// says that only Git serves such a path (objects/..., info/...), where
// HEAD, config, description, packed-refs and refs/... may also be a
// forge's web page.
func gitFile(tail []string) (kind string, sure bool) {
	low := make([]string, len(tail))
	for i, el := range tail {
		low[i] = strings.ToLower(el)
	}
	switch low[0] {
	case "info":
		switch {
		case len(low) < 2:
		case low[1] == "lfs":
			return "lfs", true
		case low[1] == "refs" || low[1] == "packs" || low[1] == "alternates" || low[1] == "http-alternates" ||
			low[1] == "attributes" || low[1] == "exclude" || low[1] == "grafts" || low[1] == "sparse-checkout":
			return "dumb", true
		}
	case "objects":
		if len(low) >= 3 && (low[1] == "info" || low[1] == "pack" || len(low[1]) == 2 && isHex(low[1])) {
			return "dumb", true
		}
	case "refs":
		if len(low) >= 2 {
			return "dumb", false
		}
	case "head", "config", "description", "packed-refs", "fetch_head", "orig_head", "shallow", "commondir", "alternates":
		if len(low) == 1 {
			return "dumb", false
		}
	}
	return "", false
}

func isHex(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
	}
	return true
}

// HasForges reports whether the profile names any forge.
func (g *Gateway) HasForges() bool {
	p := g.profile.Load()
	return p != nil && p.HasForges()
}
