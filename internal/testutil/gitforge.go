package testutil

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"net/http"
	"net/http/cgi"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// GitForge is a real Git smart-HTTP server for tests: git http-backend
// (through net/http/cgi) behind HTTPS with its own test CA and HTTP basic
// auth with a token, as a forge is. It also answers /api/... with
// "auth=yes" or "auth=no" (whether the token came with the request), a
// stand-in for a forge's API.
type GitForge struct {
	Name   string // the forge's host name (its certificate's name)
	Root   string // GIT_PROJECT_ROOT: repositories live at Root/OWNER/NAME.git
	Token  string
	CA     []byte // PEM of the CA that signed the certificate (SMX_EXTRA_CA_FILE)
	CAFile string
	Cert   tls.Certificate

	mu       sync.Mutex
	requests []string // "METHOD PATH auth=yes|no|bad"
}

// RequireGit needs git and its http-backend on the host.
func RequireGit(t testing.TB) {
	t.Helper()
	_, err := exec.LookPath("git")
	Require(t, err == nil, "git", "apt-get install git")
}

// NewGitForge makes a forge named name with an empty Root.
func NewGitForge(t testing.TB, name, token string) *GitForge {
	t.Helper()
	RequireGit(t)
	f := &GitForge{Name: name, Root: t.TempDir(), Token: token}
	f.CA, f.CAFile, f.Cert = TestCert(t, name)
	return f
}

// TestCert makes a CA and a certificate for name signed by it: the CA's
// PEM, a file holding it, and the certificate.
func TestCert(t testing.TB, name string) ([]byte, string, tls.Certificate) {
	t.Helper()
	caKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	caTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test CA for " + name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, _ := x509.ParseCertificate(caDER)
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: name}, DNSNames: []string{name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	caPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER})
	file := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(file, caPEM, 0o644); err != nil {
		t.Fatal(err)
	}
	return caPEM, file, tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

// Serve serves the forge over TLS on ln until the test ends.
func (f *GitForge) Serve(t testing.TB, ln net.Listener) {
	git, _ := exec.LookPath("git")
	backend := &cgi.Handler{
		Path: git,
		Args: []string{"http-backend"},
		Root: "/",
		Env: []string{"GIT_PROJECT_ROOT=" + f.Root, "GIT_HTTP_EXPORT_ALL=1", "REMOTE_USER=agent",
			"GIT_CONFIG_NOSYSTEM=1", "GIT_CONFIG_GLOBAL=/dev/null", "HOME=/nonexistent"},
	}
	srv := &http.Server{
		TLSConfig:         &tls.Config{Certificates: []tls.Certificate{f.Cert}},
		ReadHeaderTimeout: time.Minute,
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			auth := "no"
			if h := r.Header.Get("Authorization"); h != "" {
				auth = "bad"
				if b, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(h, "Basic ")); err == nil {
					if _, pass, _ := strings.Cut(string(b), ":"); pass == f.Token {
						auth = "yes"
					}
				}
			}
			f.mu.Lock()
			f.requests = append(f.requests, r.Method+" "+r.URL.Path+" auth="+auth)
			f.mu.Unlock()
			if strings.HasPrefix(r.URL.Path, "/api/") {
				fmt.Fprintf(w, "auth=%s\n", auth)
				return
			}
			if auth != "yes" {
				w.Header().Set("WWW-Authenticate", `Basic realm="forge"`)
				http.Error(w, "authentication required", http.StatusUnauthorized)
				return
			}
			backend.ServeHTTP(w, r)
		}),
	}
	go srv.ServeTLS(ln, "", "")
	t.Cleanup(func() { srv.Close() })
}

// ServeLoopback serves the forge on a free port of host loopback until the
// test ends and returns the listener.
func (f *GitForge) ServeLoopback(t testing.TB) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f.Serve(t, ln)
	return ln
}

// Requests returns the requests served so far.
func (f *GitForge) Requests() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.requests...)
}

// NewRepo makes the bare repository Root/path (e.g. "acme/app.git") with
// a main branch of n commits and returns the work tree it was pushed from.
func (f *GitForge) NewRepo(t testing.TB, path string, n int) string {
	t.Helper()
	bare := filepath.Join(f.Root, path)
	Git(t, "", "init", "--bare", "--quiet", "-b", "main", bare)
	Git(t, bare, "config", "http.receivepack", "true")
	work := t.TempDir()
	Git(t, work, "init", "--quiet", "-b", "main")
	for i := 0; i < n; i++ {
		os.WriteFile(filepath.Join(work, "file.txt"), []byte(fmt.Sprintf("line %d\n", i)), 0o644)
		Git(t, work, "add", "file.txt")
		Git(t, work, "commit", "--quiet", "-m", fmt.Sprintf("commit %d", i))
	}
	Git(t, work, "push", "--quiet", bare, "main")
	return work
}

// BareRepo makes the bare repository bare (a forge's copy, served by
// git http-backend or over SSH) whose main branch is one commit, msg,
// holding files (none: an empty commit), and returns the work tree it was
// pushed from.
func BareRepo(t testing.TB, bare, msg string, files map[string]string) string {
	t.Helper()
	Git(t, "", "init", "--quiet", "--bare", "-b", "main", bare)
	work := t.TempDir()
	Git(t, work, "init", "--quiet", "-b", "main")
	WriteTree(t, work, files)
	Git(t, work, "add", "-A")
	Git(t, work, "commit", "--quiet", "--allow-empty", "-m", msg)
	Git(t, work, "push", "--quiet", bare, "main")
	return work
}

// Git runs git in dir (none when "") with a clean configuration and a
// fixed identity, failing the test on error; it returns the output.
func Git(t testing.TB, dir string, args ...string) string {
	t.Helper()
	out, err := GitCmd(dir, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("git %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return strings.TrimSpace(string(out))
}

// GitCmd is the command Git runs.
func GitCmd(dir string, args ...string) *exec.Cmd {
	cmd := exec.Command("git", args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GIT_CONFIG_NOSYSTEM=1", "GIT_CONFIG_GLOBAL=/dev/null", "GIT_TERMINAL_PROMPT=0",
		"GIT_AUTHOR_NAME=t", "GIT_AUTHOR_EMAIL=t@example.test", "GIT_COMMITTER_NAME=t", "GIT_COMMITTER_EMAIL=t@example.test")
	return cmd
}
