package cli_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/creack/pty"
	"golang.org/x/sys/unix"

	"github.com/smx-dev/smx/internal/cli"
	"github.com/smx-dev/smx/internal/creds"
)

// `smx creds set NAME` at a terminal reads the secret with echo off: the
// terminal never shows it, and it is stored whole.
func TestCredsSetNoEcho(t *testing.T) {
	t.Setenv("SMX_HOME", t.TempDir())
	ptm, tty, err := pty.Open()
	if err != nil {
		t.Skipf("no pseudo-terminal: %v", err)
	}
	defer ptm.Close()
	defer tty.Close()
	var mu sync.Mutex
	var shown bytes.Buffer // what the terminal displays
	go func() {
		b := make([]byte, 256)
		for {
			n, err := ptm.Read(b)
			mu.Lock()
			shown.Write(b[:n])
			mu.Unlock()
			if err != nil {
				return
			}
		}
	}()
	var stdout, stderr bytes.Buffer
	code := make(chan int, 1)
	go func() { code <- cli.Main(context.Background(), []string{"creds", "set", "tok"}, tty, &stdout, &stderr) }()
	// Type only once the terminal's echo is off, as a person would after
	// the prompt.
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		tio, err := unix.IoctlGetTermios(int(tty.Fd()), unix.TCGETS)
		if err != nil {
			t.Fatal(err)
		}
		if tio.Lflag&unix.ECHO == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("creds set never turned the terminal's echo off")
		}
	}
	ptm.Write([]byte("s3cret-value\n"))
	select {
	case c := <-code:
		if c != 0 {
			t.Fatalf("creds set: exit %d: %s", c, stderr.String())
		}
	case <-time.After(20 * time.Second):
		t.Fatal("creds set did not return")
	}
	time.Sleep(50 * time.Millisecond)
	mu.Lock()
	defer mu.Unlock()
	if strings.Contains(shown.String(), "s3cret") {
		t.Fatalf("the terminal showed the secret: %q", shown.String())
	}
	if !strings.Contains(stdout.String(), "tok stored (12 bytes)") {
		t.Fatalf("stdout %q, stderr %q", stdout.String(), stderr.String())
	}
}

// `smx creds login gemini` stores the Gemini API key under the preset's
// secret, and --import takes the host user's Google sign-in from
// ~/.gemini/oauth_creds.json with what the host needs to refresh it; no
// value is ever printed. (That the guest sees only placeholders is
// TestAgentRunGemini's.)
func TestCredsLoginGemini(t *testing.T) {
	home := t.TempDir()
	t.Setenv("SMX_HOME", home)
	t.Setenv("XDG_CONFIG_HOME", filepath.Join(home, ".config"))
	run := func(stdin string, args ...string) string {
		t.Helper()
		var stdout, stderr bytes.Buffer
		if code := cli.Main(context.Background(), args, strings.NewReader(stdin), &stdout, &stderr); code != 0 {
			t.Fatalf("smx %v: exit %d: %s", args, code, stderr.String())
		}
		return stdout.String() + stderr.String()
	}
	const key = "AIzaSy-hostkey-7e1f"
	out := run(key+"\n", "creds", "login", "gemini")
	if !strings.Contains(out, "key stored as gemini") || !strings.Contains(out, "x-goog-api-key") || strings.Contains(out, key) {
		t.Fatalf("login: %q", out)
	}
	store := creds.Store{Dir: filepath.Join(home, "creds")}
	if v, err := store.Get("gemini"); err != nil || string(v) != key {
		t.Fatalf("stored %q, %v", v, err)
	}
	if ls := run("", "creds", "ls"); !strings.Contains(ls, "gemini") || strings.Contains(ls, key) {
		t.Fatalf("creds ls: %q", ls)
	}

	userHome := t.TempDir()
	os.MkdirAll(filepath.Join(userHome, ".gemini"), 0o700)
	exp := time.Now().Add(30 * time.Minute).Truncate(time.Millisecond)
	os.WriteFile(filepath.Join(userHome, ".gemini", "oauth_creds.json"), []byte(fmt.Sprintf(
		`{"access_token":"ya29.hosttoken-3b9d","refresh_token":"1//hostrefresh-51ac","scope":"https://www.googleapis.com/auth/cloud-platform","token_type":"Bearer","id_token":"eyJ.h.s","expiry_date":%d}`,
		exp.UnixMilli())), 0o600)
	t.Setenv("HOME", userHome)
	out = run("", "creds", "login", "gemini", "--import")
	if !strings.Contains(out, "gemini: sign-in imported from "+filepath.Join(userHome, ".gemini", "oauth_creds.json")) ||
		strings.Contains(out, "ya29.") || strings.Contains(out, "1//") {
		t.Fatalf("import: %q", out)
	}
	if v, _ := store.Get("gemini"); string(v) != "ya29.hosttoken-3b9d" {
		t.Fatalf("the access token stored is %q", v)
	}
	o, err := store.OAuthOf("gemini")
	if err != nil || o.RefreshToken != "1//hostrefresh-51ac" || !o.ExpiresAt.Equal(exp) || o.TokenURL != "https://oauth2.googleapis.com/token" ||
		!strings.HasSuffix(o.ClientID, ".apps.googleusercontent.com") || o.ClientSecret == "" || !o.Form {
		t.Fatalf("refresh material %+v, %v", o, err)
	}
	// An API key given later replaces the sign-in.
	run(key+"\n", "creds", "login", "gemini")
	if _, err := store.OAuthOf("gemini"); err == nil {
		t.Fatal("the sign-in outlived the API key that replaced it")
	}
	// No sign-in on this machine: a one-line error that says what to do.
	os.Remove(filepath.Join(userHome, ".gemini", "oauth_creds.json"))
	var stdout, stderr bytes.Buffer
	if code := cli.Main(context.Background(), []string{"creds", "login", "gemini", "--import"}, strings.NewReader(""), &stdout, &stderr); code == 0 ||
		!strings.Contains(stderr.String(), "sign in with the agent's own CLI") {
		t.Fatalf("import without a sign-in: exit %d: %s", code, stderr.String())
	}
}
