package guest

import (
	"debug/elf"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"runtime"
	"testing"
)

func TestParseCmdline(t *testing.T) {
	c := ParseCmdline(`console=ttyS0 panic=-1 smx.root=/dev/vda smx.hostname=box smx.debug=1 ` +
		`virtio-blk.queue_depth=64 virtio_blk.foo virtio_mmio.device="a b" quiet ext4.x=1 smx.other=2`)
	if c.Root != "/dev/vda" || c.Hostname != "box" || !c.Debug {
		t.Errorf("parsed %+v", c)
	}
	want := map[string][]string{
		"virtio_blk":  {"queue_depth=64", "foo"},
		"virtio_mmio": {`device="a b"`},
		"ext4":        {"x=1"},
	}
	if !reflect.DeepEqual(c.ModuleParams, want) {
		t.Errorf("module params = %q, want %q", c.ModuleParams, want)
	}

	d := ParseCmdline("console=ttyS0")
	if d.Root != "" || d.Hostname != "smx" || d.Debug {
		t.Errorf("defaults = %+v", d)
	}
}

func TestModuleNameFromPath(t *testing.T) {
	for in, want := range map[string]string{
		"/lib/modules/6.1.0-57-amd64/kernel/drivers/block/virtio_blk.ko": "virtio_blk",
		"/lib/modules/x/kernel/arch/x86/crypto/crc32c-intel.ko":          "crc32c_intel",
		"/lib/modules/x/kernel/fs/ext4/ext4.ko.xz":                       "ext4",
	} {
		if got := moduleNameFromPath(in); got != want {
			t.Errorf("%s → %s, want %s", in, got, want)
		}
	}
}

func TestReadModuleList(t *testing.T) {
	p := filepath.Join(t.TempDir(), "modules")
	writeFile(t, p, "# deps first\n/lib/modules/v/a.ko\n\n  /lib/modules/v/b.ko  \n")
	got, err := readModuleList(p)
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"/lib/modules/v/a.ko", "/lib/modules/v/b.ko"}; !reflect.DeepEqual(got, want) {
		t.Errorf("got %q", got)
	}
}

func TestLookupUser(t *testing.T) {
	dir := t.TempDir()
	pw, gr := filepath.Join(dir, "passwd"), filepath.Join(dir, "group")
	writeFile(t, pw, "root:x:0:0:root:/root:/bin/sh\n# comment\nbob:x:1000:1000::/home/bob:/bin/sh\nnohome:x:1001:1001:::/bin/sh\n")
	writeFile(t, gr, "root:x:0:\nbob:x:1000:\nwheel:x:10:bob,alice\nstaff:x:50:bob\n")
	for _, tc := range []struct {
		spec string
		want Identity
	}{
		{"bob", Identity{UID: 1000, GID: 1000, Groups: []uint32{10, 50}, Name: "bob", Home: "/home/bob"}},
		{"1000", Identity{UID: 1000, GID: 1000, Groups: []uint32{10, 50}, Name: "bob", Home: "/home/bob"}},
		{"bob:wheel", Identity{UID: 1000, GID: 10, Groups: []uint32{50}, Name: "bob", Home: "/home/bob"}},
		{"bob:77", Identity{UID: 1000, GID: 77, Groups: []uint32{10, 50}, Name: "bob", Home: "/home/bob"}},
		{"4242", Identity{UID: 4242, GID: 0, Home: "/"}},
		{"4242:4243", Identity{UID: 4242, GID: 4243, Home: "/"}},
		{"nohome", Identity{UID: 1001, GID: 1001, Name: "nohome", Home: "/"}},
		{"root", Identity{UID: 0, GID: 0, Name: "root", Home: "/root"}},
	} {
		got, err := LookupUser(tc.spec, pw, gr)
		if err != nil {
			t.Errorf("%s: %v", tc.spec, err)
			continue
		}
		if !reflect.DeepEqual(*got, tc.want) {
			t.Errorf("%s: got %+v, want %+v", tc.spec, *got, tc.want)
		}
	}
	for _, bad := range []string{"alice", "bob:nogroup", ":", "bob:", ""} {
		if _, err := LookupUser(bad, pw, gr); err == nil {
			t.Errorf("%q: no error", bad)
		}
	}
}

func TestUnescapeMountPath(t *testing.T) {
	if got := unescapeMountPath(`/mnt/a\040b`); got != "/mnt/a b" {
		t.Errorf("got %q", got)
	}
}

// smx-agent runs from an initramfs without a libc or dynamic loader.
func TestAgentBinaryIsStatic(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a binary")
	}
	gobin := filepath.Join(runtime.GOROOT(), "bin", "go")
	out := filepath.Join(t.TempDir(), "smx-agent")
	cmd := exec.Command(gobin, "build", "-o", out, "github.com/smx-dev/smx/cmd/smx-agent")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, b)
	}
	f, err := elf.Open(out)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP || p.Type == elf.PT_DYNAMIC {
			t.Errorf("binary has a %v program header; it must be static", p.Type)
		}
	}
	if libs, _ := f.ImportedLibraries(); len(libs) > 0 {
		t.Errorf("binary needs %v", libs)
	}
}
