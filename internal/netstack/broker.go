package netstack

import (
	"context"
	"crypto/tls"
	"errors"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httputil"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"gvisor.dev/gvisor/pkg/tcpip/adapters/gonet"

	"github.com/smx-dev/smx/internal/audit"
	"github.com/smx-dev/smx/internal/netstack/sniff"
	"github.com/smx-dev/smx/internal/policy"
	"github.com/smx-dev/smx/internal/usage"
)

// Credential brokering: for a TLS flow whose server name has a credential
// bound (policy.Profile.CredentialFor), the gateway is the guest's TLS
// server, with a leaf certificate for that name from the sandbox's own CA
// (Config.CA; the guest trusts it, its key never leaves the host). It reads
// the guest's HTTP/1.1 requests (keep-alive; only http/1.1 is offered in
// ALPN), sets the credential's header to its format with the secret read
// from the host store at that moment, and forwards each request over its
// own TLS connection to the real destination: the address the guest
// dialled, verified against Config.UpstreamRoots for the server name.
// Responses are streamed back as they arrive (FlushInterval -1), so
// server-sent events are not held back. Every forwarded request is logged
// as cred.use with the credential's and the secret's names, the method and
// the path: never the value, never the query.
//
// A request whose Host is not the TLS server name is answered 421 and
// logged as a refusal; a secret missing from the store refuses the
// connection (or, when it disappears mid-connection, answers 502).

const brokerHandshakeTimeout = 10 * time.Second

func (s *Stack) broker(ctx context.Context, g *gonet.TCPConn, prefix []byte, lf *liveFlow, f Flow, d policy.Decision, cred policy.Credential, conns *tcpConns) {
	sni := f.Host
	flowEvent := Event{Kind: audit.KindNetFlow, Flow: f, Decision: d, SNI: sni, Credential: cred.Name}
	refuse := func(rule, reason string) {
		g.Close()
		conns.abort()
		s.emit(Event{Kind: audit.KindNetRefused, Flow: f, Decision: policy.Decision{Rule: rule, Reason: reason},
			SNI: sni, Credential: cred.Name, Secret: cred.From})
	}
	if s.cfg.CA == nil {
		refuse(RuleNoBrokerCA, "credential "+cred.Name+" is bound to "+sni+" but the gateway has no CA to terminate TLS with")
		return
	}
	if _, err := s.secret(cred.From); err != nil {
		refuse(RuleNoSecret, "credential "+cred.Name+": "+err.Error())
		return
	}
	if cred.Ask {
		// Held before the guest's TLS is even answered: nothing of the
		// secret is used until the host user says so.
		what := "use credential " + cred.Name + " (secret " + cred.From + ") for " + sni
		if s.cfg.AskCredential == nil {
			refuse(RuleCredAsk, "credential "+cred.Name+" says ask, and nobody can be asked")
			return
		}
		if ok, reason := s.cfg.AskCredential(ctx, f, cred, what); !ok {
			refuse(RuleCredAsk, what+" was asked of the host user: "+reason)
			return
		}
	}

	tc, cc, ok := s.terminateTLS(ctx, g, prefix, sni, lf, flowEvent)
	if !ok {
		return
	}
	// A client that completes the handshake but then closes without a
	// request (Node checks the chain late for some options) is the same
	// sign of an untrusted CA.
	afterHandshake, handshaken := cc.in.Load(), time.Now()
	var requests atomic.Int64
	defer func() {
		if requests.Load() == 0 && cc.in.Load()-afterHandshake < 64 && time.Since(handshaken) < brokerHandshakeTimeout && ctx.Err() == nil {
			s.untrustedCA(flowEvent, "it sent no request after the TLS handshake")
		}
	}()
	target := upstreamURL(sni, f.Dst.Port())
	tr := s.upstreamTransport(sni, f.Dst, conns)
	defer tr.CloseIdleConnections()

	var curPath, curMethod atomic.Pointer[string]
	tap := &wsTap{Conn: tc, report: func(op byte, size int64) {
		kind := "binary"
		if op == 1 {
			kind = "text"
		}
		path, method := "", ""
		if p := curPath.Load(); p != nil {
			path = *p
		}
		if m := curMethod.Load(); m != nil {
			method = *m
		}
		s.emit(Event{Kind: audit.KindCredUse, Flow: f, Decision: d, SNI: sni, Credential: cred.Name, Secret: cred.From,
			Header: cred.Header, Format: cred.Format, Method: method, Path: path, WebSocket: kind, BytesOut: size})
	}}
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		requests.Add(1)
		if host := strings.TrimSuffix(sniff.HostOnly(r.Host), "."); host != sni {
			s.emit(Event{Kind: audit.KindNetRefused, Flow: f, SNI: sni, HTTPHost: r.Host, Credential: cred.Name,
				Method: r.Method, Path: r.URL.Path, Decision: policy.Decision{Rule: RuleHostSNI,
					Reason: "HTTP Host " + strconv.Quote(r.Host) + " is not the TLS server name " + sni + " the credential was brokered for"}})
			http.Error(w, "smx: Host does not match the TLS server name", http.StatusMisdirectedRequest)
			return
		}
		// An endpoint where the secret would mint another credential is
		// refused, with or without it: nothing the guest sends there
		// reaches the server.
		if cred.Denies(r.URL.EscapedPath()) {
			s.emit(Event{Kind: audit.KindNetRefused, Flow: f, SNI: sni, HTTPHost: r.Host, Credential: cred.Name, Secret: cred.From,
				Method: r.Method, Path: r.URL.Path, Decision: policy.Decision{Rule: credRule(cred, "deny_paths"),
					Reason: "credential " + cred.Name + " is never sent to " + r.URL.Path + " (its deny_paths): the endpoint would mint another credential from it"}})
			http.Error(w, "smx: "+r.URL.Path+" is refused on "+sni+": credential "+cred.Name+" is never sent there (the profile's deny_paths)", http.StatusForbidden)
			return
		}
		// A request outside the credential's methods/paths goes on without it.
		use := cred.MatchRequest(r.Method, r.URL.EscapedPath(), r.Header)
		value := ""
		if use {
			secret, err := s.secret(cred.From)
			if err != nil {
				s.emit(Event{Kind: audit.KindNetRefused, Flow: f, SNI: sni, Credential: cred.Name, Secret: cred.From,
					Method: r.Method, Path: r.URL.Path, Decision: policy.Decision{Rule: RuleNoSecret, Reason: "credential " + cred.Name + ": " + err.Error()}})
				http.Error(w, "smx: credential "+cred.Name+" is not available on the host", http.StatusBadGateway)
				return
			}
			format := cred.Format
			if format == "" {
				format = "{}"
			}
			value = strings.ReplaceAll(format, "{}", strings.TrimRight(string(secret), "\r\n"))
		}
		// Usage: counted for every credential when the gateway has a
		// meter, and always for one with a budget (usage.go).
		meter := s.cfg.Meter
		if meter == nil && cred.Budget != nil {
			meter = s.budgetMeter
		}
		metered := use && meter != nil
		var prov usage.Provider
		var model bool
		upgrade := strings.EqualFold(r.Header.Get("Upgrade"), "websocket")
		if metered {
			// An upgrade is not itself a model request: the requests in its
			// session are counted from their answers (meterUpgrade).
			prov, model = usage.ProviderFor(sni, r.URL.Path, r.Header), usage.ModelRequest(r.URL.Path) && !upgrade
			if !s.admit(w, r, f, sni, cred, meter, prov, model) {
				return
			}
		}
		if metered && r.URL.Path == "/v1/chat/completions" {
			includeUsage(r)
		}
		if r.ContentLength > 0 {
			r.Body = &lengthBody{ReadCloser: r.Body, left: r.ContentLength}
		}
		if use {
			s.emit(Event{Kind: audit.KindCredUse, Flow: f, Decision: d, SNI: sni, Credential: cred.Name, Secret: cred.From,
				Header: cred.Header, Format: cred.Format, Method: r.Method, Path: r.URL.Path})
		}
		rp := &httputil.ReverseProxy{
			Rewrite: func(pr *httputil.ProxyRequest) {
				pr.SetURL(target)
				pr.Out.Host = r.Host
				pr.Out.Header.Del(cred.Header)
				if use {
					pr.Out.Header.Set(cred.Header, value)
				}
				if metered {
					pr.Out.Header.Set("Accept-Encoding", "identity")
					pr.Out.Header.Del("Sec-WebSocket-Extensions") // no permessage-deflate: the answers stay readable
				}
			},
			Transport:     tr,
			FlushInterval: -1,
			ErrorLog:      discardLog,
			ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
				s.emit(Event{Kind: audit.KindNetFlow, Flow: f, Decision: d, SNI: sni, Credential: cred.Name,
					Method: r.Method, Path: r.URL.Path, Err: "upstream: " + err.Error()})
				w.WriteHeader(http.StatusBadGateway)
			},
		}
		if metered {
			method, path := r.Method, r.URL.Path
			rp.ModifyResponse = func(resp *http.Response) error {
				if resp.StatusCode == http.StatusSwitchingProtocols {
					meterUpgrade(resp, func(t usage.Tokens, name string) bool {
						spent := meter.Add(cred.Name, t, false)
						s.emit(Event{Kind: audit.KindCredUsage, Flow: f, SNI: sni, Credential: cred.Name, Method: method, Path: path, WebSocket: "text",
							Usage: &UsageReport{Provider: prov, Model: name, Status: resp.StatusCode, Tokens: t, Found: true, Spent: spent}})
						if err := meter.Admit(cred.Name, s.budget(f, cred), false); err != nil {
							s.emit(Event{Kind: audit.KindNetRefused, Flow: f, SNI: sni, Credential: cred.Name, Secret: cred.From,
								Method: method, Path: path, WebSocket: "text", Usage: &UsageReport{Provider: prov},
								Decision: policy.Decision{Rule: credRule(cred, budgetKey), Reason: err.Error() + "; the WebSocket session was ended"}})
							return false
						}
						return true
					})
					return nil
				}
				meterResponse(resp, func(sc *usage.Scanner, unread string) {
					t, name, found := sc.Result()
					if !found && !model && unread == "" {
						return // not a model request, and its answer said nothing of usage
					}
					var spent usage.Spent
					if found {
						spent = meter.Add(cred.Name, t, model)
					} else {
						spent = meter.Spent()[cred.Name]
					}
					s.emit(Event{Kind: audit.KindCredUsage, Flow: f, SNI: sni, Credential: cred.Name, Method: method, Path: path,
						Usage: &UsageReport{Provider: prov, Model: name, Status: resp.StatusCode, Tokens: t, Found: found, Unread: unread, Spent: spent}})
				})
				return nil
			}
		}
		// Every client message of a brokered WebSocket session is
		// recorded like a request (the key went with the upgrade).
		if use && upgrade {
			p, m := r.URL.Path, r.Method
			curPath.Store(&p)
			curMethod.Store(&m)
			tap.arm()
			defer tap.disarm()
		}
		rp.ServeHTTP(w, r)
	})
	s.serveHTTP(tap, h, cc, len(prefix), lf, flowEvent)
}

// serveHTTP serves HTTP/1.1 on one guest connection c with h until the
// connection closes, then emits flowEvent as the flow's summary: bytes
// counted by cc (plus the prefix already read from the guest) and duration.
func (s *Stack) serveHTTP(c net.Conn, h http.Handler, cc *countConn, prefix int, lf *liveFlow, flowEvent Event) {
	srv := &http.Server{
		Handler:           h,
		ReadHeaderTimeout: time.Minute,
		IdleTimeout:       10 * time.Minute,
		ErrorLog:          discardLog,
	}
	srv.Serve(newOneConnListener(c)) // returns once the one connection has closed
	srv.Close()
	flowEvent.BytesOut, flowEvent.BytesIn, flowEvent.Duration = cc.in.Load()+int64(prefix), cc.out.Load(), time.Since(lf.start)
	s.emit(flowEvent)
}

var discardLog = log.New(io.Discard, "", 0)

// lengthBody ends a request body at its Content-Length without reading
// the guest's body again. The upstream transport reads one byte past the
// length to check it, and that read can race the server discarding and
// closing the same body once the response headers go out (the upstream
// answered before the transport's check): the transport then fails the
// write, closes the upstream connection, and a streamed answer is cut
// short. Seen under load in the broker's tests and benchmark.
type lengthBody struct {
	io.ReadCloser
	left int64
}

func (b *lengthBody) Read(p []byte) (int, error) {
	if b.left <= 0 {
		return 0, io.EOF
	}
	if int64(len(p)) > b.left {
		p = p[:b.left]
	}
	n, err := b.ReadCloser.Read(p)
	b.left -= int64(n)
	if b.left <= 0 && err == nil {
		err = io.EOF
	}
	return n, err
}

// secret reads a credential's value from the host store.
func (s *Stack) secret(name string) ([]byte, error) {
	if s.cfg.Secret == nil {
		return nil, errNoStore
	}
	b, err := s.cfg.Secret(name)
	if err == nil && len(strings.TrimRight(string(b), "\r\n")) == 0 {
		return nil, errEmptySecret
	}
	return b, err
}

type brokerError string

func (e brokerError) Error() string { return string(e) }

const (
	errNoStore     = brokerError("the gateway has no credential store")
	errEmptySecret = brokerError("the secret is empty")
)

// prefixConn replays bytes already read from the guest before reading on.
type prefixConn struct {
	net.Conn
	prefix []byte
}

func (c *prefixConn) Read(p []byte) (int, error) {
	if len(c.prefix) > 0 {
		n := copy(p, c.prefix)
		c.prefix = c.prefix[n:]
		return n, nil
	}
	return c.Conn.Read(p)
}

// countConn counts bytes read from (in) and written to (out) the guest.
type countConn struct {
	net.Conn
	in, out atomic.Int64
}

func (c *countConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.in.Add(int64(n))
	return n, err
}

func (c *countConn) Write(p []byte) (int, error) {
	n, err := c.Conn.Write(p)
	c.out.Add(int64(n))
	return n, err
}

// oneConnListener hands out one conn, then blocks Accept until that conn
// is closed, so http.Server.Serve returns only when it is done.
type oneConnListener struct {
	c    net.Conn
	mu   sync.Mutex
	used bool
	done chan struct{}
}

func newOneConnListener(c net.Conn) *oneConnListener {
	l := &oneConnListener{done: make(chan struct{})}
	l.c = &closeNotifyConn{Conn: c, done: l.done}
	return l
}

func (l *oneConnListener) Accept() (net.Conn, error) {
	l.mu.Lock()
	if !l.used {
		l.used = true
		l.mu.Unlock()
		return l.c, nil
	}
	l.mu.Unlock()
	<-l.done
	return nil, net.ErrClosed
}

func (l *oneConnListener) Close() error   { return nil }
func (l *oneConnListener) Addr() net.Addr { return l.c.LocalAddr() }

type closeNotifyConn struct {
	net.Conn
	once sync.Once
	done chan struct{}
}

func (c *closeNotifyConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() { close(c.done) })
	return err
}

// terminateTLS is the guest's TLS server for sni, with a leaf from the
// sandbox's CA, after the bytes already read (prefix). On a failed
// handshake it reports the flow as flowEvent with the error and false.
// The countConn counts the guest side's bytes.
func (s *Stack) terminateTLS(ctx context.Context, g *gonet.TCPConn, prefix []byte, sni string, lf *liveFlow, flowEvent Event) (*tls.Conn, *countConn, bool) {
	cc := &countConn{Conn: g}
	tc := tls.Server(&prefixConn{Conn: cc, prefix: prefix}, &tls.Config{
		MinVersion: tls.VersionTLS12,
		NextProtos: []string{"http/1.1"},
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
			return s.cfg.CA.Leaf(sni)
		},
	})
	hctx, hcancel := context.WithTimeout(ctx, brokerHandshakeTimeout)
	err := tc.HandshakeContext(hctx)
	timedOut := hctx.Err() != nil
	hcancel()
	if err != nil {
		if !timedOut && ctx.Err() == nil && clientRejected(err) {
			s.untrustedCA(flowEvent, "it ended the TLS handshake ("+err.Error()+")")
		}
		tc.Close()
		flowEvent.BytesOut, flowEvent.BytesIn = cc.in.Load(), cc.out.Load()
		flowEvent.Duration, flowEvent.Err = time.Since(lf.start), "guest TLS: "+err.Error()
		s.emit(flowEvent)
		return nil, nil, false
	}
	return tc, cc, true
}

// clientRejected tells a handshake the guest's client abandoned (an alert
// about our certificate, or a close once it had seen it) from other
// failures.
func clientRejected(err error) bool {
	m := err.Error()
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || strings.Contains(m, "connection reset") ||
		(strings.Contains(m, "remote error: tls:") && (strings.Contains(m, "certificate") || strings.Contains(m, "unknown ca") ||
			strings.Contains(m, "bad") || strings.Contains(m, "access denied") || strings.Contains(m, "decrypt")))
}

// untrustedCA records, as a refusal so that `smx agent logs --refusals`
// and smx-why show it, a guest client that gave up on a brokered TLS
// connection: without it, a client that does not trust the sandbox CA
// (Bun and Rust binaries keep their own root stores) fails silently, or
// hangs retrying, with only ordinary flow records to show for it.
func (s *Stack) untrustedCA(fe Event, what string) {
	s.emit(Event{Kind: audit.KindNetRefused, Flow: fe.Flow, SNI: fe.SNI, Credential: fe.Credential,
		Decision: policy.Decision{Rule: RuleUntrustedCA, Reason: "the guest's client closed the connection to " + fe.SNI +
			" that the gateway terminates with the sandbox CA: " + what + "; the client likely does not trust the sandbox CA: " +
			"point it at /etc/ssl/certs/ca-certificates.crt (NODE_EXTRA_CA_CERTS, SSL_CERT_FILE, REQUESTS_CA_BUNDLE, " +
			"CURL_CA_BUNDLE, or the tool's own CA option)"}})
}

// upstreamURL is https://sni[:port], the upstream a terminated flow's
// requests go to.
func upstreamURL(sni string, port uint16) *url.URL {
	u := &url.URL{Scheme: "https", Host: sni}
	if port != 443 {
		u.Host = net.JoinHostPort(sni, strconv.Itoa(int(port)))
	}
	return u
}

// upstreamTransport carries a terminated flow's requests upstream over
// verified TLS for sni (system roots plus UpstreamRoots), always to dst,
// the address the guest dialled and the policy allowed, never a fresh
// resolution of the name. HTTP/1.1 only; encodings pass through untouched.
func (s *Stack) upstreamTransport(sni string, dst netip.AddrPort, conns *tcpConns) *http.Transport {
	return &http.Transport{
		DialContext: func(dctx context.Context, _, _ string) (net.Conn, error) {
			dctx, cancel := context.WithTimeout(dctx, s.cfg.DialTimeout)
			defer cancel()
			c, err := s.cfg.Dial(dctx, "tcp", dst.String())
			if err != nil {
				return nil, err
			}
			if !conns.addUp(c) {
				return nil, net.ErrClosed
			}
			return c, nil
		},
		TLSClientConfig: &tls.Config{
			ServerName: sni,
			RootCAs:    s.cfg.UpstreamRoots,
			NextProtos: []string{"http/1.1"},
			MinVersion: tls.VersionTLS12,
		},
		TLSNextProto:        map[string]func(string, *tls.Conn) http.RoundTripper{}, // no HTTP/2
		TLSHandshakeTimeout: 10 * time.Second,
		MaxIdleConnsPerHost: 4,
		IdleConnTimeout:     90 * time.Second,
		DisableCompression:  true,
	}
}

// credRule names a credential's key as a rule: where the binding is
// written, its name and the key that decided.
func credRule(c policy.Credential, key string) string {
	return c.Pos.String() + " credentials " + c.Name + "." + key
}
