package fsgw

import (
	"strconv"
	"sync"
	"time"

	"github.com/hugelgupf/p9/linux"
	"golang.org/x/sys/unix"
)

// Hard links the host already has. A regular file with more than one link
// is one content under several names, and the profile may hide or freeze
// one of them (`.env` linked as `src/config`): whichever name the guest
// opens, it reads and writes that content. So an open (and every read,
// write, truncate, chmod or xattr change) of such a file is decided on
// each of its names inside the mount, and the strictest decides: a name
// the profile hides makes the file unreadable (EACCES), a read-only one
// unwritable (EROFS). The guest itself cannot make such links (Link
// decides both ends); names outside the mount (a pnpm store, a local git
// clone's objects) are not guest paths and do not count.
//
// Linux cannot list the names of an inode, so they are found by walking
// the mount, once, and kept per inode for regular files with several
// links. A file with one link (nearly all) costs nothing. The walk is done
// again when what it found no longer holds: the inode was not seen, its
// link count changed, or a name found no longer leads to it. When some of
// its links lie outside the mount, the names found are trusted for
// linkRecheck only (a directory moved into the mount from outside brings
// names without changing the inode). A walk stops at linkWalkLimit
// entries, and misses what is below a directory it cannot read; a
// multi-linked file whose names it could not all find is then refused,
// since its other names are unknown.
const (
	linkRecheck   = 5 * time.Second
	linkWalkLimit = 200000
)

type linkIndex struct {
	mu       sync.Mutex
	byIno    map[uint64]*linkNames
	walkedAt time.Time
	complete bool // the last walk saw the whole mount
}

type linkNames struct {
	nlink uint64
	dev   uint64
	rels  []string // paths relative to the mount root
}

// names returns the names inside the mount of the regular file st (found
// as rel). ok is false when they cannot be known.
func (g *Gateway) linkNames(rel string, st *unix.Stat_t) (rels []string, ok bool) {
	ix := &g.links
	ix.mu.Lock()
	defer ix.mu.Unlock()
	if e := ix.byIno[st.Ino]; e != nil && g.linksHold(e, st) {
		return e.rels, ix.complete || uint64(len(e.rels)) == st.Nlink
	}
	g.walkLinks()
	e := ix.byIno[st.Ino]
	if e == nil || e.dev != st.Dev {
		// Not reached by a truncated walk, or a race with the host.
		return nil, false
	}
	// After a truncated walk, names not found may be in the part not seen.
	return e.rels, ix.complete || uint64(len(e.rels)) == st.Nlink
}

// linksHold reports whether e, from the last walk, still describes st.
func (g *Gateway) linksHold(e *linkNames, st *unix.Stat_t) bool {
	if e.dev != st.Dev || e.nlink != st.Nlink {
		return false
	}
	if uint64(len(e.rels)) < st.Nlink && time.Since(g.links.walkedAt) > linkRecheck {
		return false
	}
	for _, r := range e.rels {
		if s, err := g.lstat(r); err != nil || s.Ino != st.Ino || s.Dev != st.Dev {
			return false
		}
	}
	return true
}

// walkLinks indexes every regular file with several links in the mount.
// Called with g.links.mu held.
func (g *Gateway) walkLinks() {
	ix := &g.links
	ix.byIno = map[uint64]*linkNames{}
	ix.walkedAt = time.Now()
	ix.complete = true
	n := 0
	var walk func(rel string)
	walk = func(rel string) {
		fd, err := g.openat(rel, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW, 0)
		if err != nil {
			ix.complete = false // names below may be missed
			return
		}
		defer unix.Close(fd)
		ents, err := g.readDir(fd)
		if err != nil {
			ix.complete = false
			return
		}
		for _, e := range ents {
			if e.name == "." || e.name == ".." {
				continue
			}
			if n++; n > linkWalkLimit {
				ix.complete = false
				return
			}
			child := join(rel, e.name)
			if e.typ != unix.DT_DIR && e.typ != unix.DT_REG && e.typ != unix.DT_UNKNOWN {
				continue
			}
			var st unix.Stat_t
			if e.typ == unix.DT_DIR {
				walk(child)
				continue
			}
			if unix.Fstatat(fd, e.name, &st, unix.AT_SYMLINK_NOFOLLOW) != nil {
				continue
			}
			switch st.Mode & unix.S_IFMT {
			case unix.S_IFDIR: // a file system that does not fill d_type
				walk(child)
			case unix.S_IFREG:
				if st.Nlink < 2 {
					continue
				}
				l := ix.byIno[st.Ino]
				if l == nil || l.dev != st.Dev {
					l = &linkNames{nlink: st.Nlink, dev: st.Dev}
					ix.byIno[st.Ino] = l
				}
				l.rels = append(l.rels, child)
			}
		}
	}
	walk(".")
}

// checkLinks decides access to the content of regular file st, reached as
// rel, on every other name it has inside the mount. nil when allowed;
// otherwise the refusal is logged against the guest path the guest used.
func (g *Gateway) checkLinks(op, rel string, st *unix.Stat_t, access string) error {
	if st.Mode&unix.S_IFMT != unix.S_IFREG || st.Nlink < 2 {
		return nil
	}
	p := g.guestPath(rel)
	rels, ok := g.linkNames(rel, st)
	if !ok {
		return g.refuse(op, p, "the file has "+strconv.FormatUint(st.Nlink, 10)+" hard links and the gateway could not look through the whole mount for their names (more than "+strconv.Itoa(linkWalkLimit)+" entries, or a directory it cannot read)", linux.EACCES)
	}
	prof := g.cfg.Profile()
	for _, r := range rels {
		if r == rel {
			continue
		}
		other := g.guestPath(r)
		if d := g.decision(prof, other, "ro"); !d.Allow {
			g.limit.refuse(op, p, d.Rule, "hard link: the same file as "+other+", which the profile hides")
			return linux.EACCES
		}
		if access != "rw" {
			continue
		}
		if d := g.decision(prof, other, "rw"); !d.Allow {
			g.limit.refuse(op, p, d.Rule, "hard link: the same file as "+other+", which is read-only")
			return linux.EROFS
		}
	}
	return nil
}

// checkLinksFD is checkLinks on an open descriptor.
func (g *Gateway) checkLinksFD(op, rel string, fd int, access string) error {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return err
	}
	return g.checkLinks(op, rel, &st, access)
}
