package vm

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/smx-dev/smx/internal/errdefs"
	"github.com/smx-dev/smx/internal/initramfs"
	"github.com/smx-dev/smx/internal/kernel"
	"github.com/smx-dev/smx/internal/testutil"
)

func TestArgs(t *testing.T) {
	files := []*os.File{os.Stdin, os.Stdin}
	cfg := Config{
		Accel:     AccelTCG,
		Kernel:    "/k/vmlinuz",
		Initrd:    "/k/initrd",
		Cmdline:   "console=ttyS0 quiet",
		QMPSocket: "/run/x/qmp.sock",
		Devices: []Device{
			Console{LogPath: "/log/con,sole.log"},
			SerialPort{Name: "smx.ctl", FD: 3},
			SerialPort{Name: "smx.9p", FD: 4},
			Disk{Path: "/img/root.qcow2", Format: "qcow2"},
			Disk{Path: "/img/base.raw", Format: "raw", ReadOnly: true},
			RNG{},
			NetDgram{FD: 4},
		},
		ExtraFiles: files,
	}
	got, err := cfg.Args()
	if err != nil {
		t.Fatal(err)
	}
	want := strings.Fields(`-M microvm -bios qboot.rom -accel tcg -cpu max,-erms,-fsrm -m 256 -smp 1
		-nodefaults -no-user-config -nographic -display none
		-sandbox on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny -no-reboot
		-kernel /k/vmlinuz -initrd /k/initrd -append CMDLINE
		-qmp unix:/run/x/qmp.sock,server=on,wait=off
		-chardev file,id=con0,path=/log/con,,sole.log -serial chardev:con0
		-device virtio-serial-device,id=vser0,max_ports=4
		-chardev socket,id=chr0,fd=3 -device virtserialport,bus=vser0.0,chardev=chr0,name=smx.ctl
		-chardev socket,id=chr1,fd=4 -device virtserialport,bus=vser0.0,chardev=chr1,name=smx.9p
		-drive file=/img/root.qcow2,format=qcow2,if=none,id=disk0,cache=writeback,discard=unmap -device virtio-blk-device,drive=disk0
		-drive file=/img/base.raw,format=raw,if=none,id=disk1,cache=writeback,discard=unmap,readonly=on -device virtio-blk-device,drive=disk1
		-object rng-random,id=rng0,filename=/dev/urandom -device virtio-rng-device,rng=rng0
		-netdev dgram,id=net0,local.type=fd,local.str=4 -device virtio-net-device,netdev=net0,mac=52:54:00:12:34:56`)
	for i, w := range want {
		if w == "CMDLINE" {
			want[i] = "console=ttyS0 quiet tsc=reliable mitigations=off tsc_early_khz=" + strconv.Itoa(hostTSCKHz())
		}
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("Args:\n got %q\nwant %q", got, want)
	}

	// A machine that loads a saved state never boots its kernel: its
	// command line goes as given, without the TSC it would wait for.
	in := cfg
	in.Incoming = "defer"
	got, err = in.Args()
	if err != nil {
		t.Fatal(err)
	}
	if s := strings.Join(got, " "); !strings.Contains(s, "-append console=ttyS0 quiet -qmp") || !strings.Contains(s, "-incoming defer") {
		t.Fatalf("incoming args: %s", s)
	}

	// A state saved with QEMU's default firmware (before smx chose qboot)
	// loads into a machine with that firmware: no -bios; another ROM is
	// named as given.
	for fw, want := range map[string]string{FirmwareSeaBIOS: "-M microvm -accel tcg", "other.rom": "-M microvm -bios other.rom -accel tcg"} {
		c := cfg
		c.Firmware = fw
		got, _ = c.Args()
		if s := strings.Join(got, " "); !strings.HasPrefix(s, want+" ") {
			t.Fatalf("firmware %s: %s", fw, s)
		}
	}

	kvm := cfg
	kvm.Accel, kvm.CPUs, kvm.MemoryMiB = AccelKVM, 2, 1024
	got, _ = kvm.Args()
	if s := strings.Join(got, " "); !strings.Contains(s, "-accel kvm -cpu host -m 1024 -smp 2") {
		t.Fatalf("kvm args: %s", s)
	}

	for name, mutate := range map[string]func(*Config){
		"no accel":    func(c *Config) { c.Accel = "" },
		"no kernel":   func(c *Config) { c.Kernel = "" },
		"cpus":        func(c *Config) { c.CPUs = -1 },
		"memory":      func(c *Config) { c.MemoryMiB = 16 },
		"fd range":    func(c *Config) { c.Devices = []Device{SerialPort{Name: "x", FD: 5}} },
		"fd stdio":    func(c *Config) { c.Devices = []Device{NetDgram{FD: 1}} },
		"port name":   func(c *Config) { c.Devices = []Device{SerialPort{Name: "a,b", FD: 3}} },
		"disk format": func(c *Config) { c.Devices = []Device{Disk{Path: "/x", Format: "vmdk"}} },
		"console":     func(c *Config) { c.Devices = []Device{Console{}} },
	} {
		c := cfg
		mutate(&c)
		if _, err := c.Args(); !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("%s: err = %v, want ErrInvalid", name, err)
		}
	}
}

func TestDetectAccel(t *testing.T) {
	dir := t.TempDir()
	kvm := filepath.Join(dir, "kvm")
	os.WriteFile(kvm, nil, 0o600)
	cpuinfo := filepath.Join(dir, "cpuinfo")
	write := func(flags string) {
		os.WriteFile(cpuinfo, []byte("processor\t: 0\nflags\t\t: fpu "+flags+" sse\n\nprocessor\t: 1\n"), 0o644)
	}
	write("vmx")
	if a, why := detectAccel(kvm, cpuinfo); a != AccelKVM {
		t.Errorf("vmx: %s (%s)", a, why)
	}
	write("svm")
	if a, why := detectAccel(kvm, cpuinfo); a != AccelKVM {
		t.Errorf("svm: %s (%s)", a, why)
	}
	write("hypervisor")
	if a, why := detectAccel(kvm, cpuinfo); a != AccelTCG || !strings.Contains(why, "vmx/svm") {
		t.Errorf("no flag: %s (%s)", a, why)
	}
	write("vmx")
	if a, why := detectAccel(filepath.Join(dir, "nokvm"), cpuinfo); a != AccelTCG || !strings.Contains(why, "does not exist") {
		t.Errorf("no /dev/kvm: %s (%s)", a, why)
	}
	osrel := filepath.Join(dir, "osrelease")
	os.WriteFile(osrel, []byte("5.15.153.1-microsoft-standard-WSL2\n"), 0o644)
	if !isWSL(osrel) {
		t.Error("WSL2 kernel release not recognised")
	}
	os.WriteFile(osrel, []byte("6.1.0-48-amd64\n"), 0o644)
	if isWSL(osrel) {
		t.Error("a Debian kernel taken for WSL2")
	}
	t.Logf("host TSC: %d kHz", hostTSCKHz())
	a, why := DetectAccel()
	t.Logf("this host: %s: %s", a, why)
}

// requireKernel returns the kernel cached in SMX_TEST_KERNEL_CACHE.
func requireKernel(t testing.TB) (*kernel.Kernel, string) {
	t.Helper()
	testutil.RequireQEMU(t)
	cache := os.Getenv("SMX_TEST_KERNEL_CACHE")
	if cache == "" {
		t.Skip("set SMX_TEST_KERNEL_CACHE to a kernel cache (see internal/kernel TestEnsure) to boot guests")
	}
	k, err := kernel.Find(cache)
	if err != nil {
		t.Fatal(err)
	}
	return k, cache
}

// buildInit compiles testdata/initprog as a static binary.
func buildInit(t testing.TB) string {
	t.Helper()
	out := filepath.Join(t.TempDir(), "init")
	cmd := exec.Command("go", "build", "-o", out, "./testdata/initprog")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build init: %v\n%s", err, b)
	}
	return out
}

// bareInitramfs writes a newc archive holding only /init.
func bareInitramfs(t testing.TB, initPath string) string {
	t.Helper()
	data, err := os.ReadFile(initPath)
	if err != nil {
		t.Fatal(err)
	}
	var b []byte
	add := func(name string, mode uint32, body []byte) {
		b = fmt.Appendf(b, "070701%08x%08x%08x%08x%08x%08x%08x%08x%08x%08x%08x%08x%08x%s\x00",
			1, mode, 0, 0, 1, 0, len(body), 0, 0, 0, 0, len(name)+1, 0, name)
		for len(b)%4 != 0 {
			b = append(b, 0)
		}
		b = append(b, body...)
		for len(b)%4 != 0 {
			b = append(b, 0)
		}
	}
	add("init", 0o100755, data)
	add("TRAILER!!!", 0, nil)
	p := filepath.Join(t.TempDir(), "bare.cpio")
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func testLogger(t testing.TB) *slog.Logger {
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

func socketpair(t testing.TB, typ int) (host, guest *os.File) {
	t.Helper()
	fds, err := syscall.Socketpair(syscall.AF_UNIX, typ|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	host, guest = os.NewFile(uintptr(fds[0]), "host"), os.NewFile(uintptr(fds[1]), "guest")
	t.Cleanup(func() { host.Close(); guest.Close() })
	return host, guest
}

// TestBoot boots the cached kernels (smx's own when built, and the newest
// distribution kernel) with the initramfs smx builds and every device
// kind, and checks from inside the guest that modules load (the stock
// kernel) and the devices appear.
func TestBoot(t *testing.T) {
	k, cache := requireKernel(t)
	t.Run(kernelKind(k), func(t *testing.T) { testBoot(t, k) })
	if k.Own {
		stock, err := kernel.FindStock(cache)
		if err != nil {
			t.Fatal(err)
		}
		t.Run(kernelKind(stock), func(t *testing.T) { testBoot(t, stock) })
	}
}

func kernelKind(k *kernel.Kernel) string {
	if k.Own {
		return "own"
	}
	return "stock"
}

func testBoot(t *testing.T, k *kernel.Kernel) {
	dir := t.TempDir()
	initrd, err := initramfs.Build(context.Background(), k, buildInit(t), dir)
	if err != nil {
		t.Fatal(err)
	}
	disk := filepath.Join(dir, "disk.raw")
	if err := os.WriteFile(disk, make([]byte, 1<<20), 0o644); err != nil {
		t.Fatal(err)
	}
	_, ctlGuest := socketpair(t, syscall.SOCK_STREAM)
	_, netGuest := socketpair(t, syscall.SOCK_DGRAM)
	conLog := filepath.Join(dir, "console.log")
	cfg := Config{
		Accel:     AccelTCG,
		Kernel:    k.BootImage(),
		Initrd:    initrd,
		Cmdline:   "console=ttyS0 quiet panic=-1",
		QMPSocket: filepath.Join(dir, "qmp.sock"),
		Devices: []Device{
			Console{LogPath: conLog},
			SerialPort{Name: "smx.ctl", FD: 3},
			Disk{Path: disk, Format: "raw"},
			RNG{},
			NetDgram{FD: 4},
		},
		ExtraFiles: []*os.File{ctlGuest, netGuest},
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	start := time.Now()
	m, err := Start(ctx, cfg, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	c, err := m.QMP(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var st struct{ Status string }
	if err := c.Execute(ctx, "query-status", nil, &st); err != nil {
		t.Fatal(err)
	}
	if err := m.Wait(); err != nil {
		t.Fatalf("wait: %v\nstderr: %s", err, m.Stderr())
	}
	t.Logf("boot to poweroff: %v (status was %s)", time.Since(start), st.Status)
	log, _ := os.ReadFile(conLog)
	s := string(log)
	for _, want := range []string{"reboot: Power down", "SMX-INIT-OK", "SMX-DISK vda", "SMX-PORT smx.ctl"} {
		if !strings.Contains(s, want) {
			t.Errorf("console lacks %q:\n%s", want, s)
		}
	}
	if strings.Contains(s, "SMX-MODULE-FAIL") || strings.Contains(s, "SMX-MOUNT-FAIL") {
		t.Errorf("failures in console:\n%s", s)
	}
	// virtio device ids: 1 net, 2 block, 3 console, 4 rng.
	for _, id := range []string{"0x0001", "0x0002", "0x0003", "0x0004"} {
		if !strings.Contains(s, id) {
			t.Errorf("virtio device %s missing:\n%s", id, s)
		}
	}
	if err := m.Wait(); err != nil {
		t.Fatalf("second Wait = %v", err)
	}
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(cfg.QMPSocket); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("QMP socket left behind: %v", err)
	}
}

// TestStartFails checks that QEMU's own complaint reaches the caller.
func TestStartFails(t *testing.T) {
	testutil.RequireQEMU(t)
	dir := t.TempDir()
	kern := filepath.Join(dir, "vmlinuz")
	os.WriteFile(kern, []byte("not a kernel"), 0o644)
	cfg := Config{
		Accel:     AccelTCG,
		Kernel:    kern,
		QMPSocket: filepath.Join(dir, "qmp.sock"),
		Devices:   []Device{Disk{Path: filepath.Join(dir, "missing.qcow2"), Format: "qcow2"}},
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	m, err := Start(ctx, cfg, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	_, qerr := m.QMP(ctx)
	err = m.Wait()
	if err == nil || !strings.Contains(err.Error(), "missing.qcow2") {
		t.Fatalf("Wait = %v; stderr %q", err, m.Stderr())
	}
	if qerr == nil || !errors.Is(qerr, errdefs.ErrUnavailable) {
		t.Fatalf("QMP = %v", qerr)
	}
	t.Logf("error: %v", err)

	cfg.QEMU = "/nonexistent/qemu"
	if _, err := Start(ctx, cfg, nil); !errors.Is(err, errdefs.ErrUnavailable) {
		t.Fatalf("missing qemu: %v", err)
	}
}

// TestQuitAndCancel stops guests that would run for ever: by Quit, and by
// cancelling the context given to Start.
func TestQuitAndCancel(t *testing.T) {
	k, _ := requireKernel(t)
	dir := t.TempDir()
	// No initrd: the kernel panics looking for a root disk and, without
	// panic=, waits for ever.
	base := Config{Accel: AccelTCG, Kernel: k.BootImage(), Cmdline: "console=ttyS0"}

	t.Run("Quit", func(t *testing.T) {
		cfg := base
		cfg.QMPSocket = filepath.Join(dir, "quit.sock")
		m, err := Start(context.Background(), cfg, testLogger(t))
		if err != nil {
			t.Fatal(err)
		}
		defer m.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if _, err := m.QMP(ctx); err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		if err := m.Quit(ctx); err != nil {
			t.Fatal(err)
		}
		if err := m.Wait(); err != nil {
			t.Fatalf("Wait after Quit = %v", err)
		}
		t.Logf("quit took %v", time.Since(start))
	})
	t.Run("Cancel", func(t *testing.T) {
		cfg := base
		cfg.QMPSocket = filepath.Join(dir, "cancel.sock")
		ctx, cancel := context.WithCancel(context.Background())
		m, err := Start(ctx, cfg, testLogger(t))
		if err != nil {
			t.Fatal(err)
		}
		defer m.Close()
		qctx, qcancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer qcancel()
		if _, err := m.QMP(qctx); err != nil {
			t.Fatal(err)
		}
		cancel()
		select {
		case <-m.Done():
		case <-time.After(20 * time.Second):
			t.Fatal("QEMU still running after cancel")
		}
		// QEMU quit cleanly; Wait reports why it was stopped.
		if err := m.Wait(); !errors.Is(err, context.Canceled) {
			t.Fatalf("Wait = %v", err)
		}
	})
	t.Run("Kill", func(t *testing.T) {
		cfg := base
		cfg.QMPSocket = filepath.Join(dir, "kill.sock")
		m, err := Start(context.Background(), cfg, testLogger(t))
		if err != nil {
			t.Fatal(err)
		}
		m.Kill()
		if err := m.Wait(); err == nil || !strings.Contains(err.Error(), "killed") {
			t.Fatalf("Wait after Kill = %v", err)
		}
		m.Close()
		m.Close()
	})
}

// BenchmarkBareBoot measures QEMU start to exit for the cached kernel and an
// initramfs whose /init powers off at once: the floor under smx's own boot.
func BenchmarkBareBoot(b *testing.B) {
	k, _ := requireKernel(b)
	initrd := bareInitramfs(b, buildInit(b))
	accel, _ := DetectAccel()
	dir := b.TempDir()
	for b.Loop() {
		cfg := Config{
			Accel:     accel,
			Kernel:    k.BootImage(),
			Initrd:    initrd,
			Cmdline:   "console=ttyS0 quiet panic=-1",
			QMPSocket: filepath.Join(dir, "qmp.sock"),
			Devices:   []Device{Console{LogPath: filepath.Join(dir, "console.log")}},
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		m, err := Start(ctx, cfg, nil)
		if err != nil {
			b.Fatal(err)
		}
		if err := m.Wait(); err != nil {
			b.Fatalf("%v\n%s", err, m.Stderr())
		}
		m.Close()
		cancel()
	}
	log, _ := os.ReadFile(filepath.Join(dir, "console.log"))
	if !strings.Contains(string(log), "SMX-INIT-OK") {
		b.Fatalf("init did not run:\n%s", log)
	}
}
