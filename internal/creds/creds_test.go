package creds

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/smx-dev/smx/internal/errdefs"
)

func TestRoundTripAndPermissions(t *testing.T) {
	s := Store{Dir: filepath.Join(t.TempDir(), "creds")}
	value := []byte("ghp_s3cr3t-token-value\n")
	if err := s.Set("github.token", value); err != nil {
		t.Fatal(err)
	}
	got, err := s.Get("github.token")
	if err != nil || !bytes.Equal(got, value) {
		t.Fatalf("Get = %q, %v", got, err)
	}
	for path, want := range map[string]os.FileMode{s.Dir: 0o700, filepath.Join(s.Dir, "github.token"): 0o600} {
		st, err := os.Stat(path)
		if err != nil {
			t.Fatal(err)
		}
		if st.Mode().Perm() != want {
			t.Errorf("%s: mode %#o, want %#o", path, st.Mode().Perm(), want)
		}
	}
	// Replace: new value, no temp files left.
	if err := s.Set("github.token", []byte("v2")); err != nil {
		t.Fatal(err)
	}
	if got, _ := s.Get("github.token"); string(got) != "v2" {
		t.Errorf("after replace: %q", got)
	}
	ents, _ := os.ReadDir(s.Dir)
	if len(ents) != 1 {
		t.Errorf("store holds %d files, want 1", len(ents))
	}
}

func TestListNeverShowsValues(t *testing.T) {
	s := Store{Dir: t.TempDir()}
	vals := map[string]string{"b_key": "sk-ant-verysecret", "a-ssh.key": "-----BEGIN OPENSSH PRIVATE KEY-----\nabc\n"}
	for n, v := range vals {
		if err := s.Set(n, []byte(v)); err != nil {
			t.Fatal(err)
		}
	}
	infos, err := s.List()
	if err != nil || len(infos) != 2 || infos[0].Name != "a-ssh.key" || infos[1].Name != "b_key" {
		t.Fatalf("List = %+v, %v", infos, err)
	}
	for _, in := range infos {
		v := vals[in.Name]
		sum := sha256.Sum256([]byte(v))
		if in.Bytes != len(v) || in.SHA256Prefix != hex.EncodeToString(sum[:4]) || in.Updated.IsZero() {
			t.Errorf("%+v", in)
		}
		if dump := fmt.Sprintf("%+v %#v", in, in); strings.Contains(dump, v) || strings.Contains(dump, v[:6]) {
			t.Errorf("List leaks the value of %s: %s", in.Name, dump)
		}
	}
}

func TestBadInput(t *testing.T) {
	s := Store{Dir: t.TempDir()}
	for _, name := range []string{"", ".", "..", ".hidden", "a/b", "../x", "a b", "é", strings.Repeat("a", 65), "x\n"} {
		if err := s.Set(name, []byte("v")); !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("Set(%q): %v", name, err)
		}
		if _, err := s.Get(name); !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("Get(%q): %v", name, err)
		}
	}
	if err := s.Set(strings.Repeat("a", 64), []byte("v")); err != nil {
		t.Errorf("64-char name: %v", err)
	}
	if err := s.Set("empty", nil); !errors.Is(err, errdefs.ErrInvalid) {
		t.Errorf("empty value: %v", err)
	}
	if err := s.Set("huge", make([]byte, MaxValue+1)); !errors.Is(err, errdefs.ErrInvalid) {
		t.Errorf("huge value: %v", err)
	}
	if _, err := s.Get("missing"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("Get missing: %v", err)
	}
	if err := s.Remove("missing"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("Remove missing: %v", err)
	}
}

func TestRemoveAndLooseFiles(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "creds")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	s := Store{Dir: dir}
	if err := s.Set("tok", []byte("v")); err != nil {
		t.Fatal(err)
	}
	if st, _ := os.Stat(dir); st.Mode().Perm() != 0o700 {
		t.Errorf("an open store directory was not tightened: %#o", st.Mode().Perm())
	}
	// A value made readable by others behind smx's back is refused.
	os.Chmod(filepath.Join(dir, "tok"), 0o644)
	if _, err := s.Get("tok"); !errors.Is(err, errdefs.ErrDenied) {
		t.Errorf("Get of a 0644 file: %v", err)
	}
	if err := s.Remove("tok"); err != nil {
		t.Fatal(err)
	}
	if infos, _ := s.List(); len(infos) != 0 {
		t.Errorf("after Remove: %+v", infos)
	}
	if infos, err := (Store{Dir: filepath.Join(dir, "none")}).List(); err != nil || len(infos) != 0 {
		t.Errorf("missing store: %v %v", infos, err)
	}
}
