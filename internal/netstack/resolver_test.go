package netstack

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// SMX_HOSTS_FILE is read again when it changes, and a broken edit keeps
// the last good table.
func TestHostsFileReload(t *testing.T) {
	p := filepath.Join(t.TempDir(), "hosts")
	write := func(s string, age time.Duration) {
		if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
		// Distinct modification times whatever the filesystem's resolution.
		mt := time.Now().Add(-age)
		os.Chtimes(p, mt, mt)
	}
	write("203.0.113.1 a.test\n", time.Hour)
	r, err := NewHostsFileResolver(p)
	if err != nil {
		t.Fatal(err)
	}
	lookup := func(name string) string {
		ips, err := r.LookupNetIP(context.Background(), "ip4", name)
		if err != nil {
			return err.Error()
		}
		return ips[0].String()
	}
	if got := lookup("a.test"); got != "203.0.113.1" {
		t.Fatalf("a.test = %s", got)
	}
	write("203.0.113.2 a.test\n203.0.113.3 b.test\n", time.Minute)
	if a, b := lookup("a.test"), lookup("b.test"); a != "203.0.113.2" || b != "203.0.113.3" {
		t.Fatalf("after the edit: a.test = %s, b.test = %s", a, b)
	}
	write("not an address\n", 0)
	if got := lookup("b.test"); got != "203.0.113.3" || r.Err() == nil {
		t.Fatalf("after a broken edit: b.test = %s, err = %v", got, r.Err())
	}
	if _, err := NewHostsFileResolver(filepath.Join(t.TempDir(), "none")); err == nil {
		t.Fatal("a missing hosts file was accepted")
	}
}
