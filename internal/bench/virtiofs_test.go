package bench

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/smx-dev/smx/internal/testutil"
	"github.com/smx-dev/smx/internal/vm"
)

// BenchmarkFilesVirtioFS compares a host folder served by the supervisor
// as the vhost-user-fs backend (every FUSE operation decided by the
// profile, "virtiofs") with Debian's virtiofsd on the same device and
// shared RAM (no policy, its default cache=auto: 1 s entry and attribute
// timeouts where smx has 0), QEMU's own virtio-9p (`-fsdev local`, no
// policy) and the VM's own disk (a directory of the virtio-9p guest's
// root disk), all on one QEMU (8.2 or newer: set SMX_QEMU), kernel,
// image (the Debian test image: it has git) and guest size (512 MiB, one
// vCPU). SMX_BENCH_TCP=1 adds the sandbox's 9P gateway over TCP ("tcp";
// slow: it multiplies the run time). Each workload runs b.N times per peer
// (-benchtime=Nx) and the ratios of the medians are logged (-v) and
// reported as metrics (peer time / virtiofs time: above 1 is smx faster).
// Under TCG a second smx sandbox, "virtiofs-nobounce", runs without the
// guest's bounce buffers (SMX_VIRTIOFS_BOUNCE=0), to show their cost;
// SMX_BENCH_CACHE=1s adds "virtiofs-cache1s", smx with that entry and
// attribute timeout (SMX_VIRTIOFS_CACHE) instead of 0.
// Workloads:
//
//   - write: dd 256 MiB with fsync;
//   - read: dd it back, guest page cache dropped first;
//   - meta: create, stat (ls -l) and unlink $SMX_BENCH_FILES small files
//     (default 2000: 10 000 takes minutes per run under TCG);
//   - git-status: `git status` in a repository of $SMX_BENCH_REPO files
//     (default 10 000) in 200 directories, index refreshed once first;
//   - untar: extract 200 packages of 10 small files each (an `npm ci` from
//     a local cache is this: no node in the image) from a tarball on the
//     guest's disk into the share, after removing the previous tree.
func BenchmarkFilesVirtioFS(b *testing.B) {
	line, err := vm.QEMUVersion(context.Background(), "")
	if err != nil || !vm.VirtioFSCapable(line) {
		b.Skipf("virtio-fs needs QEMU >= 8.2 (have %q): set SMX_QEMU", line)
	}
	setup(b)
	img := testutil.DebianImage(b, home)
	files := envInt("SMX_BENCH_FILES", 2000)
	repoFiles := envInt("SMX_BENCH_REPO", 10000)

	// One repository and one package tarball, made on the host, copied
	// into every share.
	src := b.TempDir()
	makeRepo(b, filepath.Join(src, "r"), repoFiles)
	makePackages(b, filepath.Join(src, "pkg"), 200, 10)
	hostSh(b, src, "tar cf repo.tar r && tar czf pkg.tgz -C pkg . && rm -rf pkg")
	shareVFS, shareVFSD, share9p := b.TempDir(), b.TempDir(), b.TempDir()
	shares := []string{shareVFS, shareVFSD, share9p}
	accel, _ := vm.DetectAccel()
	var shareNoBounce, shareCache string
	if accel == vm.AccelTCG {
		shareNoBounce = b.TempDir()
		shares = append(shares, shareNoBounce)
	}
	cache := os.Getenv("SMX_BENCH_CACHE")
	if cache != "" {
		shareCache = b.TempDir()
		shares = append(shares, shareCache)
	}
	var shareTCP string
	if os.Getenv("SMX_BENCH_TCP") == "1" {
		shareTCP = b.TempDir()
		shares = append(shares, shareTCP)
	}
	for _, d := range shares {
		hostSh(b, d, "cp -a "+src+"/. .")
	}

	type peer struct {
		name, dir string
		g         benchGuest
	}
	vfsG := startSMXFiles(b, "bench-vfs", shareVFS, "virtiofs", "--image", img)
	defer vfsG.Close()
	peers := []peer{{"virtiofs", "/work", vfsG}}
	startWith := func(name, dir, env, value string) *smxGuest {
		old, had := os.LookupEnv(env)
		os.Setenv(env, value)
		defer func() {
			if had {
				os.Setenv(env, old)
			} else {
				os.Unsetenv(env)
			}
		}()
		return startSMXFiles(b, name, dir, "virtiofs", "--image", img)
	}
	if shareNoBounce != "" {
		// Under TCG smx has the guest bounce virtio-fs buffers (see
		// supervisor.startVirtioFS); this one shows what that costs.
		g := startWith("bench-vfs-nobounce", shareNoBounce, "SMX_VIRTIOFS_BOUNCE", "0")
		defer g.Close()
		peers = append(peers, peer{"virtiofs-nobounce", "/work", g})
	}
	if shareCache != "" {
		// What the guest's name and attribute cache is worth
		// (SMX_VIRTIOFS_CACHE; smx's default is none).
		g := startWith("bench-vfs-cache", shareCache, "SMX_VIRTIOFS_CACHE", cache)
		defer g.Close()
		peers = append(peers, peer{"virtiofs-cache" + cache, "/work", g})
	}
	var vfsdG *userVM
	if vfsd, ok := startVirtiofsd(b, shareVFSD); ok {
		vfsdG = startPeerVM(b, img, "virtiofsd", " smx.shares=1", vfsd)
		defer vfsdG.Close()
		peers = append(peers, peer{"virtiofsd", "/work", vfsdG})
	}
	qemuG := start9pVM(b, share9p, img)
	defer qemuG.Close()
	peers = append(peers, peer{"qemu-9p", "/work", qemuG}, peer{"disk", "/root/d", qemuG})
	if shareTCP != "" {
		tcpG := startSMXFiles(b, "bench-vfs-tcp", shareTCP, "tcp", "--image", img)
		defer tcpG.Close()
		peers = append(peers, peer{"tcp", "/work", tcpG})
	}
	mustExec := func(g benchGuest, script string) {
		b.Helper()
		if out, err := g.Exec(nil, "sh", "-c", script); err != nil {
			b.Fatalf("%s: %v\n%s", script, err, out)
		}
	}
	for _, p := range peers {
		if isSMX(p.name) {
			mustExec(p.g, "grep -q ' /work virtiofs ' /proc/mounts")
		}
	}
	if vfsdG != nil {
		mustExec(vfsdG, "mkdir -p /work && mount -t virtiofs peer /work")
	}
	mustExec(qemuG, "mkdir -p /work && mount -t 9p -o trans=virtio,version=9p2000.L,msize=512000,cache=mmap,access=client peer /work")
	// The disk peer gets the same tree from the share; every guest gets
	// the package tarball on its own disk, the source of untar.
	mustExec(qemuG, "mkdir -p /root/d && cd /root/d && tar xf /work/repo.tar")
	for _, p := range peers {
		mustExec(p.g, "cp /work/pkg.tgz /root/pkg.tgz")
		mustExec(p.g, "cd "+p.dir+"/r && git -c safe.directory='*' status --porcelain >/dev/null")
	}

	const mib = 256
	results := map[string]map[string]time.Duration{}
	workloads := []struct{ name, prep, script string }{
		{"write", "rm -f $D/big", fmt.Sprintf("dd if=/dev/zero of=$D/big bs=1M count=%d conv=fsync 2>/dev/null", mib)},
		{"read", "sync; echo 3 > /proc/sys/vm/drop_caches", "dd if=$D/big of=/dev/null bs=1M 2>/dev/null"},
		// The big file goes: the disk peer's image has no room for it
		// and the trees.
		{fmt.Sprintf("meta-%d", files), "rm -rf $D/m $D/big",
			fmt.Sprintf("mkdir $D/m && cd $D/m && seq %d | xargs touch && ls -l | wc -l >/dev/null && seq %d | xargs rm && cd / && rmdir $D/m", files, files)},
		{fmt.Sprintf("git-status-%d", repoFiles), "", "cd $D/r && git -c safe.directory='*' status --porcelain >/dev/null"},
		{"untar-2000", "rm -rf $D/inst; sync", "mkdir $D/inst && tar xzf /root/pkg.tgz -C $D/inst"},
	}
	for _, w := range workloads {
		for _, p := range peers {
			env := "D=" + p.dir + "; "
			b.Run(w.name+"/"+p.name, func(b *testing.B) {
				var ds []time.Duration
				for i := 0; i < b.N; i++ {
					if w.prep != "" {
						b.StopTimer()
						mustExec(p.g, env+w.prep)
						b.StartTimer()
					}
					start := time.Now()
					if out, err := p.g.Exec(nil, "sh", "-c", env+w.script); err != nil {
						b.Fatalf("%s: %v\n%s", w.name, err, out)
					}
					ds = append(ds, time.Since(start))
				}
				slices.Sort(ds)
				if results[w.name] == nil {
					results[w.name] = map[string]time.Duration{}
				}
				results[w.name][p.name] = ds[len(ds)/2]
			})
		}
	}
	// The ratios are a sub-benchmark's metrics: a benchmark with
	// sub-benchmarks reports nothing of its own (nor its log without -v).
	b.Run("ratios", func(b *testing.B) {
		for _, w := range workloads {
			r := results[w.name]
			var parts []string
			for _, p := range peers {
				parts = append(parts, fmt.Sprintf("%s %v", p.name, r[p.name].Round(time.Millisecond)))
			}
			b.Logf("%s (median): %s", w.name, strings.Join(parts, ", "))
			for _, mine := range []string{"virtiofs", "virtiofs-nobounce", "virtiofs-cache" + cache} {
				if r[mine] == 0 {
					continue
				}
				var ratios []string
				for _, p := range peers {
					if !isSMX(p.name) && r[p.name] != 0 {
						ratio := float64(r[p.name]) / float64(r[mine])
						ratios = append(ratios, fmt.Sprintf("vs %s %.2fx", p.name, ratio))
						b.ReportMetric(ratio, w.name+"-"+mine+"-vs-"+p.name+"-x")
					}
				}
				b.Logf("%s: %s speed %s", w.name, mine, strings.Join(ratios, ", "))
			}
		}
	})
}

// isSMX says whether a peer is one of smx's virtio-fs sandboxes.
func isSMX(peer string) bool { return peer == "virtiofs" || strings.HasPrefix(peer, "virtiofs-") }

func envInt(name string, def int) int {
	if n, err := strconv.Atoi(os.Getenv(name)); err == nil && n > 0 {
		return n
	}
	return def
}

func hostSh(b *testing.B, dir, script string) {
	b.Helper()
	c := exec.Command("sh", "-c", script)
	c.Dir = dir
	if out, err := c.CombinedOutput(); err != nil {
		b.Fatalf("%s: %v\n%s", script, err, out)
	}
}

// makeRepo commits n small files in 200 directories to a new repository.
func makeRepo(b *testing.B, dir string, n int) {
	b.Helper()
	for i := range n {
		p := filepath.Join(dir, fmt.Sprintf("d%03d", i%200), fmt.Sprintf("f%05d.txt", i))
		os.MkdirAll(filepath.Dir(p), 0o755)
		if err := os.WriteFile(p, []byte(strings.Repeat("x", i%500)), 0o644); err != nil {
			b.Fatal(err)
		}
	}
	hostSh(b, dir, "git init -q && git add -A && git -c user.name=b -c user.email=b@b commit -qm init")
}

// makePackages writes pkgs directories of per small files each, shaped
// like node_modules (a package.json, sources of 100 B to 4 KiB).
func makePackages(b *testing.B, dir string, pkgs, per int) {
	b.Helper()
	for i := range pkgs {
		d := filepath.Join(dir, "node_modules", fmt.Sprintf("pkg%03d", i), "lib")
		if err := os.MkdirAll(d, 0o755); err != nil {
			b.Fatal(err)
		}
		os.WriteFile(filepath.Join(d, "..", "package.json"), []byte(fmt.Sprintf(`{"name":"pkg%03d","version":"1.0.0"}`, i)), 0o644)
		for j := 1; j < per; j++ {
			os.WriteFile(filepath.Join(d, fmt.Sprintf("m%d.js", j)), []byte(strings.Repeat("//x\n", 25+(i*7+j*13)%1000)), 0o644)
		}
	}
}

// virtiofsd is Debian's virtiofsd serving a folder on a vhost-user-fs
// device (tag "peer"), fd 4 in QEMU.
type virtiofsd struct{ conn *os.File }

func (v virtiofsd) Args(ids *vm.IDs) []string {
	// libvhost-user refuses a legacy device, microvm's default transport.
	return append([]string{"-global", "virtio-mmio.force-legacy=false"}, vm.VirtioFS{Tag: "peer", FD: 4}.Args(ids)...)
}

func (v virtiofsd) peerFiles() []*os.File { return []*os.File{v.conn} }

// startVirtiofsd starts /usr/lib/qemu/virtiofsd (or $SMX_BENCH_VIRTIOFSD)
// on dir and connects to its socket; the process ends with the test.
// Without the program the run goes on without that peer, and says so.
func startVirtiofsd(b *testing.B, dir string) (virtiofsd, bool) {
	b.Helper()
	prog := os.Getenv("SMX_BENCH_VIRTIOFSD")
	if prog == "" {
		prog = "/usr/lib/qemu/virtiofsd"
	}
	if _, err := os.Stat(prog); err != nil {
		b.Logf("no virtiofsd peer: %v (Debian 12's qemu-system-common has it; or set SMX_BENCH_VIRTIOFSD)", err)
		return virtiofsd{}, false
	}
	sock := filepath.Join(b.TempDir(), "vfsd.sock")
	cmd := exec.Command(prog, "--socket-path="+sock, "-o", "source="+dir)
	log, _ := os.Create(filepath.Join(b.TempDir(), "virtiofsd.log"))
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	var c net.Conn
	var err error
	for range 100 {
		if c, err = net.Dial("unix", sock); err == nil {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err != nil {
		b.Fatalf("virtiofsd socket: %v", err)
	}
	f, err := c.(*net.UnixConn).File()
	c.Close()
	if err != nil {
		b.Fatal(err)
	}
	return virtiofsd{conn: f}, true
}
