package service

import (
	"testing"
)

// TestOwnedMountService: the preset's user owns the workspace and extra
// mounts unless a mount names its own owner.
func TestOwnedMountService(t *testing.T) {
	for _, c := range [][2]string{
		{"/src:/work", "/src:/work:uid=1000,gid=1000"},
		{"/src:/work:ro", "/src:/work:ro,uid=1000,gid=1000"},
		{"/src:/work:uid=5", "/src:/work:uid=5"},
	} {
		if got := OwnedMount(c[0], 1000, 1000); got != c[1] {
			t.Errorf("OwnedMount(%q) = %q, want %q", c[0], got, c[1])
		}
	}
}
