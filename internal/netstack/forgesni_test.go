package netstack

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/smx-dev/smx/internal/audit"
	"github.com/smx-dev/smx/internal/gitgw"
	"github.com/smx-dev/smx/internal/testutil"
	"github.com/smx-dev/smx/internal/tlsgw"
)

const (
	forgeTestName  = "forge.test"
	forgeTestToken = "ghp_netstack_test_0a1b2c3d"
	forgeTestAddr  = "203.0.113.20"
)

// forgeGitRules is the git section of the forge tests: acme's repos
// readable and pushable except main, acme/secret not even readable.
const forgeGitRules = `
git:
  repos:
    - repo: forge.test/acme/*
      read: allow
      push: allow
      refs:
        - ref: refs/heads/main
          push: deny
    - repo: forge.test/acme/secret
      read: deny
credentials:
  - name: forge
    from: forge-token
    forge: forge.test
`

// forgeRig is a rig whose forge gateway is the real Git gateway in front
// of a real forge (git http-backend behind HTTPS and a token) at
// forgeTestAddr:443, with the network section given; its records are
// collected.
type forgeRig struct {
	*rig
	ca     *tlsgw.CA
	caFile string // the sandbox CA, for the guest's git
	gw     *gitgw.Gateway
	forge  *testutil.GitForge
	recs   testutil.Records
}

func newForgeRig(t *testing.T, network string) *forgeRig {
	t.Helper()
	return newForgeRigWith(t, network, forgeGitRules)
}

// newForgeRigWith is newForgeRig with another git section (and
// credentials).
func newForgeRigWith(t *testing.T, network, git string) *forgeRig {
	t.Helper()
	fr := &forgeRig{}
	fr.forge = testutil.NewGitForge(t, forgeTestName, forgeTestToken)
	fr.forge.NewRepo(t, "acme/app.git", 2)
	fr.forge.NewRepo(t, "acme/secret.git", 1)
	up := fr.forge.ServeLoopback(t)
	prof := mustProfile(t, network+git)
	gw := gitgw.New(gitgw.Config{
		Secret:  testutil.Secret("forge-token", []byte(forgeTestToken+"\n")),
		Log:     fr.recs.Log,
		Mirrors: &gitgw.Mirrors{Dir: t.TempDir()},
	}, prof)
	fr.gw = gw
	upRoots := x509.NewCertPool()
	upRoots.AppendCertsFromPEM(fr.forge.CA)
	hosts, err := ParseHosts(strings.NewReader(forgeTestAddr+" mirror.other.test\n"), "hosts")
	if err != nil {
		t.Fatal(err)
	}
	fr.ca, err = tlsgw.New("test")
	if err != nil {
		t.Fatal(err)
	}
	fr.rig = newRig(t, func(c *Config) {
		c.Policy = ProfilePolicy(prof)
		c.Credentials = ProfileCredentials(prof)
		c.Resolver = hosts
		c.CA = fr.ca
		c.UpstreamRoots = upRoots
		c.Forge = gw
	})
	fr.route("tcp", forgeTestAddr+":443", up.Addr().String())
	fr.caFile = filepath.Join(t.TempDir(), "sandbox-ca.pem")
	if err := os.WriteFile(fr.caFile, fr.ca.CertPEM(), 0o644); err != nil {
		t.Fatal(err)
	}
	return fr
}

func (fr *forgeRig) records(kind string) []map[string]any { return fr.recs.Kind(kind) }

// bridge listens on host loopback and joins each connection to a new
// connection the guest opens to dst, so that host programs (git) act as
// the guest.
func (r *rig) bridge(t *testing.T, dst string) string {
	t.Helper()
	return testutil.ServeTCP(t, func(c net.Conn) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		g, err := r.dialTCP(ctx, dst)
		cancel()
		if err != nil {
			c.Close()
			return
		}
		splice(c, g)
	}).Addr().String()
}

// guestGit runs the host's git as the guest would: https://forge.test
// reaches dst through the guest's stack, and git trusts the sandbox CA
// only (as the guest's trust store does). It returns the output and
// whether git succeeded.
func (fr *forgeRig) guestGit(t *testing.T, dst, dir string, args ...string) (string, bool) {
	t.Helper()
	_, port, _ := net.SplitHostPort(fr.bridge(t, dst))
	all := append([]string{"-c", "http.curloptResolve=" + forgeTestName + ":" + port + ":127.0.0.1"}, args...)
	for i, a := range all {
		all[i] = strings.ReplaceAll(a, "https://forge.test/", "https://forge.test:"+port+"/")
	}
	cmd := testutil.GitCmd(dir, all...)
	cmd.Env = append(cmd.Env, "GIT_SSL_CAINFO="+fr.caFile)
	out, err := cmd.CombinedOutput()
	return string(out), err == nil
}

// TestForgeSNIUnderAnotherName: while the profile names a forge, a TLS
// flow whose server name is the forge goes to the Git gateway whatever
// name or rule let the flow through (a name our DNS answered with the
// forge's address under allow-all, a cidr rule), so the forge's repo and
// branch rules hold: a clone of the read-denied repository and a push to
// the protected branch are refused by the Git gateway and recorded, an
// allowed clone goes through it with the host-held token, and nothing
// reaches the forge with the guest's own TLS. Before, such a flow was
// dialled directly: git met the forge's own certificate.
func TestForgeSNIUnderAnotherName(t *testing.T) {
	testutil.RequireGit(t)
	for _, tc := range []struct{ name, network, resolve string }{
		{"allow-all, a name resolving to the forge", "network:\n  mode: allow-all\n", "mirror.other.test"},
		{"cidr rule, a name resolving to the forge", "network:\n  mode: default-deny\n  allow:\n    - domain: mirror.other.test\n      ports: [80]\n    - cidr: 203.0.113.0/24\n      ports: [443]\n", "mirror.other.test"},
		{"allow-all, raw address", "network:\n  mode: allow-all\n", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fr := newForgeRig(t, tc.network)
			if tc.resolve != "" {
				fr.resolve(t, tc.resolve)
			}
			dst := forgeTestAddr + ":443"
			work := t.TempDir()

			out, ok := fr.guestGit(t, dst, work, "clone", "https://forge.test/acme/secret.git", "secret")
			if ok || !strings.Contains(out, "smx: reading forge.test/acme/secret denied") {
				t.Fatalf("clone of the read-denied repo: ok=%v\n%s", ok, out)
			}
			refused := fr.records(audit.KindGitRefused)
			if len(refused) == 0 || refused[0]["repo"] != "forge.test/acme/secret" {
				t.Fatalf("git.refused records: %v", refused)
			}
			t.Logf("clone refusal: %v", refused[0])

			out, ok = fr.guestGit(t, dst, work, "clone", "https://forge.test/acme/app.git", "app")
			if !ok {
				t.Fatalf("clone of an allowed repo: %s", out)
			}
			app := filepath.Join(work, "app")
			os.WriteFile(filepath.Join(app, "x.txt"), []byte("x\n"), 0o644)
			testutil.Git(t, app, "add", "x.txt")
			testutil.Git(t, app, "commit", "-qm", "x")
			out, ok = fr.guestGit(t, dst, app, "push", "https://forge.test/acme/app.git", "HEAD:refs/heads/main")
			if ok || !strings.Contains(out, "remote rejected") || !strings.Contains(out, "smx:") {
				t.Fatalf("push to the protected branch: ok=%v\n%s", ok, out)
			}
			var pushRefusal map[string]any
			for _, rec := range fr.records(audit.KindGitRefused) {
				if rec["repo"] == "forge.test/acme/app" {
					pushRefusal = rec
				}
			}
			if pushRefusal == nil {
				t.Fatalf("no git.refused record for the push: %v", fr.records(audit.KindGitRefused))
			}
			t.Logf("push refusal: %v", pushRefusal)
			for _, req := range fr.forge.Requests() {
				if strings.Contains(req, "secret") || !strings.HasSuffix(req, "auth=yes") {
					t.Errorf("the forge saw %q: not through the Git gateway", req)
				}
			}
		})
	}
}

// TestForgeNamesOnly: what could reach a forge with nothing for the Git
// gateway to decide by is refused and recorded while forges are named: TLS
// to port 443 without a server name, a server name naming the forge in
// another case and with a trailing dot (decided as the forge), plain HTTP
// whose Host names the forge (first request or a later one), and a
// CONNECT to the forge through a proxy.
func TestForgeNamesOnly(t *testing.T) {
	testutil.RequireGit(t)
	fr := newForgeRig(t, "network:\n  mode: allow-all\n")
	fr.route("tcp", forgeTestAddr+":80", httpServer(t))
	fr.resolve(t, "mirror.other.test")

	// No server name: refused before anything is dialled.
	n := len(fr.eventsSnapshot())
	if body, err := fr.guestTLSGet(t, forgeTestAddr+":443", "", forgeTestName); err == nil {
		t.Errorf("TLS without a server name reached %q", body)
	}
	e := fr.waitEventAfter(t, n, "no-SNI refusal", func(e Event) bool { return e.Kind == audit.KindNetRefused })
	if e.Decision.Rule != RuleNoName || !strings.Contains(e.Decision.Reason, "names Git forges") {
		t.Errorf("refusal = %v", e.Fields())
	}
	t.Logf("no-SNI refusal: %v", e.Fields())

	// The forge's name in another spelling is the forge.
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(fr.ca.CertPEM())
	cl := &http.Client{Transport: &http.Transport{
		DialContext:     func(ctx context.Context, _, _ string) (net.Conn, error) { return fr.dialTCP(ctx, forgeTestAddr+":443") },
		TLSClientConfig: &tls.Config{ServerName: "Forge.TEST", RootCAs: roots},
	}, Timeout: 10 * time.Second}
	defer cl.CloseIdleConnections()
	resp, err := cl.Get("https://forge.test/acme/secret.git/info/refs?service=git-upload-pack")
	if err != nil {
		t.Fatalf("SNI Forge.TEST: %v", err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(b), "smx: reading forge.test/acme/secret denied") || len(fr.records(audit.KindGitRefused)) == 0 {
		t.Errorf("SNI Forge.TEST: %d %q, records %v", resp.StatusCode, b, fr.records(audit.KindGitRefused))
	}

	// Plain HTTP naming the forge, first request and a later one.
	for _, req := range []string{
		"GET /acme/secret.git/info/refs HTTP/1.1\r\nHost: forge.test\r\n\r\n",
		"GET / HTTP/1.1\r\nHost: mirror.other.test\r\n\r\nGET /acme/secret.git/info/refs HTTP/1.1\r\nHost: FORGE.test.\r\n\r\n",
	} {
		n := len(fr.eventsSnapshot())
		got := fr.rawExchange(t, forgeTestAddr+":80", req)
		if !strings.Contains(got, "403 Forbidden") || strings.Contains(got, "hello forge") || strings.Contains(got, "hello FORGE") {
			t.Errorf("plain HTTP to the forge: %q", got)
		}
		e := fr.waitEventAfter(t, n, "plain-HTTP refusal", func(e Event) bool { return e.Kind == audit.KindNetRefused })
		if e.Decision.Rule != "netstack: forge over plain HTTP" {
			t.Errorf("refusal = %v", e.Fields())
		}
		t.Logf("plain-HTTP refusal: %v", e.Fields())
	}

	// A CONNECT to the forge through a proxy on port 80.
	n = len(fr.eventsSnapshot())
	if got := fr.rawExchange(t, forgeTestAddr+":80", "CONNECT forge.test:443 HTTP/1.1\r\nHost: forge.test:443\r\n\r\n"); !gatewayRefusal(got) {
		t.Errorf("CONNECT to the forge: %q", got)
	}
	e = fr.waitEventAfter(t, n, "CONNECT refusal", func(e Event) bool { return e.Kind == audit.KindNetRefused })
	if e.Decision.Rule != "netstack: forge over plain HTTP" || e.Connect != "forge.test:443" {
		t.Errorf("refusal = %v", e.Fields())
	}
}

// A flow read only for forge names (allow-all, port 80) is not held to a
// domain rule's demands: a request without a Host still goes through.
func TestForgeHTTPWithoutHost(t *testing.T) {
	testutil.RequireGit(t)
	fr := newForgeRig(t, "network:\n  mode: allow-all\n")
	fr.route("tcp", forgeTestAddr+":80", httpServer(t))
	if got := fr.rawExchange(t, forgeTestAddr+":80", "GET / HTTP/1.0\r\n\r\n"); !strings.Contains(got, "200 OK") {
		t.Errorf("HTTP/1.0 without Host under allow-all: %q", got)
	}
}

// TestForgeNamedLater: a profile change that names a forge closes live
// connections that would now go through the Git gateway but opened past
// it (one to port 443 whose server name was never read, since no forge
// was named then), with a net.refused record; the next connection is the
// Git gateway's.
func TestForgeNamedLater(t *testing.T) {
	testutil.RequireGit(t)
	fr := newForgeRigWith(t, "network:\n  mode: allow-all\n", "")
	c, err := fr.dialTCP(ctxT(t), forgeTestAddr+":443")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	tc := tls.Client(c, &tls.Config{ServerName: forgeTestName, InsecureSkipVerify: true})
	if err := tc.HandshakeContext(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	if cn := tc.ConnectionState().PeerCertificates[0].Issuer.CommonName; !strings.Contains(cn, "test CA for forge.test") {
		t.Fatalf("before forges are named the guest meets %q", cn)
	}
	prof := mustProfile(t, "network:\n  mode: allow-all\n"+forgeGitRules)
	fr.gw.SetProfile(prof)
	fr.s.SetPolicy(ProfilePolicy(prof))
	n := len(fr.eventsSnapshot())
	if closed := fr.s.Reevaluate(); closed != 1 {
		t.Errorf("Reevaluate closed %d flows, want 1", closed)
	}
	e := fr.waitEventAfter(t, n, "refusal", func(e Event) bool { return e.Kind == audit.KindNetRefused })
	if e.Decision.Rule != RuleForgeLater {
		t.Errorf("refusal = %v", e.Fields())
	}
	t.Logf("refusal: %v", e.Fields())
	tc.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := tc.Write([]byte("GET / HTTP/1.1\r\nHost: forge.test\r\n\r\n")); err == nil {
		if _, err := tc.Read(make([]byte, 1)); err == nil {
			t.Error("the connection opened past the Git gateway still carries requests")
		}
	}
}
