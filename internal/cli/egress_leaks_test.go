package cli_test

import (
	"bufio"
	"crypto/tls"
	"fmt"
	"io/fs"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Bypasses of domain rules found by an attacker's review, each tried from
// a real guest against listeners that count what reaches them: a leak is
// seen by the listener, not inferred from the guest's side.

// countingHTTP is an HTTP server that counts connections and requests per
// Host.
type countingHTTP struct {
	conns atomic.Int64
	mu    sync.Mutex
	hosts map[string]int
}

func (c *countingHTTP) serve(t *testing.T, ln net.Listener) {
	c.hosts = map[string]int{}
	srv := &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			c.mu.Lock()
			c.hosts[r.Host]++
			c.mu.Unlock()
			fmt.Fprintf(w, "counted %s\n", r.Host)
		}),
		ConnState: func(_ net.Conn, s http.ConnState) {
			if s == http.StateNew {
				c.conns.Add(1)
			}
		},
		ReadHeaderTimeout: 10 * time.Second,
	}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
}

func (c *countingHTTP) requests(host string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.hosts[host]
}

// countingTCP accepts connections on ln and counts them.
func countingTCP(t *testing.T, ln net.Listener) *atomic.Int64 {
	var n atomic.Int64
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			n.Add(1)
			c.Close()
		}
	}()
	return &n
}

// tlsLineEcho is a TLS server on ln echoing lines; it counts the
// connections open now.
func tlsLineEcho(t *testing.T, ln net.Listener) *atomic.Int64 {
	// httptest's built-in certificate: the guest does not verify it.
	cert := httptest.NewUnstartedServer(nil)
	cert.StartTLS()
	cfg := &tls.Config{Certificates: cert.TLS.Certificates}
	cert.Close()
	var open atomic.Int64
	tl := tls.NewListener(ln, cfg)
	go func() {
		for {
			c, err := tl.Accept()
			if err != nil {
				return
			}
			open.Add(1)
			go func() {
				defer open.Add(-1)
				defer c.Close()
				rd := bufio.NewReader(c)
				for {
					l, err := rd.ReadString('\n')
					if err != nil {
						return
					}
					c.Write([]byte(l))
				}
			}()
		}
	}()
	return &open
}

func TestEgressLeaks(t *testing.T) {
	e := startEgress(t, "egress-leaks")
	h := e.h
	api := h.PublicIPs[0].String()
	var web countingHTTP
	web.serve(t, h.Listen(t, "tcp4", ":8081"))
	// use applies a profile and resolves api.example.test under it, so the
	// address is judged as that name.
	use := func(t *testing.T, profile string) {
		t.Helper()
		e.use(t, profile)
		// busybox nslookup under TCG sometimes prints only its AAAA
		// answer; ask again rather than fail the step on it.
		var out string
		var err error
		for i := 0; i < 3; i++ {
			if out, err = e.sh("nslookup api.example.test"); err == nil && strings.Contains(out, api) {
				return
			}
		}
		t.Fatalf("nslookup api.example.test: %v\n%s", err, out)
	}

	t.Run("empty-lines-before-request", func(t *testing.T) {
		// Servers skip empty lines before a request line (RFC 9112 2.2):
		// the request after them names another host and must be refused.
		use(t, "network:\n  mode: default-deny\n  allow:\n    - domain: api.example.test\n")
		before := web.conns.Load()
		for _, req := range []string{
			`\r\nGET / HTTP/1.1\r\nHost: other.test\r\n\r\n`,
			`\r\n\r\nCONNECT other.test:443 HTTP/1.1\r\nHost: other.test:443\r\n\r\n`,
		} {
			out, _ := e.sh(fmt.Sprintf(`printf '%s' | nc -w 3 %s 8081`, req, api))
			if upstreamAnswered(out) {
				t.Errorf("%s answered:\n%s", req, out)
			}
		}
		e.expect(t, want{kind: "net.refused", dst: api + ":8081", reason: `HTTP Host "other.test"`})
		e.expect(t, want{kind: "net.refused", dst: api + ":8081", reason: `HTTP CONNECT target "other.test"`})
		if n := web.conns.Load() - before; n != 0 {
			t.Errorf("the upstream received %d connections", n)
		}
		// Bytes that are neither TLS nor HTTP name nothing: refused too.
		e.sh(fmt.Sprintf(`printf 'SSH-2.0-x\r\n' | nc -w 3 %s 8081`, api))
		e.expect(t, want{kind: "net.refused", dst: api + ":8081", rule: "^netstack: names nothing$"})
		if n := web.conns.Load() - before; n != 0 {
			t.Errorf("the upstream received %d connections", n)
		}
	})

	t.Run("keep-alive-second-request", func(t *testing.T) {
		use(t, "network:\n  mode: default-deny\n  allow:\n    - domain: api.example.test\n")
		out, _ := e.sh(fmt.Sprintf(`printf 'GET / HTTP/1.1\r\nHost: api.example.test\r\n\r\nGET / HTTP/1.1\r\nHost: other.test\r\n\r\n' | nc -w 3 %s 8081`, api))
		if !strings.Contains(out, "counted api.example.test") {
			t.Errorf("the first request was not served:\n%s", out)
		}
		if strings.Contains(out, "counted other.test") || web.requests("other.test") != 0 {
			t.Errorf("the second request, naming other.test, reached the upstream:\n%s", out)
		}
		r := e.expect(t, want{kind: "net.refused", dst: api + ":8081", reason: `HTTP Host "other.test"`})
		if r.f("http_host") != "other.test" || r.f("method") != "GET" {
			t.Errorf("refusal does not record the request decided on: %s", r)
		}
		// Userinfo before the host: the host is what is decided and recorded.
		e.sh(fmt.Sprintf(`printf 'GET http://api.example.test@other.test/ HTTP/1.1\r\nHost: api.example.test\r\n\r\n' | nc -w 3 %s 8081`, api))
		r = e.expect(t, want{kind: "net.refused", dst: api + ":8081", reason: `"other.test"`})
		if r.f("http_host") != "other.test" {
			t.Errorf("refusal records http_host %q, not the host decided on: %s", r.f("http_host"), r)
		}
		if n := web.requests("other.test"); n != 0 {
			t.Errorf("the upstream served %d requests for other.test", n)
		}
	})

	t.Run("policy-change-rechecks-sni", func(t *testing.T) {
		open := tlsLineEcho(t, h.Listen(t, "tcp4", ":8443"))
		use(t, "network:\n  mode: default-deny\n  allow:\n    - domain: api.example.test\n    - domain: other.test\n")
		c := e.cmd("agent", "exec", e.name, "--", "netprobe", "tlshold", api+":8443", "other.test", "60s")
		pipe, err := c.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		c.Stderr = c.Stdout
		if err := c.Start(); err != nil {
			t.Fatal(err)
		}
		lines := make(chan string, 8)
		go func() {
			sc := bufio.NewScanner(pipe)
			for sc.Scan() {
				lines <- sc.Text()
			}
			close(lines)
		}()
		var out strings.Builder
		done := make(chan struct{})
		go func() {
			defer close(done)
			for l := range lines {
				out.WriteString(l + "\n")
				if l == "ready" {
					done <- struct{}{}
				}
			}
			c.Wait()
		}()
		select {
		case _, ok := <-done:
			if !ok {
				t.Fatalf("the TLS flow naming other.test never opened:\n%s", out.String())
			}
		case <-time.After(60 * time.Second):
			t.Fatal("the TLS flow naming other.test never opened")
		}
		if open.Load() == 0 {
			t.Fatal("the upstream holds no connection")
		}
		// Narrowed: the address's DNS name is still allowed; the name the
		// flow's ClientHello gave is not.
		// The revocation is logged while the policy is applied: the step
		// begins before it.
		if recs := e.records(t, false); len(recs) > 0 {
			e.mark = recs[len(recs)-1].Seq
		}
		if out, err := e.smx("agent", "policy", e.name, e.profile("narrowed", "network:\n  mode: default-deny\n  allow:\n    - domain: api.example.test\n")); err != nil {
			t.Fatalf("policy: %v\n%s", err, out)
		}
		select {
		case <-done:
		case <-time.After(45 * time.Second):
			c.Process.Kill()
			<-done
			t.Fatalf("the flow naming other.test survived the policy change:\n%s", out.String())
		}
		if !strings.Contains(out.String(), "closed after") {
			t.Errorf("netprobe: %s", out.String())
		}
		r := e.expect(t, want{kind: "net.refused", dst: api + ":8443", reason: "^policy changed: "})
		if r.f("sni") != "other.test" {
			t.Errorf("revocation does not name the SNI: %s", r)
		}
		for end := time.Now().Add(15 * time.Second); open.Load() != 0 && time.Now().Before(end); {
			time.Sleep(200 * time.Millisecond)
		}
		if n := open.Load(); n != 0 {
			t.Errorf("the upstream still holds %d connections", n)
		}
	})

	t.Run("udp-on-domain-rule", func(t *testing.T) {
		var got atomic.Int64
		pc := h.ListenPacket(t, "udp4", api+":4433")
		go func() {
			buf := make([]byte, 2048)
			for {
				n, a, err := pc.ReadFrom(buf)
				if err != nil {
					return
				}
				got.Add(1)
				pc.WriteTo(buf[:n], a)
			}
		}()
		use(t, "network:\n  mode: default-deny\n  allow:\n    - domain: api.example.test\n")
		if out, _ := e.sh(fmt.Sprintf("netprobe udp %s:4433 quic-initial", api)); strings.Contains(out, "quic-initial") {
			t.Errorf("UDP under a domain rule without proto: udp was answered: %s", out)
		}
		e.expect(t, want{kind: "net.refused", proto: "udp", dst: api + ":4433", rule: `network.allow\[0\] domain api.example.test`, reason: "only with proto: udp"})
		if n := got.Load(); n != 0 {
			t.Errorf("the upstream received %d datagrams", n)
		}
		e.use(t, "network:\n  mode: default-deny\n  allow:\n    - domain: api.example.test\n      proto: udp\n")
		if out, err := e.sh(fmt.Sprintf("netprobe udp %s:4433 quic-initial", api)); !strings.Contains(out, "quic-initial") {
			t.Errorf("UDP under proto: udp: %v %s", err, out)
		}
		if n := got.Load(); n != 1 {
			t.Errorf("the upstream received %d datagrams, want 1", n)
		}
	})

	t.Run("drops-are-recorded", func(t *testing.T) {
		// Packets that open no flow are dropped by the gateway, and each
		// drop is on the record, summarised per destination.
		e.use(t, "open")
		pub := h.PublicIPs[3].String()
		out, err := e.sh(fmt.Sprintf("ping -c 3 -W 1 %s; netprobe udp 224.0.0.251:5353 x; echo rc=$?", pub))
		if err != nil || strings.Contains(out, " 0% packet loss") {
			t.Fatalf("ping through the gateway: %v\n%s", err, out)
		}
		r := e.expect(t, want{kind: "net.refused", proto: "icmp", dst: "^" + pub + "$", rule: "^netstack: icmp not forwarded$", reason: "answers ping only for itself"})
		n := 0
		for _, r := range e.records(t, true) {
			if r.f("rule") == "netstack: icmp not forwarded" {
				c, _ := strconv.Atoi(r.f("count"))
				n += c
			}
		}
		if n != 3 {
			t.Errorf("3 pings counted %d times: %s", n, r)
		}
		e.expect(t, want{kind: "net.refused", proto: "udp", dst: `^224\.0\.0\.251:5353$`, rule: "^netstack: destination never forwarded$", reason: "multicast"})
		// The gateway itself answers.
		if out, err := e.sh("ping -c 1 -W 5 10.0.2.2"); err != nil {
			t.Errorf("ping the gateway: %v\n%s", err, out)
		}
	})

	t.Run("exec-args-redacted", func(t *testing.T) {
		// A secret typed on a command line is redacted before anything is
		// written: the log and the supervisor's own log file.
		e.use(t, "network:\n  mode: deny-all\nlog:\n  redact:\n    - '--password[= ](\\S+)'\n")
		nonce := strconv.FormatInt(time.Now().UnixNano(), 36)
		token, ant, pw := "ghp_"+strings.Repeat("Ab1", 8)+nonce, "sk-ant-api03-Zq9Xw2Lp7Rt5Vn3B"+nonce, "hunter2-"+nonce
		if out, err := e.sh("true --password=" + pw + " " + token + " " + ant); err != nil {
			t.Fatalf("exec: %v\n%s", err, out)
		}
		r := e.expect(t, want{kind: "exec.start"})
		args := r.f("args")
		if !strings.Contains(args, "--password=[redacted]") || !strings.Contains(args, "ghp_[redacted]") || !strings.Contains(args, "sk-ant-[redacted]") {
			t.Errorf("recorded args: %s", args)
		}
		var leaked []string
		filepath.WalkDir(e.home, func(p string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() || strings.HasSuffix(p, ".qcow2") || strings.HasSuffix(p, ".state") {
				return nil
			}
			b, _ := os.ReadFile(p)
			for _, secret := range []string{pw, token, ant} {
				if strings.Contains(string(b), secret) {
					leaked = append(leaked, p+": "+secret)
				}
			}
			return nil
		})
		if len(leaked) > 0 {
			t.Errorf("secrets written on the host: %q", leaked)
		}
	})

	t.Run("records-cite-the-user", func(t *testing.T) {
		// Refusals name the profile and the user's file and line, not the
		// sandbox's frozen copy; a refused name is refused on every port,
		// once per second with a count.
		path := e.profile("team-file", "name: team\nnetwork:\n  mode: default-deny\n  allow:\n    - domain: \"*.example.test\"\n  deny:\n    - domain: www.example.test\n")
		e.use(t, path)
		out, _ := e.sh("nslookup www.example.test; nslookup www.example.test")
		if !strings.Contains(out, "NXDOMAIN") {
			t.Errorf("denied name resolved:\n%s", out)
		}
		r := e.expect(t, want{kind: "net.refused", proto: "dns", host: "^www.example.test$"})
		if want := path + ":7:7 network.deny[0] domain www.example.test"; r.f("rule") != want || r.f("profile") != "team" {
			t.Errorf("refusal cites %q of profile %q, want %q of team", r.f("rule"), r.f("profile"), want)
		}
		if strings.Contains(r.f("reason"), "port 1") || !strings.Contains(r.f("reason"), "every port") {
			t.Errorf("reason %q", r.f("reason"))
		}
		time.Sleep(2 * time.Second)
		n, count := 0, 0
		for _, r := range e.records(t, true) {
			if r.f("host") == "www.example.test" {
				n++
				c, _ := strconv.Atoi(r.f("count"))
				count += c
			}
		}
		if count < 2 || n >= count {
			t.Errorf("%d lookups' refusals made %d records: want fewer records than lookups, each with a count", count, n)
		}
	})

	t.Run("host-own-address", func(t *testing.T) {
		// A host service bound to 0.0.0.0 answers on every host address.
		ln, err := net.Listen("tcp4", "0.0.0.0:0")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { ln.Close() })
		got := countingTCP(t, ln)
		port := ln.Addr().(*net.TCPAddr).Port
		e.use(t, "open")
		hostSide := fmt.Sprintf("198.18.%d.1", h.N) // the host's end of the veth: not a private address
		// An address added after the sandbox started is closed as well.
		added := fmt.Sprintf("198.18.%d.6", h.N)
		if out, err := exec.Command("ip", "addr", "add", added+"/32", "dev", h.NS+"h").CombinedOutput(); err != nil {
			t.Fatalf("ip addr add: %v\n%s", err, out)
		}
		for _, a := range []string{hostSide, added} {
			out, _ := e.sh(fmt.Sprintf("nc -w 3 %s %d </dev/null; echo rc=$?", a, port))
			if strings.Contains(out, "rc=0") {
				t.Errorf("%s:%d connected: %s", a, port, out)
			}
			e.expect(t, want{kind: "net.refused", dst: fmt.Sprintf("%s:%d", a, port), rule: "^netstack: host address$", reason: "host.smx.internal"})
		}
		if n := got.Load(); n != 0 {
			t.Errorf("the host service received %d connections from the guest", n)
		}
		// The rest of the net host is still reachable under allow-all.
		if out := e.get(h.PublicIPs[3].String(), 80); !strings.Contains(out, hello) {
			t.Errorf("allow-all broken:\n%s", out)
		}
	})
}
