package bench

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha512"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"math/rand"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/smx-dev/smx/internal/testutil"
)

// BenchmarkNpmCI measures `npm ci` of a mid-size project (npmPackages
// packages, about 7 MB of tarballs, from a tarball server on host
// loopback reached through network.host_ports) in a new sandbox each
// time: with an empty read-only npm cache (--volume-cache, the first time
// a user runs it) and with one a previous sandbox filled (the host
// promoted what it verified when that sandbox ended). Both run in turn in
// every round; reported: the median seconds of each, measured in the
// guest around npm ci alone and end to end (smx run: boot, copy of the
// project, npm ci, the cache's promotion), the ratios warm/cold, and the
// tarballs the server served per run.
//
// The guest is the claude preset's image (Node.js from Debian), with the
// host's npm shared read-only: the image carries no npm of its own.
func BenchmarkNpmCI(b *testing.B) {
	setup(b)
	img := presetImageBench(b, "claude")
	npmDir := "/usr/lib/node_modules/npm"
	_, err := os.Stat(filepath.Join(npmDir, "bin", "npm-cli.js"))
	testutil.Require(b, err == nil, "the host's npm in "+npmDir, "apt-get install npm")

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	proj := b.TempDir()
	tarballs, err := npmRegistryProject(proj, "http://host.smx.internal:"+strconv.Itoa(port))
	if err != nil {
		b.Fatal(err)
	}
	var served atomic.Int64
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		t, ok := tarballs[strings.TrimPrefix(r.URL.Path, "/")]
		if !ok {
			http.NotFound(w, r)
			return
		}
		served.Add(1)
		w.Header().Set("Content-Type", "application/octet-stream")
		w.Write(t)
	})}
	go srv.Serve(ln)
	defer srv.Close()
	prof := filepath.Join(b.TempDir(), "npm.yaml")
	os.WriteFile(prof, []byte(fmt.Sprintf("extends: dev\nnetwork:\n  host_ports: [%d]\n", port)), 0o644)

	// The project is copied to the guest's disk (node_modules is not
	// the subject here), then npm ci runs offline from the registry's
	// point of view: every tarball is in the lockfile.
	script := `set -e; cp -r /src /tmp/p; cd /tmp/p
s=$(date +%s%N)
node /opt/npm/bin/npm-cli.js ci --no-audit --no-fund --no-update-notifier --loglevel=error --registry ` + "http://host.smx.internal:" + strconv.Itoa(port) + `/ 2>&1 | grep -v 'does not support Node.js' || true
e=$(date +%s%N)
test -f node_modules/pkg-000/index.js
echo "npm-ci-ns=$((e-s)) installed=$(ls node_modules | wc -l)"`
	re := regexp.MustCompile(`npm-ci-ns=(\d+) installed=(\d+)`)
	run := func(cache string) (guest, total time.Duration, fetched int64) {
		b.Helper()
		before := served.Load()
		start := time.Now()
		out, err := smx("run", "--image", img, "--memory", "2G", "--profile", prof,
			"--volume-cache", cache+":/root/.npm", "-v", npmDir+":/opt/npm:ro", "-v", proj+":/src:ro", "--", "sh", "-c", script)
		total = time.Since(start)
		if err != nil {
			b.Fatal(err, out)
		}
		m := re.FindStringSubmatch(out)
		if m == nil || m[2] != strconv.Itoa(npmPackages) {
			b.Fatalf("npm ci did not install the %d packages:\n%s", npmPackages, out)
		}
		ns, _ := strconv.ParseInt(m[1], 10, 64)
		return time.Duration(ns), total, served.Load() - before
	}

	// The warm cache: filled once, by a sandbox of its own.
	if _, _, n := run("bench-npm-warm"); n != npmPackages {
		b.Fatalf("the first run fetched %d tarballs, want %d", n, npmPackages)
	}
	var cold, warm, coldTotal, warmTotal []time.Duration
	var coldFetched, warmFetched int64
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		// A cache of its own each time: the first npm ci of a user.
		g, t, n := run("bench-npm-cold-" + strconv.Itoa(i))
		cold, coldTotal, coldFetched = append(cold, g), append(coldTotal, t), coldFetched+n
		g, t, n = run("bench-npm-warm")
		warm, warmTotal, warmFetched = append(warm, g), append(warmTotal, t), warmFetched+n
		b.StopTimer()
		smx("cache", "rm", "bench-npm-cold-"+strconv.Itoa(i))
		b.StartTimer()
	}
	b.StopTimer()
	mc, mw, mct, mwt := medianDur(cold), medianDur(warm), medianDur(coldTotal), medianDur(warmTotal)
	b.ReportMetric(mc.Seconds(), "cold-npm-ci-s")
	b.ReportMetric(mw.Seconds(), "warm-npm-ci-s")
	b.ReportMetric(mw.Seconds()/mc.Seconds(), "warm/cold-npm-ci")
	b.ReportMetric(mct.Seconds(), "cold-run-s")
	b.ReportMetric(mwt.Seconds(), "warm-run-s")
	b.ReportMetric(mwt.Seconds()/mct.Seconds(), "warm/cold-run")
	b.ReportMetric(float64(coldFetched)/float64(b.N), "cold-fetched")
	b.ReportMetric(float64(warmFetched)/float64(b.N), "warm-fetched")
}

func medianDur(d []time.Duration) time.Duration {
	s := append([]time.Duration(nil), d...)
	for i := range s {
		for j := i + 1; j < len(s); j++ {
			if s[j] < s[i] {
				s[i], s[j] = s[j], s[i]
			}
		}
	}
	if len(s) == 0 {
		return 0
	}
	return s[len(s)/2]
}

// npmPackages is the size of the synthetic project: a few direct
// dependencies, each pulling in a share of the rest.
const npmPackages = 80

// npmRegistryProject writes a project (package.json, package-lock.json) whose
// npmPackages dependencies are synthetic packages served at base, and
// returns their tarballs by file name. Each holds a module of 40-200 KB of
// incompressible-ish source, as real packages' minified code is.
func npmRegistryProject(dir, base string) (map[string][]byte, error) {
	rng := rand.New(rand.NewSource(31))
	tarballs := map[string][]byte{}
	type lockPkg struct {
		Version      string            `json:"version"`
		Resolved     string            `json:"resolved"`
		Integrity    string            `json:"integrity"`
		Dependencies map[string]string `json:"dependencies,omitempty"`
	}
	packages := map[string]any{}
	direct := map[string]string{}
	for i := 0; i < npmPackages; i++ {
		name := fmt.Sprintf("pkg-%03d", i)
		deps := map[string]string{}
		// pkg-000..004 are the project's; each package depends on the
		// three after 5+3i, a tree hoisted flat into node_modules.
		for c := 5 + 3*i; c < 5+3*i+3 && c < npmPackages; c++ {
			deps[fmt.Sprintf("pkg-%03d", c)] = "1.0.0"
		}
		if i < 5 {
			direct[name] = "1.0.0"
		}
		manifest, _ := json.Marshal(map[string]any{"name": name, "version": "1.0.0", "main": "index.js", "dependencies": deps})
		src := make([]byte, 40<<10+rng.Intn(160<<10))
		const chars = "abcdefghijklmnopqrstuvwxyz0123456789(){};=+- \n" // no "*/" to end the comment
		for j := range src {
			src[j] = chars[rng.Intn(len(chars))]
		}
		var buf bytes.Buffer
		gz := gzip.NewWriter(&buf)
		tw := tar.NewWriter(gz)
		for _, f := range []struct {
			name string
			body []byte
		}{{"package/package.json", manifest}, {"package/index.js", append([]byte("module.exports = 1;\n/*"), append(src, "*/\n"...)...)}} {
			tw.WriteHeader(&tar.Header{Name: f.name, Mode: 0o644, Size: int64(len(f.body)), ModTime: time.Unix(499162500, 0), Typeflag: tar.TypeReg})
			tw.Write(f.body)
		}
		tw.Close()
		gz.Close()
		file := name + "-1.0.0.tgz"
		tarballs[file] = buf.Bytes()
		sum := sha512.Sum512(buf.Bytes())
		lp := lockPkg{Version: "1.0.0", Resolved: base + "/" + file, Integrity: "sha512-" + base64.StdEncoding.EncodeToString(sum[:])}
		if len(deps) > 0 {
			lp.Dependencies = deps
		}
		packages["node_modules/"+name] = lp
	}
	packages[""] = map[string]any{"name": "bench-app", "version": "1.0.0", "dependencies": direct}
	pkg, _ := json.MarshalIndent(map[string]any{"name": "bench-app", "version": "1.0.0", "private": true, "dependencies": direct}, "", "  ")
	lock, _ := json.MarshalIndent(map[string]any{"name": "bench-app", "version": "1.0.0", "lockfileVersion": 3, "requires": true, "packages": packages}, "", "  ")
	if err := os.WriteFile(filepath.Join(dir, "package.json"), pkg, 0o644); err != nil {
		return nil, err
	}
	return tarballs, os.WriteFile(filepath.Join(dir, "package-lock.json"), lock, 0o644)
}
