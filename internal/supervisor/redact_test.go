package supervisor

import (
	"encoding/base64"
	"strings"
	"testing"
	"time"

	"github.com/smx-dev/smx/internal/creds"
	"github.com/smx-dev/smx/internal/statedir"
)

// A stored credential's value typed into a command line is redacted from
// what the supervisor records, and so is a sign-in's refresh token; a
// value stored while the sandbox runs is redacted from the next command.
func TestExecRedactsStoredCredentials(t *testing.T) {
	st := statedir.Dir{Root: t.TempDir()}
	store := creds.Store{Dir: st.Creds()}
	const token = "tok-3e8a61f0c2d94b7a" // no built-in token shape
	if err := store.Set("api-token", []byte(token+"\n")); err != nil {
		t.Fatal(err)
	}
	if err := store.SetOAuth("claude", "access-9d2b4e71c0", creds.OAuth{RefreshToken: "refresh-51c7a0e3f9", TokenURL: "https://tokens.example/t"}); err != nil {
		t.Fatal(err)
	}
	s := &Supervisor{opts: Options{State: st, Name: "x"}}
	args := []string{"curl", "-H", "Authorization: " + token, "-H", "X-Refresh: refresh-51c7a0e3f9",
		"-H", "Authorization: Basic " + base64.StdEncoding.EncodeToString([]byte("me:"+token)), "-d", "k=access-9d2b4e71c0"}
	got := strings.Join(s.execRedactor().Strings(args), " ")
	for _, leak := range []string{token, "refresh-51c7a0e3f9", "access-9d2b4e71c0", base64.StdEncoding.EncodeToString([]byte("me:" + token))} {
		if strings.Contains(got, leak) {
			t.Errorf("recorded args hold %q: %s", leak, got)
		}
	}
	if strings.Count(got, "[redacted]") != 4 || !strings.HasPrefix(got, "curl -H Authorization: [redacted]") {
		t.Errorf("recorded args: %s", got)
	}
	// A credential stored later is redacted from the next command.
	time.Sleep(10 * time.Millisecond)
	if err := store.Set("later", []byte("later-value-77f2")); err != nil {
		t.Fatal(err)
	}
	if got := s.execRedactor().String("echo later-value-77f2"); got != "echo [redacted]" {
		t.Errorf("a value stored while running: %q", got)
	}
}
