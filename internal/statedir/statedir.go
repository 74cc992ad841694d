// Package statedir locates smx's one state directory and the locks that make
// two CLIs at once safe.
//
// Layout under the root:
//
//	images/      image store (internal/image)
//	kernels/     unpacked guest kernels (internal/kernel)
//	initramfs/   built initramfs archives, by content hash
//	sandboxes/   one directory per sandbox (internal/sandbox)
//	logs/        one tamper-evident log per sandbox name (internal/audit);
//	             kept after the sandbox is removed, until `smx logs prune`
//	audit/       the log signing key (0600) and its public half
//	creds/       host-side secrets (internal/creds), never sent to a guest
//	profiles/    the user's named security profiles (NAME.yaml)
//	snapshots/   saved sandbox states (internal/snapshot)
package statedir

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"
)

// Dir is an smx state directory.
type Dir struct{ Root string }

// Default returns $SMX_HOME, else /var/lib/smx for root, else
// $XDG_STATE_HOME/smx (default ~/.local/state/smx).
func Default() (Dir, error) {
	if h := os.Getenv("SMX_HOME"); h != "" {
		abs, err := filepath.Abs(h)
		if err != nil {
			return Dir{}, fmt.Errorf("statedir: SMX_HOME: %w", err)
		}
		return Dir{Root: abs}, nil
	}
	if os.Geteuid() == 0 {
		return Dir{Root: "/var/lib/smx"}, nil
	}
	if x := os.Getenv("XDG_STATE_HOME"); x != "" {
		return Dir{Root: filepath.Join(x, "smx")}, nil
	}
	home, err := os.UserHomeDir()
	if err != nil {
		return Dir{}, fmt.Errorf("statedir: no home directory; set SMX_HOME: %w", err)
	}
	return Dir{Root: filepath.Join(home, ".local", "state", "smx")}, nil
}

func (d Dir) Images() string    { return filepath.Join(d.Root, "images") }
func (d Dir) Kernels() string   { return filepath.Join(d.Root, "kernels") }
func (d Dir) Initramfs() string { return filepath.Join(d.Root, "initramfs") }
func (d Dir) Sandboxes() string { return filepath.Join(d.Root, "sandboxes") }
func (d Dir) Logs() string      { return filepath.Join(d.Root, "logs") }
func (d Dir) Audit() string     { return filepath.Join(d.Root, "audit") }
func (d Dir) Creds() string     { return filepath.Join(d.Root, "creds") }
func (d Dir) Profiles() string  { return filepath.Join(d.Root, "profiles") }
func (d Dir) Snapshots() string { return filepath.Join(d.Root, "snapshots") }
func (d Dir) Templates() string { return filepath.Join(d.Root, "templates") }

// Ensure creates the directory tree with private permissions.
func (d Dir) Ensure() error {
	for _, p := range []string{d.Root, d.Images(), d.Kernels(), d.Initramfs(), d.Sandboxes(), d.Logs(), d.Audit(), d.Creds(), d.Profiles(), d.Snapshots()} {
		if err := os.MkdirAll(p, 0o700); err != nil {
			return fmt.Errorf("statedir: %w", err)
		}
	}
	return nil
}

// Lock is an advisory whole-file lock (flock). It is released by Unlock or
// when the process dies, which is what makes it a liveness signal too.
type Lock struct{ f *os.File }

// ErrLocked is returned by TryLock when another process holds the lock.
var ErrLocked = errors.New("locked by another process")

// LockFile blocks until it holds an exclusive lock on path.
func LockFile(path string) (*Lock, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("statedir: lock: %w", err)
	}
	for {
		err = unix.Flock(int(f.Fd()), unix.LOCK_EX)
		if err != unix.EINTR {
			break
		}
	}
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("statedir: lock %s: %w", path, err)
	}
	return &Lock{f: f}, nil
}

// TryLock takes an exclusive lock on path without waiting; ErrLocked if
// another process has it.
func TryLock(path string) (*Lock, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("statedir: lock: %w", err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		f.Close()
		if err == unix.EWOULDBLOCK {
			return nil, ErrLocked
		}
		return nil, fmt.Errorf("statedir: lock %s: %w", path, err)
	}
	return &Lock{f: f}, nil
}

// Unlock releases the lock; it is safe to call more than once.
func (l *Lock) Unlock() error {
	if l == nil || l.f == nil {
		return nil
	}
	err := l.f.Close()
	l.f = nil
	return err
}

// WriteFileAtomic writes data to path through a temporary file, fsync and
// rename, so readers see the old or the new content, never a torn one, and
// a crash after it returns cannot lose it. The temporary file's name starts
// with a dot, so directory listings that skip dot files never see it.
func WriteFileAtomic(path string, data []byte, perm os.FileMode) error {
	dir := filepath.Dir(path)
	tmp, err := os.CreateTemp(dir, "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	_, err = tmp.Write(data)
	if err == nil {
		err = tmp.Chmod(perm)
	}
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return err
	}
	SyncDir(dir)
	return nil
}

// SyncDir makes a new or renamed directory entry durable. Errors are
// ignored: some filesystems do not support fsync on directories.
func SyncDir(dir string) {
	if d, err := os.Open(dir); err == nil {
		_ = d.Sync()
		_ = d.Close()
	}
}

// Held reports whether some process holds an exclusive lock on path. It
// probes with a shared lock, so that any number of readers can probe at
// once without ever looking to each other like the lock's owner.
func Held(path string) bool {
	f, err := os.Open(path)
	if err != nil {
		return false
	}
	defer f.Close()
	return unix.Flock(int(f.Fd()), unix.LOCK_SH|unix.LOCK_NB) == unix.EWOULDBLOCK
}

// TryLockFor is TryLock retried for up to d, for owners that may briefly
// collide with a Held probe.
func TryLockFor(path string, d time.Duration) (*Lock, error) {
	deadline := time.Now().Add(d)
	for {
		l, err := TryLock(path)
		if !errors.Is(err, ErrLocked) || time.Now().After(deadline) {
			return l, err
		}
		time.Sleep(10 * time.Millisecond)
	}
}
