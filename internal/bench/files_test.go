package bench

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/smx-dev/smx/internal/preset"
	"github.com/smx-dev/smx/internal/sandbox"
	"github.com/smx-dev/smx/internal/statedir"
	"github.com/smx-dev/smx/internal/testutil"
	"github.com/smx-dev/smx/internal/vm"
)

// BenchmarkFiles compares a host folder shared through smx's file gateway
// (9P over TCP to the gateway address, every operation decided by the
// profile; the guest kernel connects itself, "tcp", or smx-agent carries
// the session so that it survives a restore, "relay") with QEMU's own
// virtio-9p (`-fsdev local`, no policy) and with the VM's
// own disk, on the same kernel, initramfs, image, guest size and 9P mount
// options (cache=mmap, access=client). Workloads, timed from the host
// around one exec each:
//
//   - write: dd 256 MiB (1 GiB is too slow under TCG here) with fsync;
//   - read: dd the same file back, guest page cache dropped first;
//   - meta: create, stat (ls -l) and unlink 1000 small files.
//
// The ratios are logged at the end (run with -v).
func BenchmarkFiles(b *testing.B) {
	setup(b)
	shareSMX, shareRelay, share9p := b.TempDir(), b.TempDir(), b.TempDir()
	smxG := startSMXFiles(b, "bench-files", shareSMX, "tcp")
	defer smxG.Close()
	relayG := startSMXFiles(b, "bench-files-relay", shareRelay, "relay")
	defer relayG.Close()
	qemuG := start9pVM(b, share9p, "busybox")
	defer qemuG.Close()
	if out, err := qemuG.Exec(nil, "sh", "-c", "mkdir -p /work && mount -t 9p -o trans=virtio,version=9p2000.L,msize=512000,cache=mmap,access=client peer /work"); err != nil {
		b.Fatalf("mount virtio-9p: %v\n%s", err, out)
	}
	if out, err := smxG.Exec(nil, "mkdir", "-p", "/root/disk"); err != nil {
		b.Fatal(err, out)
	}
	peers := []struct {
		name string
		g    benchGuest
		dir  string
	}{
		{"smx", smxG, "/work"},
		{"smx-relay", relayG, "/work"},
		{"qemu-9p", qemuG, "/work"},
		{"disk", smxG, "/root/disk"},
	}
	const mib = 256
	results := map[string]map[string]time.Duration{}
	run := func(name, peer string, g benchGuest, script string) {
		b.Run(name+"/"+peer, func(b *testing.B) {
			var total time.Duration
			for i := 0; i < b.N; i++ {
				start := time.Now()
				if out, err := g.Exec(nil, "sh", "-c", script); err != nil {
					b.Fatalf("%s: %v\n%s", name, err, out)
				}
				total += time.Since(start)
			}
			if results[name] == nil {
				results[name] = map[string]time.Duration{}
			}
			results[name][peer] = total / time.Duration(b.N)
		})
	}
	for _, p := range peers {
		run("write-256MiB", p.name, p.g, fmt.Sprintf("dd if=/dev/zero of=%s/big bs=1M count=%d conv=fsync 2>/dev/null", p.dir, mib))
	}
	for _, p := range peers {
		run("read-256MiB", p.name, p.g, fmt.Sprintf("sync; echo 3 > /proc/sys/vm/drop_caches; dd if=%s/big of=/dev/null bs=1M 2>/dev/null", p.dir))
	}
	for _, p := range peers {
		run("meta-1000", p.name, p.g, fmt.Sprintf("mkdir -p %[1]s/m && cd %[1]s/m && seq 1000 | xargs touch && ls -l | wc -l >/dev/null && seq 1000 | xargs rm && cd / && rmdir %[1]s/m", p.dir))
	}
	for _, w := range []string{"write-256MiB", "read-256MiB", "meta-1000"} {
		r := results[w]
		if len(r) < 4 {
			continue
		}
		b.Logf("%s: smx (tcp) %v, smx (relay) %v, qemu-9p %v, disk %v; smx speed vs qemu-9p %.2fx (relay: %.2fx), smx time vs disk %.2fx (relay: %.2fx)",
			w, r["smx"].Round(time.Millisecond), r["smx-relay"].Round(time.Millisecond), r["qemu-9p"].Round(time.Millisecond), r["disk"].Round(time.Millisecond),
			float64(r["qemu-9p"])/float64(r["smx"]), float64(r["qemu-9p"])/float64(r["smx-relay"]),
			float64(r["smx"])/float64(r["disk"]), float64(r["smx-relay"])/float64(r["disk"]))
	}
}

// startSMXFiles starts a sandbox with dir at /work through the given
// transport (SMX_FILES_TRANSPORT).
func startSMXFiles(b *testing.B, name, dir, transport string, extra ...string) *smxGuest {
	smx("agent", "rm", "-f", name)
	if out, err := smx(append([]string{"agent", "create", name, "--memory", "512M", "--profile", "dev", "-v", dir + ":/work"}, extra...)...); err != nil {
		b.Fatal(err, out)
	}
	start := exec.Command(filepath.Join(bin, "smx"), "agent", "start", name)
	start.Env = append(os.Environ(), "SMX_HOME="+home, "SMX_FILES_TRANSPORT="+transport)
	if out, err := start.CombinedOutput(); err != nil {
		smx("agent", "rm", "-f", name)
		b.Fatal(err, string(out))
	}
	m := &sandbox.Manager{State: statedir.Dir{Root: home}}
	in, err := m.Get(name)
	if err != nil {
		b.Fatal(err)
	}
	return &smxGuest{name: name, c: &sandbox.Client{Paths: m.Paths(name)}, pid: in.State.SupervisorPID}
}

// virtio9p is QEMU's own 9P server on a virtio-mmio device: the peer.
type virtio9p struct{ dir string }

func (v virtio9p) Args(ids *vm.IDs) []string {
	id := ids.New("fs")
	return []string{"-fsdev", "local,id=" + id + ",path=" + v.dir + ",security_model=none",
		"-device", "virtio-9p-device,fsdev=" + id + ",mount_tag=peer"}
}

// start9pVM boots a guest like a sandbox (same kernel, initramfs, agent,
// image, memory) with QEMU's virtio-9p serving dir, and no network.
func start9pVM(b *testing.B, dir, imageName string) *userVM {
	return startPeerVM(b, imageName, "qemu-9p", " smx.shares=1", virtio9p{dir: dir})
}

// BenchmarkFilesGit runs `git status` in a repository of 2000 files (10 000
// is too slow under TCG here) mounted through smx's gateway (tcp and relay
// transports), through QEMU's
// virtio-9p, and copied onto the VM's own disk (Debian test image), and
// measures the supervisor's memory while the guest holds 10 000 files of
// its mount open.
func BenchmarkFilesGit(b *testing.B) {
	setup(b)
	img := testutil.DebianImage(b, home)
	repo, repoRelay, repo9p := b.TempDir(), b.TempDir(), b.TempDir()
	for _, dir := range []string{repo, repoRelay, repo9p} {
		for i := range 2000 {
			p := filepath.Join(dir, "r", fmt.Sprintf("d%02d", i%40), fmt.Sprintf("f%04d.txt", i))
			os.MkdirAll(filepath.Dir(p), 0o755)
			os.WriteFile(p, []byte(strings.Repeat("x", i%300)), 0o644)
		}
		for i := range 10000 {
			p := filepath.Join(dir, "open", fmt.Sprintf("f%05d", i))
			os.MkdirAll(filepath.Dir(p), 0o755)
			os.WriteFile(p, nil, 0o644)
		}
		c := exec.Command("sh", "-c", "cd r && git init -q && git add -A && git -c user.name=b -c user.email=b@b commit -qm init")
		c.Dir = dir
		if out, err := c.CombinedOutput(); err != nil {
			b.Fatal(err, string(out))
		}
	}
	smxG := startSMXFiles(b, "bench-files-git", repo, "tcp", "--image", img, "--memory", "1G")
	defer smxG.Close()
	relayG := startSMXFiles(b, "bench-files-git-relay", repoRelay, "relay", "--image", img, "--memory", "1G")
	defer relayG.Close()
	qemuG := start9pVM(b, repo9p, img)
	defer qemuG.Close()
	if out, err := qemuG.Exec(nil, "sh", "-c", "mkdir -p /work && mount -t 9p -o trans=virtio,version=9p2000.L,msize=512000,cache=mmap,access=client peer /work"); err != nil {
		b.Fatalf("mount virtio-9p: %v\n%s", err, out)
	}
	if out, err := smxG.Exec(nil, "sh", "-c", "cp -a /work/r /root/r"); err != nil {
		b.Fatal(err, out)
	}
	for _, g := range []benchGuest{smxG, relayG, qemuG} {
		if out, err := g.Exec(nil, "git", "config", "--global", "--add", "safe.directory", "*"); err != nil {
			b.Fatal(err, out)
		}
	}
	// Warm up: the first status in a guest re-hashes every file, because
	// the index holds the host's stat data (device numbers differ), and
	// writes the refreshed index. What is measured is the next one.
	for _, p := range []struct {
		g   benchGuest
		dir string
	}{{smxG, "/work/r"}, {relayG, "/work/r"}, {qemuG, "/work/r"}, {smxG, "/root/r"}} {
		if out, err := p.g.Exec(nil, "git", "-C", p.dir, "status", "--porcelain"); err != nil || out != "" {
			b.Fatalf("git status: %v %q", err, out)
		}
	}
	peers := []struct {
		name string
		g    benchGuest
		dir  string
	}{{"smx", smxG, "/work/r"}, {"smx-relay", relayG, "/work/r"}, {"qemu-9p", qemuG, "/work/r"}, {"disk", smxG, "/root/r"}}
	res := map[string]time.Duration{}
	for _, p := range peers {
		b.Run("git-status-2000/"+p.name, func(b *testing.B) {
			var total time.Duration
			for i := 0; i < b.N; i++ {
				start := time.Now()
				out, err := p.g.Exec(nil, "git", "-C", p.dir, "status", "--porcelain")
				if err != nil || out != "" {
					b.Fatalf("git status: %v %q", err, out)
				}
				total += time.Since(start)
			}
			res[p.name] = total / time.Duration(b.N)
		})
	}
	if len(res) == 4 {
		b.Logf("git status, 2000 files: smx (tcp) %v, smx (relay) %v, qemu-9p %v, disk %v; smx speed vs qemu-9p %.2fx (relay: %.2fx), smx time vs disk %.2fx",
			res["smx"].Round(time.Millisecond), res["smx-relay"].Round(time.Millisecond), res["qemu-9p"].Round(time.Millisecond), res["disk"].Round(time.Millisecond),
			float64(res["qemu-9p"])/float64(res["smx"]), float64(res["qemu-9p"])/float64(res["smx-relay"]), float64(res["smx"])/float64(res["disk"]))
	}
	b.Run("open-10000/smx", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			before := rssMiB(smxG.NetPID())
			script := `ulimit -n 20000
exec perl -e 'open(my $p, ">", "/tmp/open.pid"); print $p "$$\n"; close $p; for (0..9999) { open(my $f, "<", sprintf("/work/open/f%05d", $_)) or die "$_: $!"; push @h, $f } open(my $r, ">", "/tmp/open.ready"); close $r; sleep 3600'
`
			if out, err := smxG.Exec(strings.NewReader(script), "sh", "-c", "cat > /tmp/open.sh; rm -f /tmp/open.ready"); err != nil {
				b.Fatal(err, out)
			}
			// In the foreground of its own exec: a background job of an
			// exec that ends can be killed with its process group.
			done := make(chan string, 1)
			go func() { out, err := smxG.Exec(nil, "sh", "/tmp/open.sh"); done <- fmt.Sprint(out, err) }()
			deadline := time.Now().Add(10 * time.Minute)
			for {
				if _, err := smxG.Exec(nil, "test", "-e", "/tmp/open.ready"); err == nil {
					break
				}
				select {
				case out := <-done:
					b.Fatalf("opening 10000 files: %s", out)
				default:
				}
				if time.Now().After(deadline) {
					b.Fatal("opening 10000 files: timed out")
				}
				time.Sleep(time.Second)
			}
			after := rssMiB(smxG.NetPID())
			b.ReportMetric(before, "RSS-before-MiB")
			b.ReportMetric(after, "RSS-10000-open-MiB")
			b.Logf("supervisor RSS %.1f MiB -> %.1f MiB with 10000 files of the mount open (+%.2f KiB per open file)", before, after, (after-before)*1024/10000)
			smxG.Exec(nil, "sh", "-c", "kill $(cat /tmp/open.pid)")
			<-done
		}
	})
}

// npmProject writes a project of n generated packages, each a local
// tarball under pkgs/ (package.json, index.js, 8 modules, a README: about
// 11 files, 20 KiB), that package.json depends on by file: reference: an
// install from a local cache, no network.
func npmProject(b *testing.B, dir string, n int) {
	deps := map[string]string{}
	for i := range n {
		name := fmt.Sprintf("gen-%03d", i)
		files := map[string]string{
			"package.json": fmt.Sprintf(`{"name": %q, "version": "1.0.%d", "main": "index.js", "license": "MIT"}`+"\n", name, i),
			"index.js":     "module.exports = require('./lib/m0.js');\n",
			"README.md":    strings.Repeat("Generated package for the files benchmark.\n", 20),
		}
		for j := range 8 {
			files[fmt.Sprintf("lib/m%d.js", j)] = fmt.Sprintf("// module %d of %s\n", j, name) + strings.Repeat(fmt.Sprintf("exports.f%d = function (x) { return x + %d; };\n", j, j), 40)
		}
		tgz := fmt.Sprintf("pkgs/%s-1.0.%d.tgz", name, i)
		writeTarball(b, filepath.Join(dir, tgz), files)
		deps[name] = "file:" + tgz
	}
	pj, _ := json.MarshalIndent(map[string]any{"name": "bench-app", "version": "1.0.0", "private": true, "dependencies": deps}, "", "  ")
	if err := os.WriteFile(filepath.Join(dir, "package.json"), pj, 0o644); err != nil {
		b.Fatal(err)
	}
}

// writeTarball writes an npm package tarball (entries under package/).
func writeTarball(b *testing.B, path string, files map[string]string) {
	os.MkdirAll(filepath.Dir(path), 0o755)
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	tw := tar.NewWriter(zw)
	names := make([]string, 0, len(files))
	for n := range files {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		tw.WriteHeader(&tar.Header{Name: "package/" + n, Mode: 0o644, Size: int64(len(files[n])), Typeflag: tar.TypeReg})
		tw.Write([]byte(files[n]))
	}
	tw.Close()
	zw.Close()
	if err := os.WriteFile(path, buf.Bytes(), 0o644); err != nil {
		b.Fatal(err)
	}
}

// nodeKit is a tar stream of the host's node binary and npm, unpacked
// onto each guest's own disk (/opt/kit) before anything is timed: the
// preset image has node's libraries but not npm.
func nodeKit(b *testing.B) []byte {
	node, err := exec.LookPath("node")
	testutil.Require(b, err == nil, "node", "install Node.js with npm")
	npm, err := exec.LookPath("npm")
	testutil.Require(b, err == nil, "npm", "install Node.js with npm")
	cli, err := filepath.EvalSymlinks(npm)
	if err != nil {
		b.Fatal(err)
	}
	npmDir := filepath.Dir(filepath.Dir(cli))
	if node, err = filepath.EvalSymlinks(node); err != nil {
		b.Fatal(err)
	}
	c := exec.Command("tar", "-c", "-P", "--transform", "s,^"+npmDir+",npm,", "--transform", "s,^"+node+",node,", node, npmDir)
	out, err := c.Output()
	if err != nil {
		b.Fatal("tar the node kit: ", err)
	}
	return out
}

// BenchmarkFilesNpm runs `npm install --offline` of a project of 100
// packages from local tarballs (about 1100 files into node_modules, a
// lock file, npm's own cache on the guest's disk) in a folder shared
// through smx's gateway (tcp), through QEMU's virtio-9p, and on the VM's
// own disk; claude preset image (Debian with node), the host's node and
// npm copied onto each guest's disk.
func BenchmarkFilesNpm(b *testing.B) {
	setup(b)
	img := presetImageBench(b, "claude")
	kit := nodeKit(b)
	shareSMX, share9p := b.TempDir(), b.TempDir()
	for _, d := range []string{shareSMX, share9p} {
		npmProject(b, filepath.Join(d, "app"), 100)
	}
	smxG := startSMXFiles(b, "bench-files-npm", shareSMX, "tcp", "--image", img)
	defer smxG.Close()
	qemuG := start9pVM(b, share9p, img)
	defer qemuG.Close()
	if out, err := qemuG.Exec(nil, "sh", "-c", "mkdir -p /work && mount -t 9p -o trans=virtio,version=9p2000.L,msize=512000,cache=mmap,access=client peer /work"); err != nil {
		b.Fatalf("mount virtio-9p: %v\n%s", err, out)
	}
	for _, g := range []benchGuest{smxG, qemuG} {
		if out, err := g.Exec(bytes.NewReader(kit), "sh", "-c", "mkdir -p /opt/kit && tar -x -C /opt/kit && /opt/kit/node --version"); err != nil {
			b.Fatalf("node kit: %v\n%s", err, out)
		}
	}
	if out, err := smxG.Exec(nil, "cp", "-a", "/work/app", "/root/app"); err != nil {
		b.Fatal(err, out)
	}
	peers := []struct {
		name string
		g    benchGuest
		dir  string
	}{{"smx", smxG, "/work/app"}, {"qemu-9p", qemuG, "/work/app"}, {"disk", smxG, "/root/app"}}
	res := map[string]time.Duration{}
	for _, p := range peers {
		b.Run("npm-install-100/"+p.name, func(b *testing.B) {
			var total time.Duration
			for i := 0; i < b.N; i++ {
				if out, err := p.g.Exec(nil, "sh", "-c", "cd "+p.dir+" && rm -rf node_modules package-lock.json /root/.npm"); err != nil {
					b.Fatal(err, out)
				}
				start := time.Now()
				out, err := p.g.Exec(nil, "sh", "-c", "cd "+p.dir+" && HOME=/root /opt/kit/node /opt/kit/npm/bin/npm-cli.js install --offline --no-audit --no-fund --ignore-scripts --loglevel=error >/tmp/npm.log 2>&1 || { cat /tmp/npm.log; exit 1; }; ls node_modules | wc -l")
				total += time.Since(start)
				if err != nil || strings.TrimSpace(out) != "100" {
					b.Fatalf("npm install: %v\n%s", err, out)
				}
			}
			res[p.name] = total / time.Duration(b.N)
		})
	}
	if len(res) == 3 {
		b.Logf("npm install, 100 packages: smx (tcp) %v, qemu-9p %v, disk %v; smx speed vs qemu-9p %.2fx, smx time vs disk %.2fx",
			res["smx"].Round(time.Millisecond), res["qemu-9p"].Round(time.Millisecond), res["disk"].Round(time.Millisecond),
			float64(res["qemu-9p"])/float64(res["smx"]), float64(res["smx"])/float64(res["disk"]))
	}
}

// presetImageBench links a preset's image (built by scripts/test.sh into
// $SMX_TEST_IMAGES) into the benchmarks' state directory.
func presetImageBench(b *testing.B, name string) string {
	p, err := preset.Get(name, "")
	if err != nil {
		b.Fatal(err)
	}
	img, dir := p.ImageName(), os.Getenv("SMX_TEST_IMAGES")
	_, err = os.Stat(filepath.Join(dir, img, "image.json"))
	testutil.Require(b, dir != "" && err == nil, "the "+name+" preset's image "+img, "run scripts/test.sh, which builds it once into $SMX_TEST_IMAGES")
	os.MkdirAll(filepath.Join(home, "images"), 0o755)
	if err := os.Symlink(filepath.Join(dir, img), filepath.Join(home, "images", img)); err != nil && !os.IsExist(err) {
		b.Fatal(err)
	}
	return img
}
