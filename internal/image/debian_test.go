package image

import (
	"context"
	"errors"
	"os"
	"strings"
	"testing"
	"time"
)

func TestMirrorParsing(t *testing.T) {
	list := `# comment
deb-src http://src.example/debian bookworm main
deb http://security.example/debian-security bookworm-security main
deb [arch=amd64 signed-by=/k.gpg] http://mirror.example/debian/ bookworm main contrib
`
	if got := mirrorFromList(list, "bookworm"); got != "http://mirror.example/debian" {
		t.Errorf("mirrorFromList = %q", got)
	}
	if got := mirrorFromList("deb cdrom:[x]/ bookworm main\n", "bookworm"); got != "" {
		t.Errorf("cdrom source used: %q", got)
	}
	sources := `Types: deb
# http://snapshot.debian.org/archive/debian/20250520T000000Z
URIs: http://deb.debian.org/debian
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: http://deb.debian.org/debian-security
Suites: bookworm-security
Components: main
`
	if got := mirrorFromDeb822(sources, "bookworm"); got != "http://deb.debian.org/debian" {
		t.Errorf("mirrorFromDeb822 = %q", got)
	}
	disabled := "Enabled: no\nTypes: deb\nURIs: http://off.example/debian\nSuites: bookworm\n"
	if got := mirrorFromDeb822(disabled, "bookworm"); got != "" {
		t.Errorf("disabled stanza used: %q", got)
	}
	if got := mirrorFromDeb822(sources, "trixie"); got != "" {
		t.Errorf("wrong suite used: %q", got)
	}
}

// TestBuildDebian runs debootstrap: minutes and a mirror, so only when
// asked with SMX_TEST_DEBIAN=1.
func TestBuildDebian(t *testing.T) {
	if os.Getenv("SMX_TEST_DEBIAN") != "1" {
		t.Skip("set SMX_TEST_DEBIAN=1 to build a Debian image (needs root, a mirror and a few minutes)")
	}
	if os.Geteuid() != 0 {
		t.Skip("debootstrap needs root")
	}
	requireBuildTools(t)
	requireTools(t, "debootstrap")
	s := testStore(t)
	start := time.Now()
	im, err := s.BuildDebian(t.Context(), "deb", []string{"jq"}, testWriter{t})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("debian build took %v: size %d MiB, %d MiB on disk, %s", time.Since(start).Round(time.Second), im.Size>>20, im.DiskBytes>>20, im.Digest)
	if want := "debian:bookworm+git,curl,ca-certificates,openssh-client,jq"; im.Source != want {
		t.Errorf("Source = %q, want %q", im.Source, want)
	}
	e := openExt4(t, im)
	for p, want := range map[string]string{
		"/home/user": "40755 1000 1000",
		"/tmp":       "41777 0 0",
	} {
		if got := e.stat(p); got != want {
			t.Errorf("stat %s = %q, want %q", p, got, want)
		}
	}
	for _, p := range []string{"/usr/bin/git", "/usr/bin/curl", "/usr/bin/ssh", "/usr/bin/jq", "/etc/ssl/certs/ca-certificates.crt", "/proc", "/sys", "/dev", "/run"} {
		if e.stat(p) == "" {
			t.Errorf("%s missing", p)
		}
	}
	if got := e.cat("/etc/passwd"); !strings.Contains(got, "user:x:1000:1000:") {
		t.Errorf("no user account: %s", got)
	}
	if got := e.debugfs("ls /var/cache/apt/archives"); strings.Contains(got, ".deb") {
		t.Errorf("apt cache not cleaned: %s", got)
	}
	if e.stat("/etc/resolv.conf") != "" {
		t.Errorf("host resolv.conf copied into the image")
	}
}

// testWriter sends progress lines to the test log.
type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// TestBuildDebianCancelled interrupts debootstrap while it has /proc and
// /sys mounted in its target: nothing may stay mounted, visible or on disk.
func TestBuildDebianCancelled(t *testing.T) {
	if os.Getenv("SMX_TEST_DEBIAN") != "1" {
		t.Skip("set SMX_TEST_DEBIAN=1 to build a Debian image (needs root, a mirror and a few minutes)")
	}
	if os.Geteuid() != 0 {
		t.Skip("debootstrap needs root")
	}
	requireBuildTools(t)
	requireTools(t, "debootstrap")
	s := testStore(t)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	var cancelled time.Time
	_, err := s.BuildDebian(ctx, "deb", nil, &cancelOn{step: "I: Configuring", cancel: func() {
		if cancelled.IsZero() {
			cancelled = time.Now()
		}
		cancel()
	}})
	t.Logf("build returned %v after the cancel", time.Since(cancelled).Round(time.Millisecond))
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v, want context.Canceled", err)
	}
	if list, err := s.List(); err != nil || len(list) != 0 {
		t.Errorf("List = %+v, %v", list, err)
	}
	assertNoTemp(t, s)
	if m, err := mountsUnder(s.Dir); err != nil || len(m) != 0 {
		t.Errorf("mounts left under the store: %v, %v", m, err)
	}
}
