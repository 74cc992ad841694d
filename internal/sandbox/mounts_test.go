package sandbox

import (
	"errors"
	"testing"

	"github.com/smx-dev/smx/internal/errdefs"
)

func TestParseMount(t *testing.T) {
	dir := t.TempDir()
	for _, c := range []struct {
		in   string
		want Mount // Host is dir
		err  bool
	}{
		{in: dir + ":/work", want: Mount{Guest: "/work"}},
		{in: dir + ":/work:ro", want: Mount{Guest: "/work", ReadOnly: true}},
		{in: dir + ":/work:rw", want: Mount{Guest: "/work"}},
		{in: dir + ":/work:uid=1000", want: Mount{Guest: "/work", UID: 1000, GID: 1000}},
		{in: dir + ":/work:ro,uid=1000,gid=100", want: Mount{Guest: "/work", ReadOnly: true, UID: 1000, GID: 100}},
		{in: dir + ":/work:gid=5", want: Mount{Guest: "/work", GID: 5}},
		{in: dir + ":/pod:protect=off", want: Mount{Guest: "/pod", Unprotected: true}},
		{in: dir + ":/work:protect=on,ro", want: Mount{Guest: "/work", ReadOnly: true}},
		{in: dir + ":/work:protect=no", err: true},
		{in: dir + ":/work:uid=-1", err: true},
		{in: dir + ":/work:uid=4294967295", err: true},
		{in: dir + ":/work:uid=", err: true},
		{in: dir + ":/work:user=1000", err: true},
		{in: dir + ":/work:ro,", err: true},
		{in: dir + ":/work:ro:uid=1", err: true},
		{in: dir + ":/etc/x", err: true},
	} {
		m, err := ParseMount(c.in)
		if c.err {
			if !errors.Is(err, errdefs.ErrInvalid) {
				t.Errorf("%s: got %+v, %v; want an invalid-argument error", c.in, m, err)
			}
			continue
		}
		c.want.Host = dir
		if err != nil || m != c.want {
			t.Errorf("%s: got %+v, %v; want %+v", c.in, m, err, c.want)
			continue
		}
		// String gives back what parses to the same mount.
		if back, err := ParseMount(m.String()); err != nil || back != m {
			t.Errorf("%s: String %q parses to %+v, %v", c.in, m.String(), back, err)
		}
	}
}
