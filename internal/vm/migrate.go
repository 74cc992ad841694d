package vm

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"time"

	"smx/internal/errdefs"
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
	// a delay.
	if err := c.Execute(ctx, "migrate-set-parameters", map[string]any{"max-bandwidth": int64(1) << 40}, nil); err != nil {
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
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		st, err := m.Status(ctx)
		switch {
		case err != nil, st == "inmigrate":
		case st == "running":
			return nil
		case st == "paused":
			if err = m.Cont(ctx); err == nil {
				return nil
			}
		default:
			return fmt.Errorf("vm: restore: machine is %q after loading its state: %w", st, errdefs.ErrFailed)
		}
		select {
		case <-m.done:
			msg := lastLineOf(m.Stderr())
			return fmt.Errorf("vm: restore: qemu exited while loading the state (%v): %s", m.waitErr, msg)
		case <-ctx.Done():
			return fmt.Errorf("vm: restore: state not loaded (last status %q, %v): %w", st, err, ctx.Err())
		case <-tick.C:
		}
	}
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
