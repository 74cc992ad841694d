package sandbox

import (
	"fmt"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/smx-dev/smx/internal/errdefs"
)

// Mount is a host folder shared into the sandbox.
type Mount struct {
	Host     string `json:"host"`  // absolute, clean, an existing directory
	Guest    string `json:"guest"` // absolute, clean, not /
	ReadOnly bool   `json:"read_only,omitempty"`
	// UID and GID own the host user's files in the guest (0:0 unless
	// given); see internal/fsgw for the whole mapping.
	UID uint32 `json:"uid,omitempty"`
	GID uint32 `json:"gid,omitempty"`
	// Unprotected (protect=off) lets the guest write the files the host
	// runs (.git/config, hooks, .envrc, .vscode/, ...; see
	// internal/policy) under this mount, for a folder no host tool works
	// in.
	Unprotected bool `json:"unprotected,omitempty"`
}

// String is the mount in -v notation.
func (m Mount) String() string {
	var opts []string
	if m.ReadOnly {
		opts = append(opts, "ro")
	}
	if m.UID != 0 || m.GID != 0 {
		opts = append(opts, "uid="+strconv.FormatUint(uint64(m.UID), 10), "gid="+strconv.FormatUint(uint64(m.GID), 10))
	}
	if m.Unprotected {
		opts = append(opts, "protect=off")
	}
	s := m.Host + ":" + m.Guest
	if len(opts) > 0 {
		s += ":" + strings.Join(opts, ",")
	}
	return s
}

// ParseMount reads Docker's -v notation, HOST:GUEST[:OPTIONS], OPTIONS a
// comma-separated list of ro, rw, uid=N and gid=N (the guest owner of the
// host user's files; gid defaults to uid) and protect=off (see
// Mount.Unprotected; protect=on is the default). A relative HOST is taken from
// the working directory; it must be an existing directory.
func ParseMount(s string) (Mount, error) {
	bad := func(why string) (Mount, error) {
		return Mount{}, fmt.Errorf("-v %s: %s: %w", s, why, errdefs.ErrInvalid)
	}
	parts := strings.Split(s, ":")
	var m Mount
	switch len(parts) {
	case 2:
	case 3:
		gidSet := false
		for _, o := range strings.Split(parts[2], ",") {
			k, v, isKV := strings.Cut(o, "=")
			switch {
			case o == "ro" || o == "rw":
				m.ReadOnly = o == "ro"
			case o == "protect=off" || o == "protect=on":
				m.Unprotected = o == "protect=off"
			case isKV && (k == "uid" || k == "gid"):
				n, err := strconv.ParseUint(v, 10, 32)
				if err != nil || n >= 1<<32-1 {
					return bad(k + " must be a number from 0 to 4294967294")
				}
				if k == "uid" {
					m.UID = uint32(n)
				} else {
					m.GID, gidSet = uint32(n), true
				}
			default:
				return bad("unknown option " + strconv.Quote(o) + ": want ro, rw, uid=N, gid=N or protect=off")
			}
		}
		if !gidSet {
			m.GID = m.UID
		}
	default:
		return bad("want HOST:GUEST or HOST:GUEST:ro (options: ro, uid=N, gid=N)")
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
