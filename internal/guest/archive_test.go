package guest

import (
	"archive/tar"
	"bytes"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/yamux"

	"github.com/smx-dev/smx/internal/agentproto"
)

func copyOut(t *testing.T, sess *yamux.Session, path string) ([]byte, error) {
	t.Helper()
	st := openRequest(t, sess, agentproto.Request{Op: agentproto.OpCopyOut, Path: path})
	defer st.Close()
	var buf bytes.Buffer
	for {
		typ, p, err := agentproto.ReadFrame(st, nil)
		if err != nil {
			t.Fatal(err)
		}
		switch typ {
		case agentproto.FrameData:
			buf.Write(p)
		case agentproto.FrameEOF:
			return buf.Bytes(), nil
		case agentproto.FrameError:
			return nil, agentproto.DecodeError(p)
		default:
			t.Fatalf("unexpected frame %s", typ)
		}
	}
}

func copyIn(t *testing.T, sess *yamux.Session, dir string, archive []byte) (*agentproto.Result, error) {
	t.Helper()
	st := openRequest(t, sess, agentproto.Request{Op: agentproto.OpCopyIn, Path: dir})
	defer st.Close()
	go func() {
		_, _ = agentproto.FrameWriter{W: st, Type: agentproto.FrameData}.Write(archive)
		_ = agentproto.WriteFrame(st, agentproto.FrameEOF, nil)
	}()
	return result(t, st)
}

func TestCopyRoundTrip(t *testing.T) {
	sess := startServer(t)
	src := filepath.Join(t.TempDir(), "proj")
	mtime := time.Date(2020, 1, 2, 3, 4, 5, 0, time.UTC)
	must(t, os.MkdirAll(filepath.Join(src, "sub", "deep"), 0o755))
	writeFile(t, filepath.Join(src, "run.sh"), "#!/bin/sh\necho hi\n")
	must(t, os.Chmod(filepath.Join(src, "run.sh"), 0o755))
	writeFile(t, filepath.Join(src, "sub", "secret"), "s3cret")
	must(t, os.Chmod(filepath.Join(src, "sub", "secret"), 0o640))
	big := bytes.Repeat([]byte("0123456789abcdef"), 200000) // 3.2 MB, many frames
	must(t, os.WriteFile(filepath.Join(src, "sub", "deep", "big"), big, 0o644))
	must(t, os.Symlink("../run.sh", filepath.Join(src, "sub", "link")))
	must(t, os.Link(filepath.Join(src, "run.sh"), filepath.Join(src, "hard")))
	must(t, os.Chmod(filepath.Join(src, "sub", "deep"), 0o700))
	for _, p := range []string{"run.sh", "sub/secret", "sub/deep/big", "sub/deep", "sub", "."} {
		must(t, os.Chtimes(filepath.Join(src, p), mtime, mtime))
	}

	archive, err := copyOut(t, sess, src)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	tr := tar.NewReader(bytes.NewReader(archive))
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		names = append(names, h.Name)
	}
	if names[0] != "proj/" {
		t.Errorf("first entry %q, want proj/ (all: %v)", names[0], names)
	}

	dst := filepath.Join(t.TempDir(), "new", "place")
	// The destination directory must exist, as for docker cp.
	if _, err := copyIn(t, sess, dst, archive); err == nil || !strings.Contains(err.Error(), "no such directory "+dst+" in the sandbox") {
		t.Fatalf("copy-in to a missing directory: %v", err)
	}
	if _, err := os.Stat(filepath.Dir(dst)); !os.IsNotExist(err) {
		t.Fatalf("copy-in created the missing parent: %v", err)
	}
	must(t, os.MkdirAll(dst, 0o755))
	res, err := copyIn(t, sess, dst, archive)
	if err != nil {
		t.Fatal(err)
	}
	wantBytes := int64(len(big) + len("s3cret") + len("#!/bin/sh\necho hi\n"))
	if !res.OK || res.Bytes != wantBytes {
		t.Errorf("result = %+v, want %d bytes", res, wantBytes)
	}

	out := filepath.Join(dst, "proj")
	for p, mode := range map[string]os.FileMode{
		"run.sh": 0o755, "sub/secret": 0o640, "sub/deep": 0o700 | os.ModeDir, "sub/deep/big": 0o644,
	} {
		fi, err := os.Lstat(filepath.Join(out, p))
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode() != mode {
			t.Errorf("%s: mode %v, want %v", p, fi.Mode(), mode)
		}
		if !fi.ModTime().Equal(mtime) {
			t.Errorf("%s: mtime %v, want %v", p, fi.ModTime(), mtime)
		}
	}
	if got, _ := os.ReadFile(filepath.Join(out, "sub", "deep", "big")); !bytes.Equal(got, big) {
		t.Error("big file differs")
	}
	if l, err := os.Readlink(filepath.Join(out, "sub", "link")); err != nil || l != "../run.sh" {
		t.Errorf("symlink = %q, %v", l, err)
	}
	a, _ := os.Stat(filepath.Join(out, "run.sh"))
	b, _ := os.Stat(filepath.Join(out, "hard"))
	if !os.SameFile(a, b) {
		t.Error("hard link not kept")
	}
	if os.Geteuid() == 0 {
		st := a.Sys().(*syscall.Stat_t)
		if st.Uid != 0 || st.Gid != 0 {
			t.Errorf("owner %d:%d", st.Uid, st.Gid)
		}
	}
}

func TestCopyInOwners(t *testing.T) {
	requireRoot(t)
	sess := startServer(t)
	archive := makeTar(t, []tar.Header{
		{Name: "f", Typeflag: tar.TypeReg, Mode: 0o4755, Uid: 1234, Gid: 5678, Size: 1},
	}, "x")
	dst := t.TempDir()
	if _, err := copyIn(t, sess, dst, archive); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(filepath.Join(dst, "f"))
	if err != nil {
		t.Fatal(err)
	}
	st := fi.Sys().(*syscall.Stat_t)
	if st.Uid != 1234 || st.Gid != 5678 || fi.Mode() != 0o755|os.ModeSetuid {
		t.Errorf("owner %d:%d mode %v", st.Uid, st.Gid, fi.Mode())
	}
}

func TestCopyInRefusesEscapes(t *testing.T) {
	sess := startServer(t)
	for _, tc := range []struct {
		name    string
		entries []tar.Header
	}{
		{"dotdot", []tar.Header{{Name: "../escaped", Typeflag: tar.TypeReg, Mode: 0o644, Size: 1}}},
		{"nested dotdot", []tar.Header{{Name: "a/../../escaped", Typeflag: tar.TypeReg, Mode: 0o644, Size: 1}}},
		{"absolute", []tar.Header{{Name: "/escaped", Typeflag: tar.TypeReg, Mode: 0o644, Size: 1}}},
		{"through symlink", []tar.Header{
			{Name: "link", Typeflag: tar.TypeSymlink, Linkname: ".."},
			{Name: "link/escaped", Typeflag: tar.TypeReg, Mode: 0o644, Size: 1},
		}},
		{"through absolute symlink", []tar.Header{
			{Name: "link", Typeflag: tar.TypeSymlink, Linkname: "/tmp"},
			{Name: "link/escaped", Typeflag: tar.TypeReg, Mode: 0o644, Size: 1},
		}},
		{"hard link out", []tar.Header{{Name: "h", Typeflag: tar.TypeLink, Linkname: "../outside"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			parent := t.TempDir()
			writeFile(t, filepath.Join(parent, "outside"), "keep")
			dst := filepath.Join(parent, "dst")
			var data []string
			for _, h := range tc.entries {
				if h.Typeflag == tar.TypeReg {
					data = append(data, "x")
				}
			}
			_, err := copyIn(t, sess, dst, makeTar(t, tc.entries, data...))
			if err == nil {
				t.Fatal("copy-in succeeded")
			}
			t.Log(err)
			for _, p := range []string{filepath.Join(parent, "escaped"), "/escaped", "/tmp/escaped"} {
				if _, err := os.Lstat(p); err == nil {
					t.Errorf("%s was created", p)
				}
			}
		})
	}
}

func TestCopyInNotADirectory(t *testing.T) {
	sess := startServer(t)
	f := filepath.Join(t.TempDir(), "file")
	writeFile(t, f, "x")
	if _, err := copyIn(t, sess, f, makeTar(t, nil)); err == nil {
		t.Fatal("copy-in into a file succeeded")
	}
}

func TestCopyOutFileAndMissing(t *testing.T) {
	sess := startServer(t)
	f := filepath.Join(t.TempDir(), "one.txt")
	writeFile(t, f, "hello")
	archive, err := copyOut(t, sess, f)
	if err != nil {
		t.Fatal(err)
	}
	tr := tar.NewReader(bytes.NewReader(archive))
	h, err := tr.Next()
	if err != nil || h.Name != "one.txt" || h.Size != 5 {
		t.Fatalf("entry %+v, %v", h, err)
	}
	if _, err := tr.Next(); err != io.EOF {
		t.Errorf("more than one entry: %v", err)
	}

	_, err = copyOut(t, sess, "/no/such/path")
	if err == nil || !strings.Contains(err.Error(), "no such file") {
		t.Errorf("err = %v", err)
	}
}

func makeTar(t *testing.T, hdrs []tar.Header, data ...string) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	i := 0
	for _, h := range hdrs {
		h.ModTime = time.Unix(1e9, 0)
		if err := tw.WriteHeader(&h); err != nil {
			t.Fatal(err)
		}
		if h.Typeflag == tar.TypeReg {
			if _, err := tw.Write([]byte(data[i])); err != nil {
				t.Fatal(err)
			}
			i++
		}
	}
	must(t, tw.Close())
	return buf.Bytes()
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
