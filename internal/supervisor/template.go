package supervisor

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"smx/internal/errdefs"
	"smx/internal/image"
	"smx/internal/sandbox"
	"smx/internal/snapshot"
	"smx/internal/vm"
)

// Boot templates. The first start of a sandbox boots its guest cold; once
// the agent answers, and before anything per-sandbox reaches the guest
// (clock, entropy, CA, hostname, user processes), the supervisor saves the
// guest as a template: its memory and device state and its disk overlay,
// in the template store ($SMX_HOME/templates, the snapshot store's format).
// Later first starts of any sandbox with the same inputs restore that
// template instead of booting, with the identity work a fork gets (clock,
// entropy and CRNG reseed, hostname, its own CA), then attach what is
// per-sandbox. A template's name is a hash of every input the saved state
// depends on: the QEMU build, the machine's command line (kernel, its
// version and the initramfs holding smx-agent, CPUs, memory, accelerator,
// devices; paths and the hostname left out), the image digest and the disk
// size. A changed input is a different name, so a stale template is never
// loaded; it lingers until its image or kernel is removed.

const templatePrefix = "tpl-"

// templateFormat changes when what a template holds changes meaning.
const templateFormat = "smx boot template 1"

func (s *Supervisor) templates() *snapshot.Store {
	return &snapshot.Store{Dir: s.opts.State.Templates()}
}

// templateName is the name of the template for a machine configured as
// cfg, or "" when the sandbox cannot use one.
func (s *Supervisor) templateName(cfg vm.Config) string {
	img, err := (&image.Store{Dir: s.opts.State.Images()}).Get(s.spec.Image)
	if err != nil || img.Digest == "" {
		s.log.Info("no template: image has no digest", "image", s.spec.Image, "err", err)
		return ""
	}
	kc := cfg
	kc.Incoming = ""
	kc.Cmdline = strings.Replace(cfg.Cmdline, "smx.hostname="+s.spec.Name, "smx.hostname=", 1) + " tsc_early_khz=0"
	kc.Devices = make([]vm.Device, len(cfg.Devices))
	for i, d := range cfg.Devices {
		switch d := d.(type) {
		case vm.Console:
			d.LogPath = "console.log"
			kc.Devices[i] = d
		case vm.Disk:
			d.Path = "disk.qcow2"
			kc.Devices[i] = d
		default:
			kc.Devices[i] = d
		}
	}
	args, err := kc.Args()
	if err != nil {
		s.log.Warn("template: machine arguments", "err", err)
		return ""
	}
	h := sha256.New()
	fmt.Fprintf(h, "%s\nqemu %s\nimage %s\ndisk %d\n%s\n", templateFormat, s.host.QEMUVersion, img.Digest,
		s.spec.DiskBytes, strings.Join(args, "\x00"))
	return templatePrefix + hex.EncodeToString(h.Sum(nil))[:20]
}

// planTemplate decides, for a sandbox's first plain start, between
// restoring an existing template (the sandbox's still-empty disk is
// rebased onto the template's disk layer) and booting cold, then saving one
// (s.saveTemplateAs).
func (s *Supervisor) planTemplate(ctx context.Context, cfg vm.Config) {
	if s.restore != nil || !s.firstStart || s.spec.Snapshot != "" || s.opts.Cold {
		return
	}
	// Only an untouched disk is replaced: a missing or damaged one must
	// fail the start as it would without templates.
	if _, err := os.Stat(s.paths.Disk()); err != nil {
		return
	}
	name := s.templateName(cfg)
	if name == "" {
		return
	}
	t, err := s.templates().Get(name)
	if err != nil {
		if !errors.Is(err, errdefs.ErrNotFound) {
			s.log.Warn("template", "name", name, "err", err)
		}
		s.saveTemplateAs = name
		return
	}
	tmp := s.paths.Disk() + ".tmp"
	os.Remove(tmp)
	if err := snapshot.ForkDisk(ctx, t.DiskPath(), tmp); err != nil {
		s.log.Warn("template: rebase disk; booting cold", "name", name, "err", err)
		return
	}
	spec := s.spec
	spec.Template = name
	if err := sandbox.WriteSpec(s.paths, spec); err != nil {
		os.Remove(tmp)
		s.log.Warn("template: booting cold", "name", name, "err", err)
		return
	}
	if err := os.Rename(tmp, s.paths.Disk()); err != nil {
		sandbox.WriteSpec(s.paths, s.spec)
		os.Remove(tmp)
		s.log.Warn("template: booting cold", "name", name, "err", err)
		return
	}
	s.spec = spec
	s.restore = &restorePlan{label: "template " + name, template: name, statePath: t.MemoryPath(), hostPath: t.MetaPath()}
}

// saveTemplate saves the freshly booted guest as template name. It costs
// this one start a pause of the guest and the save; a failure is logged
// and the sandbox runs on, as it would have without templates. Another
// sandbox saving the same template at once wins the race harmlessly.
func (s *Supervisor) saveTemplate(ctx context.Context, name string) {
	start := time.Now()
	defer s.machine.ReleaseQMP() // before this save, nothing held QMP during a first boot
	b, err := s.templates().Begin(name)
	if err != nil {
		s.log.Info("template not saved", "name", name, "err", err)
		return
	}
	defer b.Abort()
	n, err := s.saveState(ctx, b.MemoryPath())
	if err == nil {
		err = snapshot.CopyFile(b.DiskPath(), s.paths.Disk())
	}
	if cerr := s.machine.Cont(ctx); cerr != nil && err == nil {
		err = fmt.Errorf("resume: %w", cerr)
	}
	if err != nil {
		s.log.Warn("template not saved", "name", name, "err", err)
		return
	}
	meta := snapshot.Snapshot{
		Source: s.spec.Name, Created: time.Now().UTC(),
		Image: s.spec.Image, ImageBase: s.spec.ImageBase, Host: s.host,
		CPUs: s.spec.CPUs, MemoryMiB: s.spec.MemoryMiB, DiskBytes: s.spec.DiskBytes,
		SaveMS: time.Since(start).Milliseconds(),
	}
	if img, err := (&image.Store{Dir: s.opts.State.Images()}).Get(s.spec.Image); err == nil {
		meta.ImageDigest = img.Digest
	}
	if _, err := b.Commit(meta); err != nil {
		s.log.Warn("template not saved", "name", name, "err", err)
		return
	}
	s.log.Info("template saved", "name", name, "state_bytes", n, "ms", time.Since(start).Milliseconds())
}
