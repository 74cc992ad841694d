package cli_test

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/smx-dev/smx/internal/testutil"
)

// The egress tests attack the gateway from inside a real guest, against
// real upstreams in a network namespace (testutil.NetHost), and check both
// what the guest observes and what the log says: every refusal must be
// recorded with the rule that made it and why.

// egressEnv is one running sandbox whose gateway resolves test names from
// a hosts file, next to a NetHost.
type egressEnv struct {
	*vmEnv
	h     *testutil.NetHost
	dir   string
	mark  int64 // log records with seq <= mark are from earlier steps
	dns53 atomic.Int64
}

// Names in the gateway's hosts file.
func egressHosts(h *testutil.NetHost) map[string]string {
	return map[string]string{
		"api.example.test":       h.PublicIPs[0].String(),
		"www.example.test":       h.PublicIPs[1].String(),
		"example.test":           h.PublicIPs[2].String(),
		"evilexample.test":       h.PublicIPs[2].String(),
		"example.test.evil.test": h.PublicIPs[2].String(),
		"other.test":             h.PublicIPs[2].String(),
		"newhost.test":           h.PublicIPs[1].String(),
		"rebind-md.example.test": "169.254.169.254",
		"rebind-ll.example.test": "169.254.7.7",
		"rebind-lo.example.test": "127.0.0.1",
		"private.example.test":   h.PrivateIP.String(),
		"api6.example.test":      "2001:db8::1",
	}
}

func startEgress(t *testing.T, name string) *egressEnv {
	t.Helper()
	testutil.RequireQEMU(t)
	h := testutil.NewNetHost(t)
	probe := testutil.NetProbe(t)
	bin := testutil.Binaries(t)
	e := &egressEnv{vmEnv: &vmEnv{t: t, bin: bin, home: vmHome(t, bin), name: name}, h: h, dir: t.TempDir()}
	// A UDP server on 53 in the namespace counts what reaches it: a guest
	// asking another resolver must not get a single packet through.
	pc := h.ListenPacket(t, "udp4", ":53")
	go func() {
		buf := make([]byte, 2048)
		for {
			if _, _, err := pc.ReadFrom(buf); err != nil {
				return
			}
			e.dns53.Add(1)
		}
	}()
	hosts := testutil.HostsFile(t, egressHosts(h))
	e.smx("agent", "rm", "-f", name)
	if out, err := e.smx("agent", "create", name, "--profile", e.profile("start", "network:\n  mode: deny-all\n")); err != nil {
		t.Fatalf("create: %v\n%s", err, out)
	}
	t.Cleanup(func() { e.smx("agent", "rm", "-f", name) })
	c := e.cmd("agent", "start", name)
	c.Env = append(c.Env, "SMX_HOSTS_FILE="+hosts)
	if out, err := c.CombinedOutput(); err != nil {
		t.Fatalf("start: %v\n%s", err, out)
	}
	if out, err := e.smx("agent", "cp", probe, name+":/usr/bin/netprobe"); err != nil {
		t.Fatalf("cp netprobe: %v\n%s", err, out)
	}
	return e
}

// profile writes a profile file; N in body is replaced by the NetHost's
// subnet number.
func (e *egressEnv) profile(name, body string) string {
	p := filepath.Join(e.dir, name+".yaml")
	body = strings.ReplaceAll(body, "{N}", strconv.Itoa(e.h.N))
	if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
		e.t.Fatal(err)
	}
	return p
}

// use applies a profile to the running sandbox and starts a new step: log
// assertions look only at records written after this.
func (e *egressEnv) use(t *testing.T, profile string) {
	t.Helper()
	if !strings.HasPrefix(profile, "network:") {
		if out, err := e.smx("agent", "policy", e.name, profile); err != nil {
			t.Fatalf("policy %s: %v\n%s", profile, err, out)
		}
	} else if out, err := e.smx("agent", "policy", e.name, e.profile(fmt.Sprintf("p%d", time.Now().UnixNano()), profile)); err != nil {
		t.Fatalf("policy: %v\n%s", err, out)
	}
	recs := e.records(t, false)
	if len(recs) > 0 {
		e.mark = recs[len(recs)-1].Seq
	}
}

// sh runs a shell script in the guest.
func (e *egressEnv) sh(script string) (string, error) {
	return e.smx("agent", "exec", e.name, "--", "sh", "-c", script)
}

// get fetches http://HOST:PORT/ with nc, naming HOST in the Host header,
// and returns what came back.
func (e *egressEnv) get(host string, port int) string {
	return e.getAs(host, port, host)
}

// getAs is get with another Host header: the gateway inspects flows that a
// domain rule allows, so a client that resolved a name sends that name.
func (e *egressEnv) getAs(dst string, port int, hostHeader string) string {
	out, _ := e.sh(fmt.Sprintf(`printf 'GET / HTTP/1.0\r\nHost: %s\r\n\r\n' | nc -w 5 %s %d`, hostHeader, dst, port))
	return out
}

type logRecord struct {
	Seq    int64          `json:"seq"`
	Kind   string         `json:"kind"`
	Fields map[string]any `json:"fields"`
}

func (r logRecord) f(k string) string {
	v, _ := r.Fields[k]
	if v == nil {
		return ""
	}
	return fmt.Sprint(v)
}

func (r logRecord) String() string {
	b, _ := json.Marshal(r)
	return string(b)
}

// records reads the sandbox's log (refusals only, or all) since the step
// began.
func (e *egressEnv) records(t *testing.T, refusals bool) []logRecord {
	t.Helper()
	args := []string{"agent", "logs", e.name, "--json"}
	if refusals {
		args = append(args, "--refusals")
	}
	out, err := e.cmd(args...).Output()
	if err != nil {
		t.Fatalf("logs: %v", err)
	}
	var recs []logRecord
	sc := bufio.NewScanner(strings.NewReader(string(out)))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var r logRecord
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			t.Fatalf("log line %q: %v", sc.Text(), err)
		}
		if r.Seq > e.mark {
			recs = append(recs, r)
		}
	}
	return recs
}

// want describes a log record: its kind and fields matched as regular
// expressions ("" = any).
type want struct {
	kind, proto, dst, host, rule, reason, err string
}

func (w want) match(r logRecord) bool {
	m := func(pat, s string) bool { return pat == "" || regexp.MustCompile(pat).MatchString(s) }
	return m("^"+w.kind+"$", r.Kind) && m(w.proto, r.f("proto")) && m(w.dst, r.f("dst")) && m(w.host, r.f("host")) &&
		m(w.rule, r.f("rule")) && m(w.reason, r.f("reason")) && m(w.err, r.f("error"))
}

// expect waits (the gateway logs asynchronously) for a record of this
// step that matches w, and returns it.
func (e *egressEnv) expect(t *testing.T, w want) logRecord {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		recs := e.records(t, w.kind == "net.refused")
		for _, r := range recs {
			if w.match(r) {
				return r
			}
		}
		if time.Now().After(deadline) {
			var b strings.Builder
			for _, r := range recs {
				b.WriteString(r.String() + "\n")
			}
			t.Fatalf("no log record like %+v; this step logged:\n%s", w, b.String())
		}
		time.Sleep(300 * time.Millisecond)
	}
}

// expectNone checks that no record of this step matches w.
func (e *egressEnv) expectNone(t *testing.T, w want) {
	t.Helper()
	for _, r := range e.records(t, false) {
		if w.match(r) {
			t.Fatalf("unexpected log record %s", r)
		}
	}
}

const hello = "hello from netns"

// TestEgressFirewall runs the attacks in one sandbox, switching profiles
// between steps, so the boot is paid once. Order matters: the raw-IP step
// must come before anything resolves api.example.test.
func TestEgressFirewall(t *testing.T) {
	e := startEgress(t, "egress")
	h := e.h
	api, www, pub3 := h.PublicIPs[0].String(), h.PublicIPs[1].String(), h.PublicIPs[3].String()
	priv := h.PrivateIP.String()

	t.Run("raw-ip-bypass", func(t *testing.T) {
		// Only the name is allowed: its address, dialled without asking
		// our DNS, is judged by IP rules alone and refused.
		e.use(t, "network:\n  mode: default-deny\n  allow:\n    - domain: api.example.test\n      ports: [80]\n")
		if out := e.get(api, 80); strings.Contains(out, hello) {
			t.Fatalf("raw IP %s reached without resolving the allowed name:\n%s", api, out)
		} else if !strings.Contains(out, "403 Forbidden") || !strings.Contains(out, "rule default deny: no rule allows tcp "+api+" port 80") {
			t.Errorf("a refused plain-HTTP request to %s is not answered 403 with its rule:\n%s", api, out)
		}
		e.expect(t, want{kind: "net.refused", proto: "tcp", dst: api + ":80", rule: "^default deny$", reason: "no rule allows tcp " + api + " port 80"})
		// Once our DNS has answered the name with that address, the
		// address is judged as the name.
		out, err := e.sh("nslookup api.example.test")
		if err != nil || !strings.Contains(out, api) {
			t.Fatalf("nslookup api.example.test: %v\n%s", err, out)
		}
		if out := e.getAs(api, 80, "api.example.test"); !strings.Contains(out, hello) {
			t.Fatalf("after resolving api.example.test, %s:80 not reached:\n%s", api, out)
		}
		e.expect(t, want{kind: "net.flow", dst: api + ":80", host: "^api.example.test$", rule: `network.allow\[0\] domain api.example.test`})
		// Not on a port the rule does not name.
		if out := e.get("api.example.test", 443); strings.Contains(out, "HTTP") {
			t.Fatalf("port 443 reached:\n%s", out)
		}
		e.expect(t, want{kind: "net.refused", dst: api + ":443", host: "^api.example.test$", rule: "^default deny$"})
	})

	t.Run("sni-and-host-mismatch", func(t *testing.T) {
		// The address is allowed as api.example.test (resolved above), but
		// what the client names inside the flow must be allowed too.
		e.use(t, "network:\n  mode: default-deny\n  allow:\n    - domain: api.example.test\n      ports: [80, 443]\n")
		if out, err := e.sh("netprobe tls " + api + ":443 api.example.test"); err != nil || !strings.Contains(out, "handshake ok") {
			t.Fatalf("TLS naming the allowed name: %v\n%s", err, out)
		}
		if out, err := e.sh("netprobe tls " + api + ":443 evil.test"); err == nil || strings.Contains(out, "handshake ok") {
			t.Fatalf("TLS naming another name got through:\n%s", out)
		}
		if r := e.expect(t, want{kind: "net.refused", dst: api + ":443"}); r.f("sni") != "evil.test" {
			t.Fatalf("refusal does not name the SNI: %s", r)
		}
		if out := e.getAs(api, 80, "evil.test"); strings.Contains(out, hello) {
			t.Fatalf("HTTP with Host: evil.test got through:\n%s", out)
		}
		if r := e.expect(t, want{kind: "net.refused", dst: api + ":80"}); r.f("http_host") != "evil.test" {
			t.Fatalf("refusal does not name the Host header: %s", r)
		}
	})

	t.Run("default-deny-domain", func(t *testing.T) {
		e.use(t, "network:\n  mode: default-deny\n  allow:\n    - domain: api.example.test\n      ports: [80, 443]\n")
		out, err := e.sh("wget -q -O - http://api.example.test/")
		if err != nil || !strings.Contains(out, hello) {
			t.Fatalf("wget api.example.test: %v\n%s", err, out)
		}
		out, err = e.sh("netprobe get https://api.example.test/")
		if err != nil || !strings.Contains(out, hello) {
			t.Fatalf("https api.example.test: %v\n%s", err, out)
		}
		// Another name in the hosts file, on the same host: not resolved.
		out, err = e.sh("nslookup other.test")
		if err == nil || !strings.Contains(out, "NXDOMAIN") {
			t.Fatalf("other.test resolved: %v\n%s", err, out)
		}
		e.expect(t, want{kind: "net.refused", proto: "dns", host: "^other.test$", rule: "^default deny$", reason: "no rule allows"})
		if out := e.get(pub3, 80); strings.Contains(out, hello) {
			t.Fatalf("%s reached under default-deny:\n%s", pub3, out)
		}
		e.expect(t, want{kind: "net.refused", dst: pub3 + ":80", rule: "^default deny$"})
	})

	t.Run("other-resolver", func(t *testing.T) {
		// The profile opens the whole host by CIDR, yet port 53 on it is
		// still closed: DNS goes to the gateway only.
		e.use(t, "network:\n  mode: default-deny\n  allow:\n    - cidr: 10.200.{N}.0/30\n    - cidr: 198.18.{N}.0/29\n")
		out, err := e.sh(fmt.Sprintf("nslookup -timeout=2 api.example.test %s", priv))
		if err == nil || strings.Contains(out, api) {
			t.Fatalf("nslookup through %s succeeded: %v\n%s", priv, err, out)
		}
		e.expect(t, want{kind: "net.refused", proto: "udp", dst: priv + ":53", rule: "^netstack: other resolver$", reason: "other resolvers are closed"})
		e.sh(fmt.Sprintf("printf 'x' | nc -w 2 %s 53", api)) // DNS over TCP, 53 on the public address
		e.expect(t, want{kind: "net.refused", proto: "tcp", dst: api + ":53", rule: "^netstack: other resolver$"})
		if n := e.dns53.Load(); n != 0 {
			t.Fatalf("%d packets reached the other resolver", n)
		}
	})

	t.Run("wildcard-lookalikes", func(t *testing.T) {
		e.use(t, "network:\n  mode: default-deny\n  allow:\n    - domain: \"*.example.test\"\n")
		out, err := e.sh("wget -q -O - http://www.example.test/")
		if err != nil || !strings.Contains(out, hello) {
			t.Fatalf("wget www.example.test: %v\n%s", err, out)
		}
		e.expect(t, want{kind: "net.flow", dst: www + ":80", host: "^www.example.test$", rule: `domain \*\.example\.test`})
		for _, name := range []string{"evilexample.test", "example.test.evil.test", "example.test"} {
			out, err := e.sh("nslookup " + name)
			if err == nil || !strings.Contains(out, "NXDOMAIN") {
				t.Errorf("%s resolved under *.example.test: %v\n%s", name, err, out)
			}
			e.expect(t, want{kind: "net.refused", proto: "dns", host: "^" + regexp.QuoteMeta(name) + "$", rule: "^default deny$"})
		}
	})

	t.Run("dns-rebinding", func(t *testing.T) {
		// The names are allowed; the addresses they resolve to are not. The
		// refusal names both, so it proves the name resolved to the
		// rebound address and the address was refused.
		e.use(t, "network:\n  mode: default-deny\n  allow:\n    - domain: \"*.example.test\"\n")
		for _, c := range []struct{ name, addr, rule string }{
			{"rebind-md.example.test", "169.254.169.254", `^builtin: cloud metadata 169\.254\.169\.254/32 is always closed$`},
			{"rebind-ll.example.test", "169.254.7.7", `^builtin: link-local 169\.254\.0\.0/16 is always closed$`},
			{"private.example.test", priv, `^builtin: private range closed unless a cidr rule names it$`},
		} {
			if out := e.get(c.name, 80); strings.Contains(out, hello) || upstreamAnswered(out) {
				t.Errorf("%s (%s) reached:\n%s", c.name, c.addr, out)
			}
			e.expect(t, want{kind: "net.refused", proto: "tcp", dst: regexp.QuoteMeta(c.addr) + ":80", host: "^" + regexp.QuoteMeta(c.name) + "$", rule: c.rule})
		}
		// A name rebound to loopback sends the guest to its own loopback:
		// nothing reaches the gateway at all.
		e.get("rebind-lo.example.test", 80)
		e.expectNone(t, want{kind: "net.flow", dst: `^127\.`})
	})

	t.Run("allow-all", func(t *testing.T) {
		e.use(t, "open")
		if out := e.get(pub3, 80); !strings.Contains(out, hello) {
			t.Fatalf("allow-all: %s not reached:\n%s", pub3, out)
		}
		e.expect(t, want{kind: "net.flow", dst: pub3 + ":80", rule: "network.mode allow-all"})
		// Private ranges stay closed under allow-all ...
		if out := e.get(priv, 80); strings.Contains(out, hello) {
			t.Fatalf("allow-all opened private %s:\n%s", priv, out)
		}
		e.expect(t, want{kind: "net.refused", dst: priv + ":80", rule: "^builtin: private range closed unless a cidr rule names it$", reason: "is a private address"})
		// ... and metadata and link-local are always closed.
		for _, c := range []struct{ addr, rule string }{
			{"169.254.169.254", `^builtin: cloud metadata 169\.254\.169\.254/32 is always closed$`},
			{"169.254.1.1", `^builtin: link-local 169\.254\.0\.0/16 is always closed$`},
		} {
			if out := e.get(c.addr, 80); upstreamAnswered(out) {
				t.Errorf("%s answered:\n%s", c.addr, out)
			}
			e.expect(t, want{kind: "net.refused", dst: regexp.QuoteMeta(c.addr) + ":80", rule: c.rule, reason: "no profile can open it"})
		}
	})

	t.Run("allow-all-with-private-cidr", func(t *testing.T) {
		e.use(t, "network:\n  mode: allow-all\n  allow:\n    - cidr: 10.200.{N}.0/30\n      ports: [80]\n")
		if out := e.get(priv, 80); !strings.Contains(out, hello) {
			t.Fatalf("cidr rule did not open %s:\n%s", priv, out)
		}
		e.expect(t, want{kind: "net.flow", dst: priv + ":80", rule: `network.allow\[0\] cidr 10\.200\.`})
		if out := e.get(priv, 443); strings.Contains(out, "HTTP") {
			t.Fatalf("private %s:443 reached though the rule names only 80", priv)
		}
		e.expect(t, want{kind: "net.refused", dst: priv + ":443", rule: "^builtin: private range"})
	})

	t.Run("ipv6", func(t *testing.T) {
		// The guest has no IPv6 route and the gateway drops IPv6 frames:
		// attempts fail in the guest and nothing is dialled; what reaches
		// the wire (link-local) is recorded as refused.
		e.use(t, "open")
		for _, script := range []string{
			"nc -w 3 2001:db8::1 80 </dev/null",
			"nc -w 3 fe80::1%eth0 80 </dev/null",
			"ping6 -c 1 -W 2 fe80::1%eth0",
			"ping -c 1 -W 2 2001:db8::1",
		} {
			start := time.Now()
			if out, err := e.sh(script); err == nil {
				t.Errorf("%s succeeded:\n%s", script, out)
			}
			if d := time.Since(start); d > 20*time.Second {
				t.Errorf("%s took %v", script, d)
			}
		}
		out, _ := e.sh("nslookup -type=AAAA api6.example.test; ip -6 route 2>&1")
		if strings.Contains(out, "2001:db8::1") {
			t.Errorf("guest got an IPv6 answer or route:\n%s", out)
		}
		e.expectNone(t, want{kind: "net.flow", dst: `:`})
		// The guest's kernel resolves the link-local neighbour first, and
		// gets no answer: that is the packet on the wire, and the record.
		e.expect(t, want{kind: "net.refused", proto: "icmpv6", dst: `^fe80::1$`, rule: "^netstack: ipv6 closed$", reason: "neighbour solicitation for fe80::1: the sandbox has no IPv6"})
	})

	t.Run("locked", func(t *testing.T) {
		e.use(t, "locked")
		if out := e.get(pub3, 80); strings.Contains(out, hello) {
			t.Fatalf("locked reached %s", pub3)
		}
		e.expect(t, want{kind: "net.refused", dst: pub3 + ":80", rule: "network.mode deny-all", reason: "denies all egress"})
		out, err := e.sh("nslookup www.example.test")
		if err == nil || !strings.Contains(out, "NXDOMAIN") {
			t.Fatalf("locked resolved a name: %v\n%s", err, out)
		}
		e.expect(t, want{kind: "net.refused", proto: "dns", host: "^www.example.test$", rule: "network.mode deny-all"})
		// The address mapped to a name earlier is refused too.
		if out := e.get("api.example.test", 80); strings.Contains(out, hello) {
			t.Fatalf("locked reached api.example.test")
		}
	})

	t.Run("upstream-down", func(t *testing.T) {
		// Allowed, nothing listening: the gateway dials first and answers
		// the guest's SYN with a RST, at once.
		e.use(t, "network:\n  mode: allow-all\n")
		start := time.Now()
		out, err := e.sh(fmt.Sprintf("nc -w 10 %s %d </dev/null; echo rc=$?", pub3, testutil.NetHostClosed))
		d := time.Since(start)
		if err != nil || strings.Contains(out, "rc=0") {
			t.Fatalf("connect to a closed upstream port: %v\n%s", err, out)
		}
		if d > 5*time.Second {
			t.Fatalf("the guest waited %v for a refused upstream; want a quick RST", d)
		}
		e.expect(t, want{kind: "net.flow", dst: fmt.Sprintf("%s:%d", pub3, testutil.NetHostClosed), err: "dial: .*connection refused"})
		if out := e.get(pub3, 80); !strings.Contains(out, hello) {
			t.Fatalf("sandbox network broken after a refused upstream:\n%s", out)
		}
	})

	t.Run("connection-flood", func(t *testing.T) {
		// 10 000 connections at once: the
		// gateway holds at most 1024 flows, refuses and logs the rest, and
		// keeps working.
		e.use(t, "network:\n  mode: allow-all\n")
		out, err := e.sh(fmt.Sprintf("netprobe conns 10000 %s:80 2s", pub3))
		if err != nil {
			t.Fatalf("netprobe conns: %v\n%s", err, out)
		}
		t.Logf("10000 connections: %s", strings.TrimSpace(out))
		var ok, refused, timeout, other int
		fmt.Sscanf(out, "ok=%d refused=%d timeout=%d other=%d", &ok, &refused, &timeout, &other)
		if ok == 0 || ok > 1024 {
			t.Errorf("%d connections established; want 1..1024 (the flow cap)", ok)
		}
		if refused == 0 {
			t.Errorf("no connection refused over the cap")
		}
		e.expect(t, want{kind: "net.refused", dst: pub3 + ":80", rule: "^netstack: too many flows$", reason: "already has 1024 flows open"})
		// The gateway may drop events when the log cannot keep up; then
		// it records how many it lost. Every refusal is accounted for.
		time.Sleep(3 * time.Second)
		n, lost := 0, 0
		for _, r := range e.records(t, true) {
			if r.f("rule") == "netstack: too many flows" {
				n++
			}
			if r.Kind == "net.events_lost" {
				var k int
				fmt.Sscan(r.f("lost"), &k)
				lost += k
			}
		}
		t.Logf("%d of %d refusals over the cap are in the log, %d events recorded as lost", n, refused, lost)
		if n+lost < refused {
			t.Errorf("%d refusals neither logged nor counted as lost", refused-n-lost)
		}
		e.expectWorking(t, pub3)
	})

	t.Run("udp-flood", func(t *testing.T) {
		e.use(t, "network:\n  mode: allow-all\n")
		// One datagram first: the echo path works.
		out, err := e.sh(fmt.Sprintf("netprobe udp %s:%d ping-udp", pub3, testutil.NetHostUDPEcho))
		if !strings.Contains(out, "ping-udp") {
			t.Fatalf("UDP echo through the gateway: %v %q\nlog: %v", err, out, e.records(t, false))
		}
		out, err = e.sh(fmt.Sprintf("netprobe udpflood %s:%d 3s", pub3, testutil.NetHostUDPEcho))
		if err != nil {
			t.Fatalf("netprobe udpflood: %v\n%s", err, out)
		}
		t.Logf("UDP flood: %s", strings.TrimSpace(out))
		var sent, echoed int
		fmt.Sscanf(out, "sent=%d echoed=%d", &sent, &echoed)
		if echoed == 0 || echoed >= sent {
			t.Errorf("sent %d, echoed %d: want some through and some dropped; log:\n%v", sent, echoed, e.records(t, false))
		}
		// Three seconds at 5000/s plus a one-second burst.
		if echoed > 4*5000 {
			t.Errorf("%d datagrams echoed in 3 s: not rate limited", echoed)
		}
		r := e.expect(t, want{kind: "net.refused", proto: "udp", rule: "^netstack: udp rate limit$", reason: "packets dropped"})
		if d, _ := strconv.Atoi(r.f("dropped")); d == 0 {
			t.Errorf("rate-limit record has no drop count: %s", r)
		}
		if out, err := e.sh("echo alive"); err != nil || out != "alive\n" {
			t.Fatalf("exec after the flood: %v %q", err, out)
		}
		e.expectWorking(t, pub3)
	})
}

// expectWorking fails t unless an HTTP GET to host:80 through the gateway
// gets the test page after a flood. Broken, not slow: under CI load the
// guest may still be taking in the flood's tail when the first request
// goes out (CI runs timed out the first one after both floods), so it
// gets a few tries of 5 s each.
func (e *egressEnv) expectWorking(t *testing.T, host string) {
	t.Helper()
	var got string
	for try := 0; try < 4 && !strings.Contains(got, hello); try++ {
		got = e.get(host, 80)
	}
	if !strings.Contains(got, hello) {
		t.Fatalf("network broken after the flood:\n%s", got)
	}
}
