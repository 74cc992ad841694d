package supervisor

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/smx-dev/smx/internal/errdefs"
	"github.com/smx-dev/smx/internal/sandbox"
)

// A git directory mounted under a name the protection of files the host
// runs does not recognise would leave its config and hooks writable: the
// mount is refused unless read-only, protect=off or named *.git.
func TestGitDirMountNeedsGitName(t *testing.T) {
	top := t.TempDir()
	bare := filepath.Join(top, "forge")
	for _, d := range []string{"objects", "refs"} {
		os.MkdirAll(filepath.Join(bare, d), 0o755)
	}
	os.WriteFile(filepath.Join(bare, "HEAD"), []byte("ref: refs/heads/main\n"), 0o644)
	for _, c := range []struct {
		m  sandbox.Mount
		ok bool
	}{
		{sandbox.Mount{Host: bare, Guest: "/forge"}, false},
		{sandbox.Mount{Host: bare, Guest: "/forge.git"}, true},
		{sandbox.Mount{Host: bare, Guest: "/forge", ReadOnly: true}, true},
		{sandbox.Mount{Host: bare, Guest: "/forge", Unprotected: true}, true},
		{sandbox.Mount{Host: top, Guest: "/work"}, true},
	} {
		s := &Supervisor{spec: sandbox.Spec{Mounts: []sandbox.Mount{c.m}}}
		_, err := s.shareList(nil)
		if c.ok && err != nil || !c.ok && !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("-v %s: got %v, want ok=%v", c.m, err, c.ok)
		}
	}
}
