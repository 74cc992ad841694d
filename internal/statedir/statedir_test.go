package statedir

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"
)

// TestHeldProbesDoNotLookLikeOwners: many readers probing at once must
// never see each other as the owner, or `ls` would report a crashed
// sandbox as running.
func TestHeldProbesDoNotLookLikeOwners(t *testing.T) {
	p := filepath.Join(t.TempDir(), "lock")
	os.WriteFile(p, nil, 0o600)
	f, _ := os.Open(p)
	defer f.Close()
	// Hold a shared probe open, as a concurrent reader would.
	if err := flockShared(f); err != nil {
		t.Fatal(err)
	}
	if Held(p) {
		t.Fatal("a reader's probe was taken for an owner")
	}
}

func TestHeldSeesOwnerInAnotherProcess(t *testing.T) {
	p := filepath.Join(t.TempDir(), "lock")
	// flock(1) from util-linux holds the lock in a separate process.
	if _, err := exec.LookPath("flock"); err != nil {
		t.Skip("flock(1) not installed")
	}
	cmd := exec.Command("flock", "-x", "-o", p, "sleep", "30")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	deadline := time.Now().Add(5 * time.Second)
	for !Held(p) {
		if time.Now().After(deadline) {
			t.Fatal("lock held by another process not seen")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if _, err := TryLock(p); !errors.Is(err, ErrLocked) {
		t.Fatalf("TryLock = %v, want ErrLocked", err)
	}
	cmd.Process.Kill()
	cmd.Wait()
	// flock's child may still be closing its inherited copy for a moment.
	deadline = time.Now().Add(5 * time.Second)
	for Held(p) {
		if time.Now().After(deadline) {
			t.Fatal("lock still seen after its owner died")
		}
		time.Sleep(10 * time.Millisecond)
	}
	l, err := TryLockFor(p, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	l.Unlock()
	l.Unlock() // idempotent
}

func TestWriteFileAtomic(t *testing.T) {
	p := filepath.Join(t.TempDir(), "f.json")
	if err := WriteFileAtomic(p, []byte("one"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := WriteFileAtomic(p, []byte("two"), 0o600); err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(p)
	fi, _ := os.Stat(p)
	if string(b) != "two" || fi.Mode().Perm() != 0o600 {
		t.Fatalf("content %q mode %v", b, fi.Mode())
	}
	ents, _ := os.ReadDir(filepath.Dir(p))
	if len(ents) != 1 {
		t.Fatalf("temp files left behind: %v", ents)
	}
}
