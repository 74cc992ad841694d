package hosttool

import (
	"os"
	"path/filepath"
	"testing"
)

func TestLookOutsidePATH(t *testing.T) {
	d := t.TempDir()
	prog := filepath.Join(d, "smx-test-tool")
	if err := os.WriteFile(prog, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	old := sbinDirs
	sbinDirs = []string{filepath.Join(d, "missing"), d}
	defer func() { sbinDirs = old }()
	t.Setenv("PATH", "/nonexistent")

	if p, err := Look("smx-test-tool"); err != nil || p != prog {
		t.Fatalf("Look = %q, %v; want %q", p, err, prog)
	}
	if _, err := Look("smx-no-such-tool"); err == nil {
		t.Fatal("found a program that does not exist")
	}
	// A non-executable file is not a program.
	os.Chmod(prog, 0o644)
	if p, err := Look("smx-test-tool"); err == nil {
		t.Fatalf("non-executable found: %s", p)
	}
}

func TestLookPrefersPATH(t *testing.T) {
	a, b := t.TempDir(), t.TempDir()
	for _, d := range []string{a, b} {
		os.WriteFile(filepath.Join(d, "smx-test-tool"), []byte("#!/bin/sh\n"), 0o755)
	}
	old := sbinDirs
	sbinDirs = []string{b}
	defer func() { sbinDirs = old }()
	t.Setenv("PATH", a)
	if p, _ := Look("smx-test-tool"); p != filepath.Join(a, "smx-test-tool") {
		t.Fatalf("Look = %q, want the one on PATH", p)
	}
}
