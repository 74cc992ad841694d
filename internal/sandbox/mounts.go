package sandbox

import (
	"fmt"
	"os"
	"path"
	"path/filepath"
	"strings"

	"smx/internal/errdefs"
)

// Mount is a host folder shared into the sandbox.
type Mount struct {
	Host     string `json:"host"`  // absolute, clean, an existing directory
	Guest    string `json:"guest"` // absolute, clean, not /
	ReadOnly bool   `json:"read_only,omitempty"`
}

// String is the mount in -v notation.
func (m Mount) String() string {
	s := m.Host + ":" + m.Guest
	if m.ReadOnly {
		s += ":ro"
	}
	return s
}

// ParseMount reads Docker's -v notation, HOST:GUEST[:ro|:rw]. A relative
// HOST is taken from the working directory; it must be an existing
// directory.
func ParseMount(s string) (Mount, error) {
	bad := func(why string) (Mount, error) {
		return Mount{}, fmt.Errorf("-v %s: %s: %w", s, why, errdefs.ErrInvalid)
	}
	parts := strings.Split(s, ":")
	var m Mount
	switch {
	case len(parts) == 2:
	case len(parts) == 3 && (parts[2] == "ro" || parts[2] == "rw"):
		m.ReadOnly = parts[2] == "ro"
	default:
		return bad("want HOST:GUEST or HOST:GUEST:ro")
	}
	host, err := filepath.Abs(parts[0])
	if err != nil || parts[0] == "" {
		return bad("host path is empty")
	}
	m.Host, m.Guest = host, parts[1]
	if !path.IsAbs(m.Guest) || path.Clean(m.Guest) != m.Guest || m.Guest == "/" {
		return bad("guest path must be absolute and clean, and not /")
	}
	for _, sys := range []string{"/proc", "/sys", "/dev", "/run", "/etc", "/bin", "/sbin", "/lib", "/usr"} {
		if m.Guest == sys || strings.HasPrefix(m.Guest, sys+"/") {
			return bad("guest path is under " + sys + ", which the guest system needs; pick e.g. /work")
		}
	}
	fi, err := os.Stat(m.Host)
	if err != nil {
		return bad(m.Host + " does not exist; create it first")
	}
	if !fi.IsDir() {
		return bad(m.Host + " is not a directory; share its folder")
	}
	return m, nil
}

// CheckMounts refuses two mounts at one guest path.
func CheckMounts(ms []Mount) error {
	seen := map[string]bool{}
	for _, m := range ms {
		if seen[m.Guest] {
			return fmt.Errorf("-v: %s is mounted twice: %w", m.Guest, errdefs.ErrInvalid)
		}
		seen[m.Guest] = true
	}
	return nil
}
