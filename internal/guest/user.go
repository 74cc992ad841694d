package guest

import (
	"bufio"
	"fmt"
	"os"
	"strconv"
	"strings"
)

// Identity is who a process runs as.
type Identity struct {
	UID, GID uint32
	Groups   []uint32 // supplementary groups
	Name     string   // empty when the uid has no passwd entry
	Home     string
}

type passwdEntry struct {
	name     string
	uid, gid uint32
	home     string
}

type groupEntry struct {
	name    string
	gid     uint32
	members []string
}

// LookupUser resolves a user spec as Docker does: "name", "uid",
// "name:group", "uid:gid" (groups by name or number), against the guest's
// passwd and group files. A numeric uid with no passwd entry gets gid 0 and
// home "/"; a name that is not in passwd is an error.
func LookupUser(spec, passwdPath, groupPath string) (*Identity, error) {
	userPart, groupPart, hasGroup := strings.Cut(spec, ":")
	if userPart == "" || (hasGroup && groupPart == "") {
		return nil, fmt.Errorf("guest: user %q: want name, uid, name:group or uid:gid", spec)
	}
	users, err := readPasswd(passwdPath)
	if err != nil && !os.IsNotExist(err) {
		return nil, fmt.Errorf("guest: user %q: %w", spec, err)
	}
	groups, err := readGroup(groupPath)
	if err != nil && !os.IsNotExist(err) {
		return nil, fmt.Errorf("guest: user %q: %w", spec, err)
	}

	id := &Identity{Home: "/"}
	var pw *passwdEntry
	if uid, err := strconv.ParseUint(userPart, 10, 32); err == nil {
		id.UID = uint32(uid)
		for i := range users {
			if users[i].uid == id.UID {
				pw = &users[i]
				break
			}
		}
	} else {
		for i := range users {
			if users[i].name == userPart {
				pw = &users[i]
				break
			}
		}
		if pw == nil {
			return nil, fmt.Errorf("guest: user %q: no such user in %s", userPart, passwdPath)
		}
		id.UID = pw.uid
	}
	if pw != nil {
		id.Name, id.GID, id.Home = pw.name, pw.gid, pw.home
		if id.Home == "" {
			id.Home = "/"
		}
	}

	if hasGroup {
		if gid, err := strconv.ParseUint(groupPart, 10, 32); err == nil {
			id.GID = uint32(gid)
		} else {
			found := false
			for _, g := range groups {
				if g.name == groupPart {
					id.GID, found = g.gid, true
					break
				}
			}
			if !found {
				return nil, fmt.Errorf("guest: user %q: no such group %q in %s", spec, groupPart, groupPath)
			}
		}
	}

	if id.Name != "" {
		seen := map[uint32]bool{id.GID: true}
		for _, g := range groups {
			if seen[g.gid] {
				continue
			}
			for _, m := range g.members {
				if m == id.Name {
					id.Groups = append(id.Groups, g.gid)
					seen[g.gid] = true
					break
				}
			}
		}
	}
	return id, nil
}

// homeOf returns the home directory of uid from passwd, or fallback.
func homeOf(passwdPath string, uid uint32, fallback string) (name, home string) {
	users, _ := readPasswd(passwdPath)
	for _, u := range users {
		if u.uid == uid {
			if u.home == "" {
				return u.name, fallback
			}
			return u.name, u.home
		}
	}
	return "", fallback
}

func readPasswd(path string) ([]passwdEntry, error) {
	var out []passwdEntry
	err := readColonFile(path, func(f []string) {
		if len(f) < 6 {
			return
		}
		uid, err1 := strconv.ParseUint(f[2], 10, 32)
		gid, err2 := strconv.ParseUint(f[3], 10, 32)
		if err1 != nil || err2 != nil {
			return
		}
		out = append(out, passwdEntry{name: f[0], uid: uint32(uid), gid: uint32(gid), home: f[5]})
	})
	return out, err
}

func readGroup(path string) ([]groupEntry, error) {
	var out []groupEntry
	err := readColonFile(path, func(f []string) {
		if len(f) < 3 {
			return
		}
		gid, err := strconv.ParseUint(f[2], 10, 32)
		if err != nil {
			return
		}
		g := groupEntry{name: f[0], gid: uint32(gid)}
		if len(f) > 3 && f[3] != "" {
			g.members = strings.Split(f[3], ",")
		}
		out = append(out, g)
	})
	return out, err
}

func readColonFile(path string, fn func([]string)) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 0, 4096), 1<<20)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		fn(strings.Split(line, ":"))
	}
	return sc.Err()
}
