package testutil

import (
	"os"
	"path/filepath"
	"testing"
	"time"
)

// WriteTree writes files (slash-separated path under dir → content) with
// mode 0644, making parent directories 0755, and returns dir. A failed
// write fails the test.
func WriteTree(t testing.TB, dir string, files map[string]string) string {
	t.Helper()
	for name, body := range files {
		p := filepath.Join(dir, filepath.FromSlash(name))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// WaitFor polls check until it returns nil, failing the test with what and
// check's last error after timeout (or at once if the test has already
// failed). It polls every 10 ms at first, backing off to every 500 ms, so
// quick conditions are seen quickly and slow ones (a VM booting) do not
// spin.
func WaitFor(t testing.TB, what string, timeout time.Duration, check func() error) {
	t.Helper()
	wait := 10 * time.Millisecond
	for deadline := time.Now().Add(timeout); ; time.Sleep(wait) {
		err := check()
		if err == nil {
			return
		}
		if t.Failed() || time.Now().After(deadline) {
			t.Fatalf("%s: not after %v: %v", what, timeout, err)
		}
		wait = min(2*wait, 500*time.Millisecond)
	}
}
