package policy

import "strings"

// FileMount is a host folder shared into the guest, as the file gateway
// decides for it: the mount's own mode is the default for every path under
// it that no files rule names, and a read-only mount is read-only whatever
// the rules say.
type FileMount struct {
	Guest    string // absolute, clean guest path of the mount point
	ReadOnly bool
	// Unprotected (-v ...:protect=off) lifts the protection of files the
	// host runs (see protected) under this mount: for a folder no host
	// tool works in, such as the containers' root file systems in a pod's
	// share.
	Unprotected bool
	// Rule names where the mount was asked for, for the log:
	// "smx run -v /src:/work:ro" or "team.yaml:3:7 files.mounts[0]".
	Rule string
	// FoldCase says the host file system compares the names of this path
	// case-insensitively (a vfat folder, an ext4 casefold directory):
	// rules then match it whatever its case, as the host would, and the
	// stricter of the case-sensitive and the case-folded decision holds.
	FoldCase bool
}

// Under reports whether guest path p (clean, absolute) is m's mount point
// or below it.
func (m FileMount) Under(p string) bool {
	return p == m.Guest || strings.HasPrefix(p, m.Guest) && len(p) > len(m.Guest) && p[len(m.Guest)] == '/'
}

// DecideMounted decides a file request for a path under mount m. Order: a
// deny rule (or a malformed path) denies; a read-only mount refuses every
// change; the most specific allow rule decides; a path no rule names gets
// the mount's own mode.
func (p *Profile) DecideMounted(m FileMount, path, access string) Decision {
	d := p.decideMounted(m, path, access, false)
	if !d.Allow && !d.Ask || !m.FoldCase {
		return d
	}
	// The stricter holds: deny over ask over allow.
	if f := p.decideMounted(m, path, access, true); !f.Allow && (!f.Ask || !d.Ask) {
		f.Reason += " (the host compares names case-insensitively here)"
		return f
	}
	return d
}

func (p *Profile) decideMounted(m FileMount, path, access string, fold bool) Decision {
	d := p.decideFileAs(Request{Kind: KindFile, Path: path, Access: access}, !m.Unprotected, fold)
	if d.Rule != ruleDefault {
		if (d.Allow || d.Ask) && access == "rw" && m.ReadOnly {
			return deny(m.Rule, path+" is on a read-only mount")
		}
		return d
	}
	// No rule names the path: the mount decides, if the path is under it.
	clean, _ := cleanGuestPath(path)
	if !m.Under(clean) {
		return d
	}
	if access == "rw" && m.ReadOnly {
		return deny(m.Rule, clean+" is on a read-only mount")
	}
	return allow(m.Rule, access+" access to "+clean+" is the mount's own mode (no files rule names it)")
}
