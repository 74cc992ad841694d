package virtiofs

import (
	"bytes"
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/hugelgupf/p9/p9"
	"golang.org/x/sys/unix"

	"github.com/smx-dev/smx/internal/fsgw"
	"github.com/smx-dev/smx/internal/policy"
)

// wideProfile lets the guest read and write everything, .env included.
const wideProfile = `files:
  rules:
    - path: /work/**
      access: rw
`

// gatewayRoot opens a real file gateway on dir under profile and returns
// its root.
func gatewayRoot(t *testing.T, e *env, dir, profile string) p9.File {
	t.Helper()
	prof, err := policy.Parse("test.yaml", []byte(profile), nil)
	if err != nil {
		t.Fatal(err)
	}
	gw, err := fsgw.New(fsgw.Config{
		Host:    dir,
		Mount:   policy.FileMount{Guest: "/work", Rule: "-v " + dir + ":/work"},
		Profile: func() *policy.Profile { return prof },
		Refused: func(f map[string]any) { e.mu.Lock(); e.refused = append(e.refused, f); e.mu.Unlock() },
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { gw.Close() })
	root, err := gw.Attach()
	if err != nil {
		t.Fatal(err)
	}
	return root
}

// mountsEnv is a device with one mount, tag m0 at /work, on dir.
func mountsEnv(t *testing.T, dir, profile, guest string) *env {
	t.Helper()
	e := &env{t: t, dir: dir}
	e.s = NewMounts(nil, nil)
	e.s.AddMountAt("m0", guest, gatewayRoot(t, e, dir, profile))
	t.Cleanup(e.s.Close)
	return e
}

func (e *env) read(node, fh uint64) (string, int32) {
	out, errno := e.call(opRead, node, append(le64(fh, 0), le32(4096, 0, 0, 0, 0, 0)...), nil, 4096)
	return string(out), errno
}

func (e *env) write(node, fh, off uint64, data string) int32 {
	_, errno := e.call(opWrite, node, append(le64(fh, off), le32(uint32(len(data)), 0, 0, 0, 0, 0)...), []byte(data), 64)
	return errno
}

func saveState(t *testing.T, s *Server) []byte {
	t.Helper()
	var b bytes.Buffer
	if err := s.SaveState(&b); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

// The guest's nodes and open handles survive a save and a load into a new
// server (a restore, a fork): the same node IDs and file handles keep
// reading and writing the same host files.
func TestStateCarriesOpenFiles(t *testing.T) {
	dir := newEnv(t).dir
	src := mountsEnv(t, dir, testProfile, "/work")
	a := src.path("m0/src/a.go")
	rfh, errno := src.open(a, unix.O_RDWR)
	if errno != 0 {
		t.Fatalf("open: %d", errno)
	}
	srcDir := src.path("m0/src")
	dfh, errno := src.call(opOpendir, srcDir, le32(0, 0), nil, 64)
	if errno != 0 {
		t.Fatal(errno)
	}
	// A file renamed while open is found under its new name.
	if _, errno := src.call(opRename, srcDir, append(le64(srcDir), cstr("a.go", "b.go")...), nil, 64); errno != 0 {
		t.Fatalf("rename: %d", errno)
	}
	if saved := saveState(t, src.s); true {
		// Before the guest bound the mount, a restored guest must bind it.
		dst := mountsEnv(t, dir, testProfile, "/work")
		if err := dst.s.LoadState(bytes.NewReader(saved)); err != nil {
			t.Fatal(err)
		}
		if m := dst.s.LoadedMounts(); len(m) != 0 {
			t.Fatalf("loaded mounts %v before the guest bound any", m)
		}
	}
	src.s.MountedInGuest("m0")
	saved := saveState(t, src.s)

	dst := mountsEnv(t, dir, testProfile, "/work")
	if err := dst.s.LoadState(bytes.NewReader(saved)); err != nil {
		t.Fatal(err)
	}
	if m := dst.s.LoadedMounts(); m["m0"] != "/work" || len(m) != 1 {
		t.Fatalf("loaded mounts %v, want m0 at /work", m)
	}
	if got, errno := dst.read(a, rfh); errno != 0 || got != "package a\n" {
		t.Fatalf("read after load: %q, errno %d", got, errno)
	}
	if errno := dst.write(a, rfh, 0, "PACKAGE"); errno != 0 {
		t.Fatalf("write after load: %d", errno)
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "src/b.go")); string(b) != "PACKAGE a\n" {
		t.Fatalf("host file after the write: %q", b)
	}
	out, errno := dst.call(opReaddir, srcDir, append(le64(binary.LittleEndian.Uint64(dfh), 0), le32(4096, 0, 0, 0, 0, 0)...), nil, 4096)
	if errno != 0 || !strings.Contains(string(out), "b.go") {
		t.Fatalf("readdir after load: %q, %d", out, errno)
	}
	// New IDs do not collide with the loaded ones.
	n, errno := dst.lookup(rootID, "m0")
	if errno != 0 {
		t.Fatal(errno)
	}
	if _, errno := dst.lookup(n, ".github"); errno != 0 {
		t.Fatal(errno)
	}
	st, _ := DecodeState(bytes.NewReader(saved))
	for _, sn := range st.Nodes {
		if sn.ID >= dst.s.next-1 {
			t.Fatalf("node %d of the state is not below the next ID %d", sn.ID, dst.s.next)
		}
	}
	// Saving the loaded server gives the same state.
	if again := saveState(t, dst.s); len(again) < len(saved) {
		t.Fatalf("state after load: %d bytes, before %d", len(again), len(saved))
	}
}

// A fork restored under a narrower profile loses what its profile denies:
// the handle the parent had open on .env answers EACCES or ESTALE, never
// the file's bytes, and the refusal is recorded; what it may see works.
func TestStateNarrowerProfileLosesAccess(t *testing.T) {
	dir := newEnv(t).dir
	parent := mountsEnv(t, dir, wideProfile, "/work")
	env := parent.path("m0/.env")
	efh, errno := parent.open(env, unix.O_RDWR)
	if errno != 0 {
		t.Fatalf("parent opens .env: %d", errno)
	}
	if got, errno := parent.read(env, efh); errno != 0 || got != "SECRET\n" {
		t.Fatalf("parent reads .env: %q %d", got, errno)
	}
	a := parent.path("m0/src/a.go")
	afh, _ := parent.open(a, unix.O_RDONLY)
	ci := parent.path("m0/.github/ci.yml")
	cfh, errno := parent.open(ci, unix.O_WRONLY)
	if errno != 0 {
		t.Fatalf("parent opens ci.yml for writing: %d", errno)
	}
	saved := saveState(t, parent.s)

	fork := mountsEnv(t, dir, testProfile, "/work")
	if err := fork.s.LoadState(bytes.NewReader(saved)); err != nil {
		t.Fatal(err)
	}
	got, errno := fork.read(env, efh)
	if errno != -int32(unix.EACCES) && errno != -int32(unix.ESTALE) {
		t.Fatalf("fork reads the parent's .env handle: %q, errno %d", got, -errno)
	}
	if errno := fork.write(env, efh, 0, "LEAK"); errno == 0 {
		t.Fatal("fork wrote through the parent's .env handle")
	}
	if _, errno := fork.call(opGetattr, env, le64(0, 0), nil, 256); errno == 0 {
		t.Fatal("getattr on the parent's .env node succeeded")
	}
	if _, errno := fork.lookup(env, "x"); errno == 0 {
		t.Fatal("lookup under a stale node succeeded")
	}
	// A read-only path the parent had open for writing stays closed to writes.
	if errno := fork.write(ci, cfh, 0, "evil"); errno == 0 {
		t.Fatal("fork wrote to a read-only path through the parent's handle")
	}
	if got, errno := fork.read(a, afh); errno != 0 || got != "package a\n" {
		t.Fatalf("fork reads src/a.go: %q %d", got, errno)
	}
	if b, _ := os.ReadFile(filepath.Join(dir, ".env")); string(b) != "SECRET\n" {
		t.Fatalf(".env on the host: %q", b)
	}
	if b, _ := os.ReadFile(filepath.Join(dir, ".github/ci.yml")); string(b) != "on: push\n" {
		t.Fatalf("ci.yml on the host: %q", b)
	}
	if got := fork.refusedPaths(); !strings.Contains(got, "/work/.env") {
		t.Errorf("no refusal recorded for .env: %q", got)
	}
	// Releasing the stale handle works (the guest closes its file).
	if _, errno := fork.call(opRelease, env, le64(efh, 0, 0), nil, 64); errno != 0 {
		t.Errorf("release of a stale handle: %d", errno)
	}
}

// A mount tag that is another mount point in the restoring sandbox does
// not carry the guest's open files into that other folder.
func TestStateOtherMountIsStale(t *testing.T) {
	dir := newEnv(t).dir
	src := mountsEnv(t, dir, testProfile, "/work")
	a := src.path("m0/src/a.go")
	fh, _ := src.open(a, unix.O_RDONLY)
	saved := saveState(t, src.s)
	dst := mountsEnv(t, dir, testProfile, "/elsewhere")
	if err := dst.s.LoadState(bytes.NewReader(saved)); err != nil {
		t.Fatal(err)
	}
	if _, errno := dst.read(a, fh); errno != -int32(unix.ESTALE) {
		t.Fatalf("read through a moved mount: errno %d, want ESTALE", -errno)
	}
}

// A state loads only into a server that has served nothing.
func TestStateLoadsOnlyFresh(t *testing.T) {
	dir := newEnv(t).dir
	src := mountsEnv(t, dir, testProfile, "/work")
	src.path("m0/src")
	saved := saveState(t, src.s)
	if err := src.s.LoadState(bytes.NewReader(saved)); err == nil {
		t.Fatal("a state loaded over live tables")
	}
}

func validState() *State {
	return &State{
		Next:   20,
		Mounts: []StateMount{{"m0", "/work", true}, {"m1", "/data", false}},
		Nodes: []StateNode{
			{ID: 2, Parent: rootID, Lookups: 1, Name: "m0"},
			{ID: 3, Parent: 2, Lookups: 2, Name: "src"},
			{ID: 4, Parent: 3, Lookups: 1, Name: "a.go"},
			{ID: 5, Lookups: 1},
		},
		Handles: []StateHandle{{FH: 6, Node: 4, Flags: unix.O_RDWR}, {FH: 7, Node: rootID, Kind: handleRoot}, {FH: 8, Node: 3, Kind: handleDir}},
	}
}

func encode(t testing.TB, st *State) []byte {
	var b bytes.Buffer
	if err := st.Encode(&b); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

func TestDecodeStateRoundTrip(t *testing.T) {
	st := validState()
	got, err := DecodeState(bytes.NewReader(encode(t, st)))
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, st) {
		t.Fatalf("decoded %+v, want %+v", got, st)
	}
}

// Every field is checked: each broken state is refused with errState.
func TestDecodeStateRejects(t *testing.T) {
	cases := map[string]func(*State){
		"next too small":         func(s *State) { s.Next = 1 },
		"node ID at next":        func(s *State) { s.Nodes[3].ID = 20 },
		"node ID is the root":    func(s *State) { s.Nodes[0].ID = rootID },
		"duplicate node":         func(s *State) { s.Nodes[2].ID = 3 },
		"parent after child":     func(s *State) { s.Nodes[1].Parent = 4 },
		"unknown parent":         func(s *State) { s.Nodes[2].Parent = 9 },
		"name with a slash":      func(s *State) { s.Nodes[2].Name = "../etc" },
		"name dot-dot":           func(s *State) { s.Nodes[2].Name = ".." },
		"empty name":             func(s *State) { s.Nodes[2].Name = "" },
		"orphan with a name":     func(s *State) { s.Nodes[3].Name = "x" },
		"name twice":             func(s *State) { s.Nodes[2].Parent, s.Nodes[2].Name = 2, "src" },
		"lookups huge":           func(s *State) { s.Nodes[1].Lookups = 1 << 50 },
		"handle of no node":      func(s *State) { s.Handles[0].Node = 11 },
		"handle flags":           func(s *State) { s.Handles[0].Flags = unix.O_RDWR | unix.O_TRUNC },
		"handle accmode 3":       func(s *State) { s.Handles[0].Flags = unix.O_ACCMODE },
		"root handle on a file":  func(s *State) { s.Handles[1].Node = 4 },
		"file handle on root":    func(s *State) { s.Handles[0].Node = rootID },
		"duplicate handle":       func(s *State) { s.Handles[1].FH = 6 },
		"handle kind":            func(s *State) { s.Handles[2].Kind = 9 },
		"mount tag with a slash": func(s *State) { s.Mounts[0].Tag = "a/b" },
		"mount twice":            func(s *State) { s.Mounts = append(s.Mounts, s.Mounts[0]) },
		"empty mount tag":        func(s *State) { s.Mounts[1].Tag = "" },
	}
	for name, breakIt := range cases {
		st := validState()
		breakIt(st)
		if _, err := DecodeState(bytes.NewReader(encode(t, st))); !errors.Is(err, errState) {
			t.Errorf("%s: %v, want errState", name, err)
		}
	}
	good := encode(t, validState())
	for name, b := range map[string][]byte{
		"empty":          nil,
		"bad magic":      append([]byte("smx-vfz\x00"), good[8:]...),
		"version 2":      append(append([]byte(stateMagic), 2, 0, 0, 0), good[12:]...),
		"truncated":      good[:len(good)-3],
		"trailing byte":  append(append([]byte(nil), good...), 0),
		"huge node list": append(append([]byte(stateMagic), le32(1)...), append(le64(20), append(le32(0), le32(1<<30)...)...)...),
		"in-guest flag 2": func() []byte {
			b := append([]byte(nil), good...)
			const at = 8 + 4 + 8 + 4 + (2 + 2) + (2 + 5) // the first mount's flag
			if b[at] != 1 {
				t.Fatalf("byte %d is %d, not the first mount's flag", at, b[at])
			}
			b[at] = 2
			return b
		}(),
	} {
		if _, err := DecodeState(bytes.NewReader(b)); !errors.Is(err, errState) {
			t.Errorf("%s: %v, want errState", name, err)
		}
	}
}

// FuzzDecodeState feeds hostile device states to the decoder and loads
// what it accepts into a server on a real gateway: no panic, what decodes
// encodes back to the same bytes, and nothing outside the folder is read.
func FuzzDecodeState(f *testing.F) {
	f.Add(encode(f, validState()))
	f.Add(encode(f, &State{Next: 2}))
	st := validState()
	st.Nodes[2].Name = ".env"
	f.Add(encode(f, st))
	dir := f.TempDir()
	os.MkdirAll(filepath.Join(dir, "src"), 0o755)
	os.WriteFile(filepath.Join(dir, "src/a.go"), []byte("package a\n"), 0o644)
	os.WriteFile(filepath.Join(dir, ".env"), []byte("SECRET\n"), 0o644)
	prof, err := policy.Parse("test.yaml", []byte(testProfile), nil)
	if err != nil {
		f.Fatal(err)
	}
	gw, err := fsgw.New(fsgw.Config{Host: dir, Mount: policy.FileMount{Guest: "/work", Rule: "-v"}, Profile: func() *policy.Profile { return prof }})
	if err != nil {
		f.Fatal(err)
	}
	defer gw.Close()
	f.Fuzz(func(t *testing.T, data []byte) {
		st, err := DecodeState(bytes.NewReader(data))
		if err != nil {
			if !errors.Is(err, errState) {
				t.Fatalf("error not errState: %v", err)
			}
			return
		}
		if again := encode(t, st); !bytes.Equal(again, data) {
			t.Fatalf("re-encoded state differs")
		}
		root, err := gw.Attach()
		if err != nil {
			t.Fatal(err)
		}
		s := NewMounts(nil, nil)
		s.AddMountAt("m0", "/work", root)
		defer s.Close()
		if err := s.LoadState(bytes.NewReader(data)); err != nil {
			t.Fatalf("load of a decoded state: %v", err)
		}
		// Every handle reads only what the profile allows.
		for _, h := range st.Handles {
			hd, e := s.fileHandle(h.FH)
			if e != 0 || hd.dir {
				continue
			}
			buf := make([]byte, 64)
			n, _ := hd.file.ReadAt(buf, 0)
			if bytes.Contains(buf[:n], []byte("SECRET")) {
				t.Fatalf("handle %d reads the hidden .env", h.FH)
			}
		}
	})
}
