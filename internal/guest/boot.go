// Package guest is smx-agent, the guest's PID 1: it brings the microVM from
// the initramfs to the image's root filesystem (mounts, kernel modules,
// switch root, hostname, loopback) and then answers the host's requests
// (exec, file copy, health, clock and entropy, power off) over the
// virtio-serial control port, speaking agentproto.
//
// Boot is a list of named Steps run in order; Main runs them and serves.
// Server and Reaper also run as an ordinary process, which is how the
// tests exercise them on the host.
package guest

import (
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"time"
)

// Boot is the state shared by the init steps.
type Boot struct {
	Log *slog.Logger
	// Level is raised to debug when the command line asks for it.
	Level *slog.LevelVar
	// Cmdline is filled in by the ReadCmdline step.
	Cmdline Cmdline

	beside sync.WaitGroup // Beside steps still running
}

// Settled waits until the steps run Beside the others have ended.
func (b *Boot) Settled() { b.beside.Wait() }

// Beside runs Step in the background, beside the steps after it and the
// control port, for a step nothing after it needs but the user's commands:
// the server makes every exec, copy and mount wait for it (Boot.Settled).
// Growing the root filesystem (about 35 ms under emulation) thus overlaps
// with the rest of the boot and the host's first round trips. Step's error
// is logged: a Beside step must be one the guest can live without.
type Beside struct{ Step Step }

func (s Beside) String() string { return s.Step.String() + " (in the background)" }

func (s Beside) Run(b *Boot) error {
	b.beside.Add(1)
	go func() {
		defer b.beside.Done()
		start := time.Now()
		if err := s.Step.Run(b); err != nil {
			b.Log.Warn("background boot step failed", "step", s.Step.String(), "err", err)
			return
		}
		b.Log.Debug("boot step done", "step", s.Step.String(), "took", time.Since(start).Round(time.Microsecond))
	}()
	return nil
}

// A Step is one stage of bringing up the guest. Run returns an error only
// when the guest cannot usefully continue; problems the guest can live with
// are logged inside the step.
type Step interface {
	fmt.Stringer
	Run(b *Boot) error
}

// Steps is the boot sequence of smx-agent as PID 1.
func Steps() []Step {
	return []Step{
		Mounts{Label: "initramfs", List: earlyMounts},
		ConsoleFDs{},
		ReadCmdline{},
		LoadModules{List: "/etc/smx/modules"},
		LoadModules{List: "/etc/smx/modules.shares", If: func(c Cmdline) bool { return c.Shares }},
		KeepModules{List: "/etc/smx/modules.shares", If: func(c Cmdline) bool { return !c.Shares }},
		SwitchRoot{Dir: "/newroot", Wait: 10 * time.Second},
		Beside{GrowRoot{}},
		Mounts{Label: "root", List: rootMounts},
		DevLinks{},
		Dir{Path: "/tmp", Mode: 0o1777},
		Beside{GitConfig{}},
		Hostname{},
		Loopback{},
		Network{},
	}
}

// Run runs steps in order and stops at the first error.
func (b *Boot) Run(steps []Step) error {
	for _, s := range steps {
		start := time.Now()
		if err := s.Run(b); err != nil {
			return fmt.Errorf("guest: boot: %s: %w", s, err)
		}
		b.Log.Debug("boot step done", "step", s.String(), "took", time.Since(start).Round(time.Microsecond))
	}
	return nil
}

// ReadCmdline reads /proc/cmdline into Boot.Cmdline.
type ReadCmdline struct{}

func (ReadCmdline) String() string { return "read kernel command line" }

func (ReadCmdline) Run(b *Boot) error {
	data, err := os.ReadFile("/proc/cmdline")
	if err != nil {
		return err
	}
	b.Cmdline = ParseCmdline(strings.TrimSpace(string(data)))
	if b.Cmdline.Debug && b.Level != nil {
		b.Level.Set(slog.LevelDebug)
	}
	b.Log.Debug("kernel command line", "cmdline", strings.TrimSpace(string(data)))
	return nil
}

// Dir makes sure a directory exists with a mode, without mounting anything
// over what the image put there.
type Dir struct {
	Path string
	Mode os.FileMode
}

func (d Dir) String() string { return fmt.Sprintf("directory %s %#o", d.Path, d.Mode) }

func (d Dir) Run(b *Boot) error {
	if err := os.MkdirAll(d.Path, 0o755); err != nil {
		b.Log.Warn("mkdir failed", "path", d.Path, "err", err)
		return nil
	}
	if err := os.Chmod(d.Path, fileMode(d.Mode)); err != nil {
		b.Log.Warn("chmod failed", "path", d.Path, "err", err)
	}
	return nil
}

// fileMode converts Unix mode bits (as written in octal) to an os.FileMode.
func fileMode(m os.FileMode) os.FileMode {
	out := m & os.ModePerm
	if m&0o1000 != 0 {
		out |= os.ModeSticky
	}
	if m&0o2000 != 0 {
		out |= os.ModeSetgid
	}
	if m&0o4000 != 0 {
		out |= os.ModeSetuid
	}
	return out
}
