package policy

import (
	"strings"
	"testing"
)

// TestMountOwner: files.mounts take -v's uid/gid ownership mapping, in
// both spellings; bad ids and options are refused with file:line; the
// frozen profile a sandbox keeps carries them.
func TestMountOwner(t *testing.T) {
	src := "files:\n  mounts:\n    - /src/a:/work/a:uid=1000,gid=1001\n    - host: /src/b\n      guest: /work/b\n      uid: 1000\n      gid: 1000\n    - /src/c:/work/c\n"
	p, err := Parse("p.yaml", []byte(src), nil)
	if err != nil {
		t.Fatal(err)
	}
	want := []Mount{{Host: "/src/a", Guest: "/work/a", UID: 1000, GID: 1001}, {Host: "/src/b", Guest: "/work/b", UID: 1000, GID: 1000}, {Host: "/src/c", Guest: "/work/c"}}
	if len(p.Files.Mounts) != len(want) {
		t.Fatalf("mounts: %+v", p.Files.Mounts)
	}
	for i, m := range p.Files.Mounts {
		if m.Host != want[i].Host || m.Guest != want[i].Guest || m.UID != want[i].UID || m.GID != want[i].GID {
			t.Errorf("mount %d: %+v, want %+v", i, m, want[i])
		}
	}
	frozen, err := p.FrozenYAML()
	if err != nil {
		t.Fatal(err)
	}
	again, err := Parse("frozen.yaml", frozen, nil)
	if err != nil {
		t.Fatalf("frozen profile does not parse: %v\n%s", err, frozen)
	}
	for i, m := range again.Files.Mounts {
		if m.UID != want[i].UID || m.GID != want[i].GID {
			t.Errorf("frozen mount %d lost its owner: %+v\n%s", i, m, frozen)
		}
	}

	bad := "files:\n  mounts:\n    - /a:/work/a:uid=-1\n    - /b:/work/b:uid=1000,mode=7\n    - host: /c\n      guest: /work/c\n      uid: 4294967295\n    - host: /d\n      guest: /work/d\n      gid: [1]\n    - /e:/work/e:uid=01\n"
	_, err = Parse("p.yaml", []byte(bad), nil)
	if err == nil {
		t.Fatal("bad owners accepted")
	}
	for _, w := range []string{
		`p.yaml:3:7: files.mounts[0]: "/a:/work/a:uid=-1": unknown option "uid=-1"`,
		`p.yaml:4:7: files.mounts[1]: "/b:/work/b:uid=1000,mode=7": unknown option "mode=7"`,
		`p.yaml:7:12: files.mounts[2].uid: bad id "4294967295"`,
		`p.yaml:10:12: files.mounts[3].gid: want a single value`,
		`p.yaml:11:7: files.mounts[4]: "/e:/work/e:uid=01": unknown option "uid=01"`,
	} {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("no %q in:\n%v", w, err)
		}
	}
}
