package bench

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/smx-dev/smx/internal/vm"
)

// BenchmarkFilesVirtioFS compares a host folder served by the supervisor
// as the vhost-user-fs backend (every FUSE operation decided by the
// profile, "virtiofs") with the same sandbox's 9P gateway over TCP ("tcp")
// and QEMU's own virtio-9p (`-fsdev local`, no policy), all on one QEMU
// (8.2 or newer: set SMX_QEMU), kernel, image and guest size. Each
// workload runs b.N times per peer (-benchtime=Nx) and the ratios of the
// medians are logged (run with -v):
//
//   - write: dd 128 MiB with fsync;
//   - read: dd it back, guest page cache dropped first;
//   - meta: create, stat (ls -l) and unlink 1000 small files.
func BenchmarkFilesVirtioFS(b *testing.B) {
	line, err := vm.QEMUVersion(context.Background(), "")
	if err != nil || !vm.VirtioFSCapable(line) {
		b.Skipf("virtio-fs needs QEMU >= 8.2 (have %q): set SMX_QEMU", line)
	}
	setup(b)
	shareVFS, shareTCP, share9p := b.TempDir(), b.TempDir(), b.TempDir()
	vfsG := startSMXFiles(b, "bench-vfs", shareVFS, "virtiofs")
	defer vfsG.Close()
	tcpG := startSMXFiles(b, "bench-vfs-tcp", shareTCP, "tcp")
	defer tcpG.Close()
	qemuG := start9pVM(b, share9p, "busybox")
	defer qemuG.Close()
	if out, err := qemuG.Exec(nil, "sh", "-c", "mkdir -p /work && mount -t 9p -o trans=virtio,version=9p2000.L,msize=512000,cache=mmap,access=client peer /work"); err != nil {
		b.Fatalf("mount virtio-9p: %v\n%s", err, out)
	}
	if out, err := vfsG.Exec(nil, "sh", "-c", "grep -q ' /work virtiofs ' /proc/mounts"); err != nil {
		b.Fatalf("the smx sandbox does not mount /work over virtio-fs: %v\n%s", err, out)
	}
	peers := []struct {
		name string
		g    benchGuest
	}{{"virtiofs", vfsG}, {"tcp", tcpG}, {"qemu-9p", qemuG}}
	const mib = 128
	results := map[string]map[string]time.Duration{}
	run := func(name, peer string, g benchGuest, script string) {
		b.Run(name+"/"+peer, func(b *testing.B) {
			var ds []time.Duration
			for i := 0; i < b.N; i++ {
				start := time.Now()
				if out, err := g.Exec(nil, "sh", "-c", script); err != nil {
					b.Fatalf("%s: %v\n%s", name, err, out)
				}
				ds = append(ds, time.Since(start))
			}
			slices.Sort(ds)
			if results[name] == nil {
				results[name] = map[string]time.Duration{}
			}
			results[name][peer] = ds[len(ds)/2]
		})
	}
	for _, w := range []struct{ name, script string }{
		{"write", fmt.Sprintf("dd if=/dev/zero of=/work/big bs=1M count=%d conv=fsync 2>/dev/null", mib)},
		{"read", "sync; echo 3 > /proc/sys/vm/drop_caches; dd if=/work/big of=/dev/null bs=1M 2>/dev/null"},
		{"meta-1000", "mkdir -p /work/m && cd /work/m && seq 1000 | xargs touch && ls -l | wc -l >/dev/null && seq 1000 | xargs rm && cd / && rmdir /work/m"},
	} {
		for _, p := range peers {
			run(w.name, p.name, p.g, w.script)
		}
	}
	for _, w := range []string{"write", "read", "meta-1000"} {
		r := results[w]
		if len(r) < 3 {
			continue
		}
		b.Logf("%s (median): virtiofs %v, smx 9P tcp %v, qemu-9p %v; virtiofs speed vs qemu-9p %.2fx, vs smx 9P tcp %.2fx",
			w, r["virtiofs"].Round(time.Millisecond), r["tcp"].Round(time.Millisecond), r["qemu-9p"].Round(time.Millisecond),
			float64(r["qemu-9p"])/float64(r["virtiofs"]), float64(r["tcp"])/float64(r["virtiofs"]))
	}
}
