package vm

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/smx-dev/smx/internal/errdefs"
)

// Status is QEMU's run state as query-status reports it: "running",
// "paused", "postmigrate", "inmigrate", ...
func (m *Machine) Status(ctx context.Context) (string, error) {
	c, err := m.QMP(ctx)
	if err != nil {
		return "", err
	}
	var st struct {
		Status string `json:"status"`
	}
	if err := c.Execute(ctx, "query-status", nil, &st); err != nil {
		return "", err
	}
	return st.Status, nil
}

// Pause stops the vCPUs; guest RAM and devices stay as they are. QEMU
// flushes the disks as part of stopping.
func (m *Machine) Pause(ctx context.Context) error {
	c, err := m.QMP(ctx)
	if err != nil {
		return err
	}
	return c.Execute(ctx, "stop", nil, nil)
}

// Cont resumes the vCPUs, also after a completed save (postmigrate).
func (m *Machine) Cont(ctx context.Context) error {
	c, err := m.QMP(ctx)
	if err != nil {
		return err
	}
	return c.Execute(ctx, "cont", nil, nil)
}

// SaveProgress reports a save in flight: bytes written so far.
type SaveProgress func(written int64)

// SaveState writes the machine's state (RAM and devices) to f by QEMU
// migration to a passed fd, and returns once it is complete. The machine
// should be paused first, so that the state and the disks match; it is
// left in "postmigrate" (Cont resumes it). Migration to a file cannot use
// "exec:" because QEMU runs with spawn=deny; QEMU 7.2 has no "file:" URI.
func (m *Machine) SaveState(ctx context.Context, f *os.File, progress SaveProgress) error {
	c, err := m.QMP(ctx)
	if err != nil {
		return err
	}
	// The default bandwidth cap (128 MiB/s) is meant for live migration
	// over a network; for a paused guest going to a local file it is only
	// a delay. SaveBandwidth, when set, caps it on purpose.
	bw := int64(1) << 40
	if m.SaveBandwidth > 0 {
		bw = m.SaveBandwidth
	}
	if err := c.Execute(ctx, "migrate-set-parameters", map[string]any{"max-bandwidth": bw}, nil); err != nil {
		return fmt.Errorf("vm: save: %w", err)
	}
	const fdName = "smx-state"
	if err := c.ExecuteFD(ctx, "getfd", map[string]string{"fdname": fdName}, f, nil); err != nil {
		return fmt.Errorf("vm: save: %w", err)
	}
	if err := c.Execute(ctx, "migrate", map[string]string{"uri": "fd:" + fdName}, nil); err != nil {
		c.Execute(ctx, "closefd", map[string]string{"fdname": fdName}, nil)
		return fmt.Errorf("vm: save: %w", err)
	}
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		var mi struct {
			Status string `json:"status"`
			Error  string `json:"error-desc"`
			RAM    struct {
				Transferred int64 `json:"transferred"`
			} `json:"ram"`
		}
		if err := c.Execute(ctx, "query-migrate", nil, &mi); err != nil {
			if ctx.Err() != nil {
				c.Execute(context.Background(), "migrate_cancel", nil, nil)
			}
			return fmt.Errorf("vm: save: %w", err)
		}
		switch mi.Status {
		case "completed":
			return nil
		case "failed", "cancelled":
			msg := mi.Error
			if msg == "" {
				msg = mi.Status
			}
			return fmt.Errorf("vm: save: migration %s: %w", msg, errdefs.ErrFailed)
		}
		if progress != nil {
			progress(mi.RAM.Transferred)
		}
		select {
		case <-tick.C:
		case <-m.done:
			return fmt.Errorf("vm: save: qemu exited: %w: %v", errdefs.ErrUnavailable, m.waitErr)
		case <-ctx.Done():
			c.Execute(context.Background(), "migrate_cancel", nil, nil)
			return fmt.Errorf("vm: save: %w", ctx.Err())
		}
	}
}

// WaitLoaded waits until an incoming machine has loaded its state, and
// starts its vCPUs. A state saved from a paused machine (as SaveState
// expects) loads as paused, whatever -S says, hence the cont. It fails
// when the load fails (QEMU then exits) or ctx is done.
func (m *Machine) WaitLoaded(ctx context.Context) error {
	st, err := m.waitIncoming(ctx)
	if err == nil && st == "paused" {
		err = m.Cont(ctx)
	}
	return err
}

// WaitPaused waits until an incoming machine has loaded a state saved
// from a paused machine, and leaves its vCPUs stopped.
func (m *Machine) WaitPaused(ctx context.Context) error {
	st, err := m.waitIncoming(ctx)
	if err == nil && st != "paused" {
		err = fmt.Errorf("vm: restore: machine is %q after loading, want paused: %w", st, errdefs.ErrFailed)
	}
	return err
}

// waitIncoming waits for the end of an incoming migration and returns
// the machine's status then: "running" or "paused".
func (m *Machine) waitIncoming(ctx context.Context) (string, error) {
	// A template's devices load in milliseconds: a coarser poll would be
	// most of the wait.
	tick := time.NewTicker(2 * time.Millisecond)
	defer tick.Stop()
	for {
		st, err := m.Status(ctx)
		switch {
		case err != nil, st == "inmigrate":
		case st == "running", st == "paused":
			return st, nil
		default:
			return "", fmt.Errorf("vm: restore: machine is %q after loading its state: %w", st, errdefs.ErrFailed)
		}
		select {
		case <-m.done:
			msg := lastLineOf(m.Stderr())
			return "", fmt.Errorf("vm: restore: qemu exited while loading the state (%v): %s", m.waitErr, msg)
		case <-ctx.Done():
			return "", fmt.Errorf("vm: restore: state not loaded (last status %q, %v): %w", st, err, ctx.Err())
		case <-tick.C:
		}
	}
}

// SetIgnoreShared turns QEMU's x-ignore-shared migration capability on or
// off. With it on, a save leaves out RAM that is mapped shared from a file
// (Config.RAMShared), so the state holds the devices alone and the file
// holds the RAM; a load expects such a state and leaves RAM as it is
// mapped. It changes the stream's format, so a machine restored with it
// on turns it off before any other save.
func (m *Machine) SetIgnoreShared(ctx context.Context, on bool) error {
	c, err := m.QMP(ctx)
	if err != nil {
		return err
	}
	caps := []map[string]any{{"capability": "x-ignore-shared", "state": on}}
	if err := c.Execute(ctx, "migrate-set-capabilities", map[string]any{"capabilities": caps}, nil); err != nil {
		return fmt.Errorf("vm: x-ignore-shared: %w", err)
	}
	return nil
}

// LoadIgnoreShared starts loading, into a machine started with Incoming
// "defer", a state saved with x-ignore-shared on: the state at uri
// ("fd:N", N as in Config.Incoming) holds the devices, RAMFile the RAM.
// WaitLoaded or WaitPaused then waits for it.
func (m *Machine) LoadIgnoreShared(ctx context.Context, uri string) error {
	if err := m.SetIgnoreShared(ctx, true); err != nil {
		return err
	}
	c, err := m.QMP(ctx)
	if err != nil {
		return err
	}
	if err := c.Execute(ctx, "migrate-incoming", map[string]string{"uri": uri}, nil); err != nil {
		return fmt.Errorf("vm: restore: %w", err)
	}
	return nil
}

func lastLineOf(s string) string {
	t := &tailBuffer{max: len(s) + 1}
	t.Write([]byte(s))
	return t.lastLine()
}

// QEMUVersion returns the first line of `qemu-system-x86_64 --version`
// for the QEMU a Config would run. A saved state is only loaded by the
// QEMU build that wrote it.
func QEMUVersion(ctx context.Context, qemu string) (string, error) {
	p, err := Config{QEMU: qemu}.qemuPath()
	if err != nil {
		return "", err
	}
	out, err := execOutput(ctx, p, "--version")
	if err != nil {
		return "", fmt.Errorf("vm: %s --version: %w", p, err)
	}
	return lastLineOf(firstLine(out)), nil
}

// QEMUVersionCached is QEMUVersion remembered in cacheFile under the QEMU
// binary's identity (device, inode, size, modification and change times),
// so that an upgraded QEMU is asked again. Asking costs the start of a large
// dynamically linked program (tens of milliseconds, far more on a busy
// host) on every sandbox start otherwise. A cache that cannot be read or
// written only costs the asking.
func QEMUVersionCached(ctx context.Context, qemu, cacheFile string) (string, error) {
	p, err := Config{QEMU: qemu}.qemuPath()
	if err != nil {
		return "", err
	}
	var st unix.Stat_t
	if err := unix.Stat(p, &st); err != nil {
		return QEMUVersion(ctx, qemu)
	}
	key := fmt.Sprintf("%s %d %d %d %d.%d %d.%d", p, st.Dev, st.Ino, st.Size,
		st.Mtim.Sec, st.Mtim.Nsec, st.Ctim.Sec, st.Ctim.Nsec)
	if b, err := os.ReadFile(cacheFile); err == nil {
		if k, v, ok := strings.Cut(string(b), "\n"); ok && k == key && v != "" {
			return strings.TrimSpace(v), nil
		}
	}
	v, err := QEMUVersion(ctx, qemu)
	if err != nil {
		return "", err
	}
	if err := os.MkdirAll(filepath.Dir(cacheFile), 0o755); err == nil {
		// Written whole and renamed: a reader sees an entry or none.
		tmp := fmt.Sprintf("%s.tmp-%d", cacheFile, os.Getpid())
		if os.WriteFile(tmp, []byte(key+"\n"+v+"\n"), 0o644) == nil {
			if os.Rename(tmp, cacheFile) != nil {
				os.Remove(tmp)
			}
		}
	}
	return v, nil
}

func firstLine(s string) string {
	for i, c := range s {
		if c == '\n' {
			return s[:i]
		}
	}
	return s
}

func execOutput(ctx context.Context, name string, args ...string) (string, error) {
	out, err := exec.CommandContext(ctx, name, args...).Output()
	return string(out), err
}
