package netstack

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"gvisor.dev/gvisor/pkg/tcpip/adapters/gonet"

	"github.com/smx-dev/smx/internal/audit"
	"github.com/smx-dev/smx/internal/netstack/sniff"
	"github.com/smx-dev/smx/internal/policy"
)

// Plain HTTP on a flow a domain rule allowed: every request is decided,
// not only the first. A keep-alive connection to an allowed front end
// could otherwise carry a second request naming any host served there.
//
// Splitting a byte stream into requests the way the upstream will is what
// request smuggling attacks: a gateway and a server that disagree about
// where a body ends see different requests. So the gateway does not guess
// at framing; it is the guest's HTTP server (Go's net/http, which refuses
// ambiguous framing such as conflicting Content-Length values), decides
// each request's Host, and forwards it through httputil.ReverseProxy to
// the address the guest dialled with that Host and nothing else naming a
// destination (an absolute-form target, for a forward proxy, stays in
// absolute form, without userinfo, and names the same host). The upstream
// therefore sees exactly the requests the gateway decided, one name each.
// Responses stream back as they arrive. A CONNECT is decided by its
// target, read strictly (connectTarget: plain host:port, no userinfo, path,
// escape, zone id or trailing dot), and the proxy is sent that target as
// decided; it becomes a tunnel only when the proxy answers 2xx (what the
// guest sent after it waits; after a refusal the connection ends); a 101
// Switching Protocols response (WebSocket) turns the connection into a
// tunnel, as it does for the server.
//
// A refused later request is answered 403 and the connection closed (the
// responses to earlier requests may still be on their way); it is logged
// with the Host decided on, the method and the path.

// RefusalText is the body of a 403 the gateway answers for a refused
// plain-HTTP request: what was refused, the rule and why, and a hint a
// coding agent can act on (not to retry or work around it).
func RefusalText(what string, d policy.Decision) string {
	return "smx: " + what + " refused by the sandbox's network profile: rule " + d.Rule + ": " + d.Reason +
		"\nsmx: this is the sandbox's policy, not a network fault; do not retry or work around it." +
		" `smx-why` in the sandbox lists recent refusals; the user can change the profile (smx agent policy)."
}

// proxyHTTP serves the plain-HTTP flow lf request by request (see above).
// strict is set for a flow a domain rule allowed, whose requests must name
// their host; a flow read only for forge names (forge.go) may send
// requests without a Host.
func (s *Stack) proxyHTTP(ctx context.Context, g *gonet.TCPConn, sn sniff.Result, lf *liveFlow, d policy.Decision, strict bool, conns *tcpConns, fe Event) {
	f := lf.flow
	cc := &countConn{Conn: g}
	prefix := sn.Prefix[sn.Skip:] // empty lines before the request line mean nothing
	tr := &http.Transport{
		DialContext: func(dctx context.Context, _, _ string) (net.Conn, error) {
			dctx, cancel := context.WithTimeout(dctx, s.cfg.DialTimeout)
			defer cancel()
			// Always the address the guest dialled and the policy allowed.
			c, err := s.cfg.Dial(dctx, "tcp", f.Dst.String())
			if err != nil {
				return nil, err
			}
			if !conns.addUp(c) {
				return nil, net.ErrClosed
			}
			return c, nil
		},
		// A request the guest sent in absolute form (to a forward proxy it
		// was allowed to reach) goes on in absolute form: the Transport
		// writes it so when it "uses a proxy", which is again the
		// address the guest dialled (DialContext ignores the address).
		Proxy: func(r *http.Request) (*url.URL, error) {
			if r.URL.Host != f.Dst.String() {
				return &url.URL{Scheme: "http", Host: f.Dst.String()}, nil
			}
			return nil, nil
		},
		MaxIdleConnsPerHost:   1,
		IdleConnTimeout:       90 * time.Second,
		DisableCompression:    true, // pass encodings through untouched
		ResponseHeaderTimeout: 0,
	}
	defer tr.CloseIdleConnections()
	target := &url.URL{Scheme: "http", Host: f.Dst.String()}

	// Responses to earlier requests may still be on their way to the
	// guest, so a refused request is answered (403, naming the host and
	// where to look) and the connection closed, not reset.
	refuse := func(w http.ResponseWriter, r *http.Request, host string, nd policy.Decision) {
		s.emit(Event{Kind: audit.KindNetRefused, Flow: f, Decision: nd, HTTPHost: host, Method: r.Method, Path: r.URL.Path})
		w.Header().Set("Connection", "close")
		http.Error(w, RefusalText("request for "+strconv.Quote(host), nd), http.StatusForbidden)
	}
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		cur := s.decide(f)
		if cur.Allow {
			cur = s.hostAddrCheck(f, cur)
		}
		if !cur.Allow {
			refuse(w, r, r.Host, cur)
			return
		}
		if r.Method == http.MethodConnect {
			s.proxyConnect(w, r, lf, cur, conns, refuse)
			return
		}
		via := " (the flow to " + f.Dst.String() + " was allowed for " + f.Host + " by " + cur.Rule + ")"
		if r.Host == "" && strict {
			refuse(w, r, "", policy.Decision{Rule: RuleNoName, Reason: "HTTP request without a Host" + via})
			return
		}
		if h := strings.TrimSuffix(sniff.HostOnly(r.Host), "."); h != "" && s.isForge(h) {
			refuse(w, r, h, policy.Decision{Rule: RuleForgeHTTP, Reason: "plain HTTP request for Git forge " + strconv.Quote(h) +
				": the Git gateway takes the forge's HTTPS only, so its git rules decide; use https://" + h + via})
			return
		}
		if c, ok := hostClaim(f, r.Host); ok && r.Host != "" {
			if nd, _ := s.decideClaims(f, cur, []claim{c}); nd != nil && !(nd.Ask && lf.askedOK(c)) {
				refuse(w, r, c.name, *nd)
				return
			}
			if !lf.addClaim(c) {
				refuse(w, r, c.name, policy.Decision{Rule: RuleNoName, Reason: "more than " + strconv.Itoa(maxClaims) +
					" distinct hosts named on one connection" + via})
				return
			}
		}
		absolute := r.URL.IsAbs()
		if absolute && r.URL.Scheme != "http" {
			refuse(w, r, r.Host, policy.Decision{Rule: RuleMalformed, Reason: "absolute-form " + strconv.Quote(r.URL.Scheme) +
				" request over plain HTTP: only http:// targets are forwarded" + via})
			return
		}
		rp := &httputil.ReverseProxy{
			Rewrite: func(pr *httputil.ProxyRequest) {
				if absolute {
					// Keep the target the request named (checked above).
					u := *r.URL
					u.User = nil
					pr.Out.URL = &u
				} else {
					pr.SetURL(target)
				}
				pr.Out.Host = r.Host
				// The flow's context, not the request's: net/http cancels a
				// request when the client half-closes after sending it (nc,
				// HTTP/1.0 tools), which is no reason to drop its answer.
				pr.Out = pr.Out.WithContext(ctx)
			},
			Transport:     tr,
			FlushInterval: -1,
			BufferPool:    proxyBufs,
			ErrorLog:      discardLog,
			ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
				s.emit(Event{Kind: audit.KindNetFlow, Flow: f, Decision: cur, HTTPHost: r.Host,
					Method: r.Method, Path: r.URL.Path, Err: "upstream: " + err.Error()})
				w.WriteHeader(http.StatusBadGateway)
			},
		}
		rp.ServeHTTP(w, r)
	})
	s.serveHTTP(&prefixConn{Conn: cc, prefix: prefix}, h, cc, len(prefix), lf, fe)
}

// addClaim records one claim and reports false if the flow already holds
// maxClaims others.
func (f *liveFlow) addClaim(c claim) bool {
	f.mu.Lock()
	for _, o := range f.claims {
		if o == c {
			f.mu.Unlock()
			return true
		}
	}
	full := len(f.claims) >= maxClaims
	f.mu.Unlock()
	if full {
		return false
	}
	f.addClaims(c)
	return true
}

// proxyConnect decides a CONNECT on a plain HTTP connection and, once the
// proxy the guest dialled agrees, tunnels it.
func (s *Stack) proxyConnect(w http.ResponseWriter, r *http.Request, lf *liveFlow, d policy.Decision,
	conns *tcpConns, refuse func(http.ResponseWriter, *http.Request, string, policy.Decision)) {
	f := lf.flow
	// The raw target, not r.Host: net/http takes the host from after a
	// userinfo ("a@b:443"), and from the Host header for an origin-form
	// target, while the proxy is sent the target. connectTarget refuses
	// every form the two could read differently; the proxy is sent the
	// target as decided.
	host, port, target, why := connectTarget(r.RequestURI)
	if why != "" {
		nd := policy.Decision{Rule: RuleMalformed, Reason: why}
		s.emit(Event{Kind: audit.KindNetRefused, Flow: f, Decision: nd, Connect: trimTo(r.RequestURI, 300), Method: r.Method})
		w.Header().Set("Connection", "close")
		http.Error(w, RefusalText("CONNECT to "+strconv.Quote(trimTo(r.RequestURI, 100)), nd), http.StatusForbidden)
		return
	}
	c := claim{claimConnect, host, port, netip.Addr{}}
	nd, _ := s.decideClaims(f, d, []claim{c})
	if nd == nil && s.isForge(host) {
		nd = &policy.Decision{Rule: RuleForgeHTTP, Reason: "HTTP CONNECT to Git forge " + strconv.Quote(host) +
			" through a proxy: the Git gateway takes the forge's HTTPS itself, so its git rules decide; reach it directly (leave it out of the proxy, NO_PROXY)"}
	}
	if nd != nil {
		s.emit(Event{Kind: audit.KindNetRefused, Flow: f, Decision: *nd, Connect: target, Method: r.Method})
		w.Header().Set("Connection", "close")
		http.Error(w, RefusalText("CONNECT to "+strconv.Quote(target), *nd), http.StatusForbidden)
		return
	}
	lf.addClaims(c)
	dctx, cancel := context.WithTimeout(r.Context(), s.cfg.DialTimeout)
	up, err := s.cfg.Dial(dctx, "tcp", f.Dst.String())
	cancel()
	if err != nil {
		http.Error(w, "smx: proxy unreachable", http.StatusBadGateway)
		return
	}
	if !conns.addUp(up) {
		return
	}
	bw := bufio.NewWriter(up)
	bw.WriteString("CONNECT " + target + " HTTP/1.1\r\nHost: " + target + "\r\n")
	r.Header.Write(bw)
	bw.WriteString("\r\n")
	if err := bw.Flush(); err != nil {
		up.Close()
		http.Error(w, "smx: proxy unreachable", http.StatusBadGateway)
		return
	}
	// Only a 2xx makes the connection a tunnel. A proxy that refuses the
	// CONNECT may read the bytes after it as another request, so those
	// wait for its answer, and after a refusal the connection ends.
	ur := bufio.NewReader(up)
	resp, err := http.ReadResponse(ur, r)
	if err != nil {
		up.Close()
		http.Error(w, "smx: bad answer from the proxy", http.StatusBadGateway)
		return
	}
	if resp.StatusCode/100 != 2 {
		defer up.Close()
		for k, v := range resp.Header {
			w.Header()[k] = v
		}
		w.Header().Set("Connection", "close")
		w.WriteHeader(resp.StatusCode)
		io.Copy(w, io.LimitReader(resp.Body, 1<<20))
		return
	}
	hj, ok := w.(http.Hijacker)
	if !ok {
		up.Close()
		http.Error(w, "smx: cannot tunnel", http.StatusInternalServerError)
		return
	}
	gc, brw, err := hj.Hijack()
	if err != nil {
		up.Close()
		return
	}
	// The proxy's answer, then whatever the guest sent after the CONNECT
	// and the proxy after its answer.
	gw := bufio.NewWriter(gc)
	gw.WriteString("HTTP/1.1 " + resp.Status + "\r\n")
	resp.Header.Write(gw)
	gw.WriteString("\r\n")
	if n := ur.Buffered(); n > 0 {
		b, _ := ur.Peek(n)
		gw.Write(b)
	}
	if err := gw.Flush(); err != nil {
		gc.Close()
		up.Close()
		return
	}
	if n := brw.Reader.Buffered(); n > 0 {
		b, _ := brw.Reader.Peek(n)
		if _, err := up.Write(b); err != nil {
			gc.Close()
			up.Close()
			return
		}
	}
	splice(gc, up)
}

// proxyBufs are the ReverseProxy's copy buffers: large, because every
// write into the guest's connection costs a trip through the stack.
var proxyBufs = &bufPool{sync.Pool{New: func() any { b := make([]byte, 256<<10); return &b }}}

type bufPool struct{ p sync.Pool }

func (b *bufPool) Get() []byte  { return *b.p.Get().(*[]byte) }
func (b *bufPool) Put(x []byte) { b.p.Put(&x) }
