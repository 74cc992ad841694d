package supervisor

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/smx-dev/smx/internal/agentproto"
	"github.com/smx-dev/smx/internal/errdefs"
	"github.com/smx-dev/smx/internal/image"
	"github.com/smx-dev/smx/internal/sandbox"
	"github.com/smx-dev/smx/internal/snapshot"
	"github.com/smx-dev/smx/internal/sshgw"
	"github.com/smx-dev/smx/internal/statedir"
	"github.com/smx-dev/smx/internal/tlsgw"
	"github.com/smx-dev/smx/internal/virtiofs"
	"github.com/smx-dev/smx/internal/vm"
)

// Boot templates. The first start of a sandbox boots its guest cold; once
// the agent answers, and before anything per-sandbox reaches the guest
// (clock, entropy, CA, hostname, user processes), the supervisor saves the
// guest as a template: its memory and device state and its disk overlay,
// in the template store ($SMX_HOME/templates, the snapshot store's format).
// Later first starts of any sandbox with the same inputs restore that
// template instead of booting, with the identity work a fork gets (clock,
// entropy and CRNG reseed, hostname), then attach what is per-sandbox
// (its gateways sign with the template's CAs: see adoptTemplateCAs). A
// template's name is a hash of every input the saved state depends on:
// the QEMU build, the machine's command line (the kernel's version and the
// initramfs holding smx-agent by its hash, CPUs, memory, accelerator,
// devices; paths and the hostname left out), the image digest and the
// disk size. A changed input is a different name, so a stale template is
// never loaded; it lingers until its image or kernel is removed. With no
// path of this host in it, the name is the same on every host with the
// same inputs: a template pulled from a registry (`smx template pull`)
// is found by the first starts there as if it had been saved there.

const templatePrefix = "tpl-"

// templateFormat changes when what a template holds changes meaning.
const templateFormat = "smx boot template 2"

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
	// By identity, not by where this host keeps them.
	kc.Kernel, kc.Initrd = "kernel-"+s.host.Kernel, "initramfs-"+s.host.InitramfsHash
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
	if s.vfs != nil {
		// The saved machine holds the virtio-fs device's state.
		fmt.Fprintf(h, "virtio-fs state %d\n", virtiofs.StateVersion)
	}
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
	if err := forkDisk(t.DiskPath(), tmp); err != nil {
		s.log.Warn("template: rebase disk; booting cold", "name", name, "err", err)
		return
	}
	spec := s.spec
	spec.Template = name
	if t.ImageBase != "" {
		// The disk chain now ends at the template's base: the image's own,
		// or, for a template pulled from another host, the copy of that
		// host's that came with it (the same files by digest, other
		// bytes). Snapshots of the sandbox name the base their chain
		// really ends at, and move to other hosts with it.
		spec.ImageBase = t.ImageBase
	}
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
	if slimOn() && t.HasSharedRAM() && s.vfs == nil {
		s.restore.statePath, s.restore.ramFile = t.DevicesStatePath(), t.SharedRAMPath()
	}
	s.adoptTemplateCAs(t)
}

// forkDisk makes path an empty overlay on the qcow2 image base, of base's
// size (what snapshot.ForkDisk does with qemu-img, without its process
// start on the start path).
func forkDisk(base, path string) error {
	base, err := filepath.Abs(base)
	if err != nil {
		return err
	}
	size, err := vm.QCOW2Size(base)
	if err != nil {
		return err
	}
	return vm.CreateOverlay(path, base, size)
}

// warmGuest does once, before the template is saved, what every start
// from it does first: trust the gateway's CA and SSH host CA and run a
// process. The CAs are the template's own, kept in its directory (dir,
// the build's) with their keys: a sandbox restored from the template
// adopts them (adoptTemplateCAs), so its guest already trusts its
// gateway and the two installs, 0.2 s each of freshly translated guest
// code under TCG, drop out of every start from it. The saved guest also
// has the files, directories and programs they touch in its page cache
// and already allocated on its disk; without it, each restored start read
// them through the whole disk chain under emulation (install-ca took
// 0.2 s in the guest, the first exec 0.3 s). The sandbox that saves the
// template installs its own CAs again after the save, before any user
// process runs. Then the guest settles (agentproto.OpSettle): the kernel
// work it defers from boot is done once, in the template, instead of in
// every start from it. Failures only cost the warm-up.
func (s *Supervisor) warmGuest(ctx context.Context, dir string) {
	var reqs []*agentproto.Request
	if ca, err := tlsgw.LoadOrCreate(dir, "smx boot template"); err == nil {
		reqs = append(reqs, &agentproto.Request{Op: agentproto.OpInstallCA, CACert: ca.CertPEM()})
	}
	if ca, err := sshgw.LoadOrCreateCA(filepath.Join(dir, sshgw.HostCAFile), "smx-boot-template"); err == nil {
		reqs = append(reqs, &agentproto.Request{Op: agentproto.OpInstallSSHCA, SSHKnownHosts: ca.KnownHostsLine("smx-boot-template")})
	}
	wctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	for _, req := range reqs {
		if _, err := s.call(wctx, req); err != nil {
			s.log.Info("template warm-up", "op", req.Op, "err", err)
		}
	}
	// By name, as commands mostly are: the lookup along PATH is warm too.
	if err := s.run(wctx, "sh", "-c", ":"); err != nil {
		s.log.Info("template warm-up", "op", "exec", "err", err)
	}
	// Last, so that it waits only for what the warm-up did not outlast.
	start := time.Now()
	r, err := s.call(wctx, &agentproto.Request{Op: agentproto.OpSettle, LimitMS: settleLimit.Milliseconds()})
	switch {
	case err != nil:
		s.log.Info("template warm-up", "op", agentproto.OpSettle, "err", err)
	case len(r.Pending) > 0:
		s.log.Info("template warm-up: guest not settled", "pending", r.Pending, "ms", time.Since(start).Milliseconds())
	default:
		s.log.Info("template warm-up: guest settled", "ms", time.Since(start).Milliseconds())
	}
}

// settleLimit bounds how long the first start of a machine shape waits for
// its guest's deferred boot work before the template is saved (about a
// second after boot under TCG; see agentproto.OpSettle).
const settleLimit = 3 * time.Second

// adoptTemplateCAs gives a sandbox restored from template t the CA and
// SSH host CA t's guest trusts, when the sandbox has none of its own yet
// (a first start: its gateway makes them otherwise), and notes in the
// restore plan which CAs the restored guest trusts, so that syncGuest
// installs only what differs. Sandboxes restored from one template then
// share its gateway CAs. Their keys never enter a guest (the gateways on
// the host sign with them), so a guest gains nothing from the sharing; a
// fork, a snapshot's sandbox and a --cold start still get CAs of their
// own. Templates saved before the template had CAs of its own have none
// to adopt, and their sandboxes install their own as before.
func (s *Supervisor) adoptTemplateCAs(t *snapshot.Snapshot) {
	copyPair := func(key, cert string) {
		dst := filepath.Join(s.paths.Dir, key)
		if _, err := os.Stat(dst); err == nil {
			return
		}
		if _, err := os.Stat(filepath.Join(s.paths.Dir, cert)); err == nil {
			return
		}
		// Key first, as the gateways write them: a certificate alone is
		// not loaded.
		for _, f := range []struct {
			name string
			mode os.FileMode
		}{{key, 0o600}, {cert, 0o644}} {
			src := filepath.Join(t.Dir, f.name)
			if err := adoptFile(src, filepath.Join(s.paths.Dir, f.name), f.mode); err != nil {
				if !errors.Is(err, fs.ErrNotExist) {
					s.log.Warn("template: adopt CA", "file", src, "err", err)
				}
				os.Remove(dst)
				return
			}
		}
	}
	copyPair(tlsgw.KeyFile, tlsgw.CertFile)
	copyPair(sshgw.HostCAFile, sshgw.HostCAFile+".pub")
	statedir.SyncDir(s.paths.Dir)
	if b, err := os.ReadFile(filepath.Join(t.Dir, tlsgw.CertFile)); err == nil {
		s.restore.guestCA = b
	}
	if ca, err := sshgw.LoadCA(filepath.Join(t.Dir, sshgw.HostCAFile)); err == nil {
		s.restore.guestSSHCA = ca.AuthorizedKey()
	}
}

// adoptFile puts the template's file src at dst: a hard link, as the
// template's files are durable and never written in place (the gateways
// and the template write new files and rename or link them into place),
// so one directory sync makes the adoption durable instead of two fsyncs
// per copied file on the way to QEMU's start. Across filesystems it copies.
func adoptFile(src, dst string, mode os.FileMode) error {
	err := os.Link(src, dst)
	if err == nil || errors.Is(err, fs.ErrNotExist) {
		return err
	}
	b, err := os.ReadFile(src)
	if err != nil {
		return err
	}
	return statedir.WriteFileAtomic(dst, b, mode)
}

// run runs a command in the guest as root, discarding its output, and
// waits for it to end.
func (s *Supervisor) run(ctx context.Context, args ...string) error {
	sess := s.currentSession()
	if sess == nil {
		return errdefs.ErrUnavailable
	}
	st, err := sess.OpenStream()
	if err != nil {
		return err
	}
	defer st.Close()
	stop := context.AfterFunc(ctx, func() { st.SetDeadline(time.Now()) })
	defer stop()
	if err := agentproto.WriteJSON(st, agentproto.FrameRequest, &agentproto.Request{Op: agentproto.OpExec, Exec: &agentproto.ExecRequest{Args: args}}); err != nil {
		return err
	}
	buf := make([]byte, agentproto.DataChunk+5)
	for {
		t, p, err := agentproto.ReadFrame(st, buf)
		if err != nil {
			return err
		}
		switch t {
		case agentproto.FrameExit:
			return nil
		case agentproto.FrameError:
			return agentproto.DecodeError(p)
		}
	}
}

// saveTemplate saves the freshly booted guest as template name, and
// reports whether it did. It costs this one start a pause of the guest and
// the save; a failure is logged and the sandbox runs on, as it would have
// without templates. Another sandbox saving the same template at once wins
// the race harmlessly.
func (s *Supervisor) saveTemplate(ctx context.Context, name string) bool {
	start := time.Now()
	defer s.machine.ReleaseQMP() // before this save, nothing held QMP during a first boot
	b, err := s.templates().Begin(name)
	if err != nil {
		s.log.Info("template not saved", "name", name, "err", err)
		return false
	}
	defer b.Abort()
	s.warmGuest(ctx, b.Dir)
	n, err := s.saveState(ctx, b.MemoryPath())
	if err == nil {
		err = snapshot.CopyFile(b.DiskPath(), s.paths.Disk())
	}
	if cerr := s.machine.Cont(ctx); cerr != nil && err == nil {
		err = fmt.Errorf("resume: %w", cerr)
	}
	if err != nil {
		s.log.Warn("template not saved", "name", name, "err", err)
		return false
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
		return false
	}
	s.log.Info("template saved", "name", name, "state_bytes", n, "ms", time.Since(start).Milliseconds())
	return true
}
