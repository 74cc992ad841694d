package api_test

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/smx-dev/smx/client"
	"github.com/smx-dev/smx/internal/testutil"
)

// TestCredsAPI: secrets go in through the API and never come back out:
// every answer (set, list, login, import) describes a secret by name,
// size, fingerprint and the presets that send it, and none holds a value.
// No VM is needed.
func TestCredsAPI(t *testing.T) {
	bin := testutil.Binaries(t)
	home := t.TempDir()
	sock := filepath.Join(home, "api.sock")
	serve(t, bin, home, "--listen", "unix:"+sock)
	c, chk := checkedClient(t, sock)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	const token, key, access, refresh = "ghp_s3cr3t_value", "sk-ant-k3y-value", "sk-ant-oat-acc3ss", "sk-ant-ort-r3fresh"
	noSecret := func(what, body string) {
		t.Helper()
		for _, v := range []string{token, key, access, refresh, "s3cr3t", "k3y", "acc3ss", "r3fresh"} {
			if strings.Contains(body, v) {
				t.Errorf("%s answers a secret's value (%s):\n%s", what, v, body)
			}
		}
	}

	if l, err := c.Credentials(ctx); err != nil || l == nil || len(l) != 0 {
		t.Fatalf("creds of an empty store: %v %+v", err, l)
	}
	cr, err := c.SetCredential(ctx, "gh", []byte(token+"\n"))
	if err != nil || cr.Name != "gh" || cr.Bytes != len(token) || len(cr.SHA256Prefix) != 8 {
		t.Fatalf("set: %v %+v", err, cr)
	}
	if b, err := os.ReadFile(filepath.Join(home, "creds", "gh")); err != nil || string(b) != token {
		t.Fatalf("stored value: %v %q", err, b)
	}
	_, err = c.SetCredential(ctx, ".hidden", []byte(token))
	wantClass(t, "set a dot name", err, 400, client.ErrInvalid)
	_, err = c.SetCredential(ctx, "empty", []byte("\n"))
	wantClass(t, "set an empty value", err, 400, client.ErrInvalid)

	// An API key for a preset: bound to it, listed as its.
	lr, err := c.Login(ctx, client.LoginRequest{Preset: "claude", Key: key})
	if err != nil || lr.Secret != "claude" || lr.Bytes != len(key) || lr.Header == "" {
		t.Fatalf("login: %v %+v", err, lr)
	}
	_, err = c.Login(ctx, client.LoginRequest{Preset: "shell", Key: key})
	wantClass(t, "login to a preset without a credential", err, 400, client.ErrInvalid)
	_, err = c.Login(ctx, client.LoginRequest{Preset: "claude", Key: key, Import: true})
	wantClass(t, "login with a key and an import", err, 400, client.ErrInvalid)
	_, err = c.Login(ctx, client.LoginRequest{Preset: "claude", Import: true, File: filepath.Join(home, "nosuch.json")})
	if err == nil {
		t.Errorf("import of a missing file succeeded")
	}

	// A sign-in imported from the agent's file (on the server's host).
	f := filepath.Join(home, "claude-credentials.json")
	os.WriteFile(f, []byte(`{"claudeAiOauth":{"accessToken":"`+access+`","refreshToken":"`+refresh+`","expiresAt":4102444800000,"subscriptionType":"max"}}`), 0o600)
	lr, err = c.Login(ctx, client.LoginRequest{Preset: "claude", Import: true, File: f})
	if err != nil || lr.Secret != "claude" || lr.What != "max" || lr.File != f || lr.Expires.Year() != 2100 {
		t.Fatalf("import: %v %+v", err, lr)
	}

	l, err := c.Credentials(ctx)
	var names []string
	for _, cr := range l {
		names = append(names, cr.Name)
		if cr.Name == "claude" && (!slices.Equal(cr.Presets, []string{"claude"}) || !cr.SignIn) {
			t.Errorf("claude's secret is not listed as claude's sign-in: %+v", cr)
		}
		if cr.Name == "gh" && (len(cr.Presets) != 0 || cr.SignIn) {
			t.Errorf("gh is listed as a preset's: %+v", cr)
		}
	}
	if err != nil || !slices.Equal(names, []string{"claude", "claude.oauth", "gh"}) {
		t.Fatalf("creds: %v %v", err, names)
	}

	// What each route answers, byte for byte, holds no value.
	for _, r := range []struct{ method, path, body string }{
		{"GET", "/v1/creds", ""},
		{"PUT", "/v1/creds/gh", `{"value":"` + token + `"}`},
		{"POST", "/v1/creds/login", `{"preset":"claude","key":"` + key + `"}`},
		{"POST", "/v1/creds/login", `{"preset":"claude","import":true,"file":"` + f + `"}`},
		{"GET", "/v1/creds/gh", ""},
	} {
		var body io.Reader
		if r.body != "" {
			body = strings.NewReader(r.body)
		}
		code, out := raw(t, chk, sock, r.method, r.path, "application/json", body)
		noSecret(fmt.Sprintf("%s %s (%d)", r.method, r.path, code), out)
	}

	if err := c.RemoveCredential(ctx, "gh"); err != nil {
		t.Fatalf("rm: %v", err)
	}
	err = c.RemoveCredential(ctx, "gh")
	wantClass(t, "rm a missing credential", err, 404, client.ErrNotFound)
}

// TestSSHCAAPI: the SSH user CA is created on first use and kept; a
// rotation says which key it replaced; no answer holds the private key.
func TestSSHCAAPI(t *testing.T) {
	bin := testutil.Binaries(t)
	home := t.TempDir()
	sock := filepath.Join(home, "api.sock")
	serve(t, bin, home, "--listen", "unix:"+sock)
	c, chk := checkedClient(t, sock)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	first, err := c.SSHUserCA(ctx)
	if err != nil || !strings.HasPrefix(first.PublicKey, "ssh-") || !strings.HasPrefix(first.Fingerprint, "SHA256:") ||
		!strings.HasSuffix(first.AuthorizedKeys, first.PublicKey) || first.Replaced != "" {
		t.Fatalf("ssh-ca: %v %+v", err, first)
	}
	if again, err := c.SSHUserCA(ctx); err != nil || again.Fingerprint != first.Fingerprint {
		t.Fatalf("ssh-ca again: %v %+v, want %s kept", err, again, first.Fingerprint)
	}
	rot, err := c.RotateSSHUserCA(ctx)
	if err != nil || rot.Replaced != first.Fingerprint || rot.Fingerprint == first.Fingerprint {
		t.Fatalf("rotate: %v %+v (was %s)", err, rot, first.Fingerprint)
	}
	if now, err := c.SSHUserCA(ctx); err != nil || now.Fingerprint != rot.Fingerprint {
		t.Fatalf("ssh-ca after rotate: %v %+v", err, now)
	}
	key, err := os.ReadFile(filepath.Join(home, "ssh", "user_ca"))
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range []struct{ method, path string }{{"GET", "/v1/ssh-ca"}, {"POST", "/v1/ssh-ca/rotate"}} {
		_, out := raw(t, chk, sock, r.method, r.path, "", nil)
		if strings.Contains(out, "PRIVATE KEY") || strings.Contains(out, strings.TrimSpace(string(key))) {
			t.Errorf("%s %s answers the CA's private key:\n%s", r.method, r.path, out)
		}
	}
}
