package guest

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"golang.org/x/sys/unix"
)

// LoadModules loads the kernel modules listed in a file, one absolute path
// per line, dependencies first (the host resolved modules.dep when it built
// the initramfs; there is no modprobe in the guest). Parameters given on
// the kernel command line as module.param=value are passed along, as
// modprobe would. A module that fails to load is logged and skipped: the
// boot may still succeed without it, and if not, the missing device says
// more than an early stop would.
type LoadModules struct {
	List string
	If   func(Cmdline) bool // nil: always
}

func (l LoadModules) String() string { return "load modules from " + l.List }

func (l LoadModules) Run(b *Boot) error {
	if l.If != nil && !l.If(b.Cmdline) {
		return nil
	}
	if !modulesSupported() {
		b.Log.Debug("kernel has no loadable modules: nothing to load", "list", l.List)
		return nil
	}
	paths, err := readModuleList(l.List)
	if errors.Is(err, os.ErrNotExist) {
		b.Log.Debug("no module list", "path", l.List)
		return nil
	}
	if err != nil {
		return err
	}
	for _, p := range paths {
		name := moduleNameFromPath(p)
		params := strings.Join(b.Cmdline.ModuleParams[name], " ")
		if err := loadModule(p, params); err != nil {
			b.Log.Error("module load failed", "module", name, "path", p, "err", err)
			continue
		}
		b.Log.Debug("module loaded", "module", name, "params", params)
	}
	return nil
}

// modulesSupported reports whether the running kernel loads modules at
// all: smx's own kernel (CONFIG_MODULES=n) has everything built in, no
// /proc/modules, and an initramfs without module lists.
func modulesSupported() bool {
	_, err := os.Stat("/proc/modules")
	return err == nil
}

func readModuleList(path string) ([]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		out = append(out, line)
	}
	return out, sc.Err()
}

// moduleNameFromPath gives the kernel's name for a module file:
// .../virtio_blk.ko → virtio_blk, crc32c-intel.ko.xz → crc32c_intel.
func moduleNameFromPath(p string) string {
	base := filepath.Base(p)
	if i := strings.Index(base, ".ko"); i > 0 {
		base = base[:i]
	}
	return moduleName(base)
}

// moduleInitCompressedFile is MODULE_INIT_COMPRESSED_FILE from
// <linux/module.h>, which x/sys/unix does not define.
const moduleInitCompressedFile = 4

func loadModule(path, params string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	flags := 0
	if !strings.HasSuffix(path, ".ko") {
		// .ko.xz / .ko.zst: let the kernel decompress (CONFIG_MODULE_DECOMPRESS).
		flags = moduleInitCompressedFile
	}
	err = unix.FinitModule(int(f.Fd()), params, flags)
	if errors.Is(err, unix.EEXIST) {
		return nil // built in, or already loaded
	}
	if err != nil {
		return fmt.Errorf("finit_module: %w", err)
	}
	return nil
}

// KeepModules reads the modules in a list into memory, to be loaded later
// with LoadKept: the initramfs is freed at the switch to the root disk, and
// a guest that did not need them at boot (a boot template, a sandbox whose
// mounts come with a later profile or a fork) may need them afterwards.
type KeepModules struct {
	List string
	If   func(Cmdline) bool // nil: always
}

func (k KeepModules) String() string { return "keep modules from " + k.List + " for later" }

func (k KeepModules) Run(b *Boot) error {
	if k.If != nil && !k.If(b.Cmdline) {
		return nil
	}
	if !modulesSupported() {
		return nil
	}
	paths, err := readModuleList(k.List)
	if err != nil {
		b.Log.Debug("no module list", "path", k.List, "err", err)
		return nil
	}
	kept.Lock()
	defer kept.Unlock()
	for _, p := range paths {
		data, err := os.ReadFile(p)
		if err != nil {
			b.Log.Warn("keep module", "path", p, "err", err)
			continue
		}
		name := moduleNameFromPath(p)
		kept.mods = append(kept.mods, keptModule{name: name, path: p, data: data,
			params: strings.Join(b.Cmdline.ModuleParams[name], " ")})
	}
	return nil
}

type keptModule struct {
	name, path, params string
	data               []byte
}

var kept struct {
	sync.Mutex
	mods []keptModule
}

// LoadKept loads the modules KeepModules kept, in order, once; later
// calls do nothing. Each goes through a memfd so finit_module can
// decompress it as it would a file.
func LoadKept() error {
	kept.Lock()
	defer kept.Unlock()
	var errs []error
	for _, m := range kept.mods {
		fd, err := unix.MemfdCreate(m.name, unix.MFD_CLOEXEC)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		f := os.NewFile(uintptr(fd), m.name)
		if _, err := f.Write(m.data); err != nil {
			f.Close()
			errs = append(errs, err)
			continue
		}
		flags := 0
		if !strings.HasSuffix(m.path, ".ko") {
			flags = moduleInitCompressedFile
		}
		err = unix.FinitModule(int(f.Fd()), m.params, flags)
		f.Close()
		if err != nil && !errors.Is(err, unix.EEXIST) {
			errs = append(errs, fmt.Errorf("module %s: finit_module: %w", m.name, err))
		}
	}
	kept.mods = nil
	return errors.Join(errs...)
}
