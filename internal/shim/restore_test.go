package shim_test

import (
	"crypto/rand"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/registry"
	"golang.org/x/mod/sumdb/note"

	"github.com/smx-dev/smx/internal/shim"
	"github.com/smx-dev/smx/internal/testutil"
)

// countingRegistry is go-containerregistry's registry, counting the blobs
// it serves.
type countingRegistry struct {
	reg   http.Handler
	blobs atomic.Int64
}

func (c *countingRegistry) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method == http.MethodGet && strings.Contains(r.URL.Path, "/blobs/sha256:") {
		c.blobs.Add(1)
	}
	c.reg.ServeHTTP(w, r)
}

// warm is host A's side of the restore tests: a registry on loopback
// holding a snapshot of a sandbox whose counter loop ticks and which wrote
// a file on its disk, pushed by host A (an smx state directory of its own,
// no containerd) under ref signed by A's log key, and under strangerRef
// signed by a key nobody trusts. A's sandbox is removed: only the
// registry has its state.
type warm struct {
	reg              *countingRegistry
	host             string // the registry's host:port
	ref, strangerRef string
	key              string // A's log key, as `smx logs export-key` prints it
	strangerPub      string // the stranger's verifier key
	before           int    // the counter, read just before the snapshot
}

func pushWarm(t testing.TB) *warm {
	t.Helper()
	testutil.RequireQEMU(t)
	bin := testutil.Binaries(t)
	kernels := testutil.KernelCache(t)

	reg := &countingRegistry{reg: registry.New(registry.Logger(log.New(io.Discard, "", 0)))}
	srv := httptest.NewServer(reg)
	t.Cleanup(srv.Close)
	host := strings.TrimPrefix(srv.URL, "http://")

	homeA := t.TempDir()
	os.Symlink(kernels, filepath.Join(homeA, "kernels"))
	smxA := func(args ...string) string {
		t.Helper()
		cmd := exec.Command(filepath.Join(bin, "smx"), args...)
		cmd.Env = append(os.Environ(), "SMX_HOME="+homeA, "SMX_BIN="+bin, "XDG_CONFIG_HOME="+filepath.Join(homeA, ".config"))
		var stderr strings.Builder
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("host A: smx %v: %v\n%s%s", args, err, out, stderr.String())
		}
		return strings.TrimSpace(string(out))
	}
	smxA("image", "build", "busybox")
	smxA("agent", "create", "warm", "--memory", "256M", "--profile", "locked")
	t.Cleanup(func() {
		cmd := exec.Command(filepath.Join(bin, "smx"), "agent", "rm", "-f", "warm")
		cmd.Env = append(os.Environ(), "SMX_HOME="+homeA, "SMX_BIN="+bin)
		cmd.Run()
	})
	smxA("agent", "start", "warm")
	counter := `setsid sh -c 'i=0; while :; do i=$((i+1)); echo $i > /tmp/count.new; mv /tmp/count.new /tmp/count; sleep 0.1; done' </dev/null >/dev/null 2>&1 &`
	smxA("agent", "exec", "warm", "--", "sh", "-c", counter+" echo written-on-A > /root/data.txt; sync; sleep 1")
	before, err := strconv.Atoi(smxA("agent", "exec", "warm", "--", "cat", "/tmp/count"))
	if err != nil || before < 1 {
		t.Fatalf("host A: the counter does not count: %v", err)
	}
	smxA("snapshot", "create", "warm", "--name", "warm-snap")
	w := &warm{reg: reg, host: host, ref: host + "/agents/warm:1", strangerRef: host + "/agents/warm:stranger", before: before}
	smxA("snapshot", "push", "warm-snap", w.ref)
	skey, vkey, err := note.GenerateKey(rand.Reader, "stranger")
	if err != nil {
		t.Fatal(err)
	}
	w.strangerPub = vkey
	strangerKey := filepath.Join(t.TempDir(), "stranger.key")
	os.WriteFile(strangerKey, []byte(skey+"\n"), 0o600)
	smxA("snapshot", "push", "warm-snap", w.strangerRef, "--sign-key", strangerKey)
	w.key = smxA("logs", "export-key")
	smxA("agent", "rm", "-f", "warm")
	return w
}

// countsRE is what the restore tests' containers print: the counter
// read twice, two seconds apart.
var countsRE = regexp.MustCompile(`counts (\d+) (\d+)`)

// readCounts is the container command of the restore tests: A's file,
// then the counter twice, two seconds apart.
const readCounts = "cat /root/data.txt; a=$(cat /tmp/count); sleep 2; b=$(cat /tmp/count); echo counts $a $b"

// checkCounts fails the test unless out is A's file and a counter that
// went on from A's: past the value A read before its snapshot, and
// growing.
func checkCounts(t *testing.T, what, out string, before int) {
	t.Helper()
	m := countsRE.FindStringSubmatch(out)
	if !strings.HasPrefix(out, "written-on-A\n") || m == nil {
		t.Fatalf("%s: the restored guest does not hold A's file and counter: %q", what, out)
	}
	a, _ := strconv.Atoi(m[1])
	b, _ := strconv.Atoi(m[2])
	t.Logf("%s: counter %d then %d (A read %d before its snapshot)", what, a, b, before)
	if a < before || b <= a {
		t.Fatalf("%s: the counter did not continue from A's state: A read %d, then %d and %d", what, before, a, b)
	}
}

// TestCRIRestoreFromRegistry: host A (an smx state directory, no
// containerd) runs a sandbox whose counter loop ticks, snapshots it and
// pushes it to a registry on loopback; then a containerd whose state
// directory never saw any of it runs a pod annotated io.smx.from-snapshot
// with that reference, through the CRI plugin as the kubelet would. The
// pod's VM is restored, not booted: its app container, in the restored
// guest, sees the file written on A and the counter going on from where
// A left it. A second pod of the same reference, and a stand-alone task
// (ctr run), are restored from the node's copy (no blob fetched again);
// two pods at once of an artifact the node lacks pull it once. A reference outside the node's
// pod_restore_from, one signed by a key pod_restore_keys does not list
// (though the node's trusted-log-keys does), and the
// node's copy once the node no longer lists its signer are refused at
// RunPodSandbox with the shim's line, nothing pulled, stored or started.
func TestCRIRestoreFromRegistry(t *testing.T) {
	w := pushWarm(t)
	reg, host, ref, strangerRef, keyA, before := w.reg, w.host, w.ref, w.strangerRef, w.key, w.before

	// Node B: its own containerd and state directory, admitting the
	// registry's agents/ repositories signed by A.
	n, crictl := startCRINode(t)
	settings := fmt.Sprintf("pod_restore_from: [%s/agents]\npod_restore_keys: [%q]\n", host, keyA)
	if err := os.WriteFile(filepath.Join(n.home, shim.ConfigFile), []byte(settings), 0o644); err != nil {
		t.Fatal(err)
	}
	pod := func(name, from string, more ...string) string {
		ann := obj{shim.FromSnapshotAnnotation: from}
		for i := 0; i+1 < len(more); i += 2 {
			ann[more[i]] = more[i+1]
		}
		return writeJSON(t, filepath.Join(n.dir, name+".json"), obj{
			"metadata":      obj{"name": name, "namespace": "team-a", "uid": "uid-" + name, "attempt": 0},
			"annotations":   ann,
			"log_directory": filepath.Join(n.dir, "podlogs-"+name),
			"linux":         obj{"security_context": obj{"namespace_options": obj{"network": 2}}},
		})
	}
	// The app container reads what the restored guest holds: the file
	// written on A, and the counter twice, two seconds apart.
	ctrCfg := writeJSON(t, filepath.Join(n.dir, "ctr.json"), obj{
		"metadata": obj{"name": "app"},
		"image":    obj{"image": appImage},
		"command":  []string{"sh", "-c", readCounts + "; exec sleep 1000"},
		"log_path": "app.log",
		"linux":    obj{},
	})
	// runPod runs a pod from ref and its app container, which must see
	// A's state going on.
	runPod := func(name string, more ...string) (podID string) {
		t.Helper()
		t0 := time.Now()
		cfg := pod(name, ref, more...)
		podID, err := crictl("runp", "--runtime", "smx", cfg)
		if err != nil {
			t.Fatalf("crictl runp %s: %v\n%s", name, err, podID)
		}
		t.Logf("crictl runp %s (pull and restore): %v", name, time.Since(t0).Round(time.Millisecond))
		cid, err := crictl("create", podID, ctrCfg, cfg)
		if err != nil {
			t.Fatalf("crictl create: %v\n%s", err, cid)
		}
		if out, err := crictl("start", cid); err != nil {
			t.Fatalf("crictl start: %v\n%s", err, out)
		}
		var logs string
		for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(300 * time.Millisecond) {
			logs, _ = crictl("logs", cid)
			if countsRE.MatchString(logs) {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("crictl logs: no counts after 2 minutes: %q", logs)
			}
		}
		checkCounts(t, "pod "+name, logs, before)
		return podID
	}
	removePod := func(podID string) {
		t.Helper()
		for _, args := range [][]string{{"stopp", podID}, {"rmp", podID}} {
			if out, err := crictl(args...); err != nil {
				t.Fatalf("crictl %v: %v\n%s", args, err, out)
			}
		}
	}

	blobs0 := reg.blobs.Load()
	// Restored, not booted: the counter is A's, past the value A read
	// before the snapshot, and it goes on.
	pod1 := runPod("first")
	if q := n.count("qemu-system"); q != 1 {
		t.Fatalf("the pod runs %d QEMU, want 1:\n%s", q, strings.Join(n.leftovers(), "\n"))
	}
	pulled := reg.blobs.Load() - blobs0
	if pulled == 0 {
		t.Fatal("the first pod fetched no blob")
	}
	// The pod's sandbox's log names where its state came from.
	ls, _ := n.smx("agent", "ls")
	name := ""
	for _, f := range strings.Fields(ls) {
		if strings.HasPrefix(f, "k8s-team-a-first-") {
			name = f
		}
	}
	if name == "" {
		t.Fatalf("no sandbox for pod first:\n%s", ls)
	}
	logs, err := n.smx("agent", "logs", name, "--json")
	if err != nil || !strings.Contains(logs, `"origin_ref":"`+host+`/agents/warm@sha256:`) || !strings.Contains(logs, `"origin_log_hash"`) {
		t.Fatalf("smx agent logs %s: %v: no origin recorded\n%s", name, err, logs)
	}
	removePod(pod1)
	n.awaitGone(t, "after the first pod")

	// A second pod of the same reference: the node's copy, no blob again.
	blobs1 := reg.blobs.Load()
	// It names a profile: the node's choice holds for a restored pod as
	// for a booted one, the snapshot's frozen profile recorded beside it.
	pod2 := runPod("second", shim.ProfileAnnotation, "dev")
	ls, _ = n.smx("agent", "ls")
	name = ""
	for _, f := range strings.Fields(ls) {
		if strings.HasPrefix(f, "k8s-team-a-second-") {
			name = f
		}
	}
	logs, err = n.smx("agent", "logs", name, "--json")
	if err != nil || !strings.Contains(logs, `"profile":"dev"`) || !strings.Contains(logs, `"snapshot_profile":"locked"`) {
		t.Fatalf("smx agent logs %s: %v: want profile dev, snapshot_profile locked\n%s", name, err, logs)
	}
	if got := reg.blobs.Load() - blobs1; got != 0 {
		t.Fatalf("the second pod of the same reference fetched %d blobs again (the first %d)", got, pulled)
	}
	removePod(pod2)
	n.awaitGone(t, "after the second pod")

	// A stand-alone task (ctr run, no pod) is restored the same way, from
	// the node's copy: its process runs in the restored guest.
	out, err := n.ctrNS("k8s.io", "run", "--rm", "--runtime", shim.RuntimeName,
		"--annotation", shim.FromSnapshotAnnotation+"="+ref, appImage, "restored-task", "sh", "-c", readCounts)
	if err != nil {
		t.Fatalf("ctr run --annotation %s: %v\n%s", shim.FromSnapshotAnnotation, err, out)
	}
	checkCounts(t, "ctr run", out, before)
	if got := reg.blobs.Load() - blobs1; got != 0 {
		t.Fatalf("the stand-alone task fetched %d blobs again", got)
	}
	n.awaitGone(t, "after the stand-alone task")

	snaps := func() string {
		ents, _ := os.ReadDir(filepath.Join(n.home, "snapshots"))
		var names []string
		for _, e := range ents {
			if !strings.HasPrefix(e.Name(), ".") {
				names = append(names, e.Name())
			}
		}
		return strings.Join(names, " ")
	}
	kept := snaps()
	if len(strings.Fields(kept)) != 1 {
		t.Fatalf("node B holds snapshots %q, want the one pulled", kept)
	}

	// Two pods of an artifact the node does not hold, at once: one pull
	// (the other pod waits for it), both restored.
	if out, err := n.smx("snapshot", "rm", kept); err != nil {
		t.Fatalf("smx snapshot rm %s: %v\n%s", kept, err, out)
	}
	blobs2 := reg.blobs.Load()
	var wg sync.WaitGroup
	pods := make([]string, 2)
	errs := make([]error, 2)
	for i := range pods {
		wg.Add(1)
		go func() {
			defer wg.Done()
			pods[i], errs[i] = crictl("runp", "--runtime", "smx", pod(fmt.Sprintf("both-%d", i), ref))
		}()
	}
	wg.Wait()
	for i := range pods {
		if errs[i] != nil {
			t.Fatalf("crictl runp of two pods at once: %v\n%s", errs[i], pods[i])
		}
	}
	if q := n.count("qemu-system"); q != 2 {
		t.Fatalf("two pods run %d QEMU, want 2:\n%s", q, strings.Join(n.leftovers(), "\n"))
	}
	if got := reg.blobs.Load() - blobs2; got != pulled {
		t.Fatalf("two pods at once fetched %d blobs, one pull fetches %d", got, pulled)
	}
	for _, p := range pods {
		removePod(p)
	}
	n.awaitGone(t, "after two pods at once")
	if now := snaps(); now != kept {
		t.Fatalf("node B holds snapshots %q, want %q", now, kept)
	}

	// Refusals: nothing pulled, stored or started.
	refused := func(what, from, want string) {
		t.Helper()
		n.refusedRunp(t, reg, crictl, what, pod("refused", from), want, "snapshots", snaps)
	}
	refused("a repository outside pod_restore_from", host+"/other/warm:1",
		`annotation io.smx.from-snapshot="`+host+`/other/warm:1": this node lets pods restore only from `+host+`/agents`)
	refused("a prefix's sibling", host+"/agents-b/warm:1", `to pod_restore_from in `+filepath.Join(n.home, shim.ConfigFile))
	// The node's own trusted-log-keys (what `smx snapshot pull` on the
	// node trusts) lists the stranger: pods still trust pod_restore_keys
	// alone.
	pinned := filepath.Join(n.dir, "config", "smx", "trusted-log-keys")
	os.MkdirAll(filepath.Dir(pinned), 0o700)
	f, err := os.OpenFile(pinned, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(f, "stranger %s\n", w.strangerPub)
	f.Close()
	refused("signed by a key the node does not list", strangerRef, "is signed by stranger+")
	// The node withdraws A's key: its copy of A's artifact is refused too.
	_, other, _ := note.GenerateKey(rand.Reader, "other")
	settings = fmt.Sprintf("pod_restore_from: [%s/agents]\npod_restore_keys: [%q]\n", host, other)
	if err := os.WriteFile(filepath.Join(n.home, shim.ConfigFile), []byte(settings), 0o644); err != nil {
		t.Fatal(err)
	}
	refused("A's key withdrawn, the node's copy kept", ref, "which pod_restore_keys in "+filepath.Join(n.home, shim.ConfigFile)+" no longer lists")
}

// BenchmarkPodRestore is a pod's start through the CRI plugin, as the
// kubelet drives it (runp, then create and start of a container running
// `true`, until it exited), four ways, interleaved so that all see the
// same load: restored from host A's artifact with the node's copy at hand
// (restore); restored after removing the node's copy (pull+restore: the
// artifact fetched and checked again); booted from its image as any pod,
// from the boot template an earlier pod saved (boot); and booted with the
// node's boot templates removed first (cold). It reports each way's
// seconds per pod and the restore ways' ratios to both boots.
func BenchmarkPodRestore(b *testing.B) {
	w := pushWarm(b)
	n, crictl := startCRINode(b)
	settings := fmt.Sprintf("pod_restore_from: [%s/agents]\npod_restore_keys: [%q]\n", w.host, w.key)
	if err := os.WriteFile(filepath.Join(n.home, shim.ConfigFile), []byte(settings), 0o644); err != nil {
		b.Fatal(err)
	}
	i := 0
	cycle := func(from string) time.Duration {
		i++
		ann := obj{}
		if from != "" {
			ann[shim.FromSnapshotAnnotation] = from
		}
		podCfg, ctrCfg := n.benchConfigs(b, i, ann)
		t0 := time.Now()
		pod, err := crictl("runp", "--runtime", "smx", podCfg)
		if err != nil {
			b.Fatalf("crictl runp: %v\n%s", err, pod)
		}
		cid, err := crictl("create", pod, ctrCfg, podCfg)
		if err != nil {
			b.Fatalf("crictl create: %v\n%s", err, cid)
		}
		if out, err := crictl("start", cid); err != nil {
			b.Fatalf("crictl start: %v\n%s", err, out)
		}
		for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(50 * time.Millisecond) {
			st, _ := crictl("inspect", "-o", "go-template", "--template", "{{.status.state}}", cid)
			if st == "CONTAINER_EXITED" {
				break
			}
			if time.Now().After(deadline) {
				b.Fatalf("container %s not exited after 2 minutes: %q", cid, st)
			}
		}
		d := time.Since(t0)
		for _, args := range [][]string{{"stopp", pod}, {"rmp", pod}} {
			if out, err := crictl(args...); err != nil {
				b.Fatalf("crictl %v: %v\n%s", args, err, out)
			}
		}
		return d
	}
	dropCopy := func() {
		ls, _ := n.smx("snapshot", "ls")
		for _, f := range strings.Fields(ls) {
			if strings.HasPrefix(f, "pulled-") {
				if out, err := n.smx("snapshot", "rm", f); err != nil {
					b.Fatalf("smx snapshot rm %s: %v\n%s", f, err, out)
				}
			}
		}
	}
	// Untimed: the pause image's import and the boot template, and the
	// node's copy.
	cycle("")
	cycle(w.ref)
	var restore, pull, boot, cold time.Duration
	runs := 0
	for b.Loop() {
		restore += cycle(w.ref)
		b.StopTimer()
		dropCopy()
		b.StartTimer()
		pull += cycle(w.ref)
		boot += cycle("")
		b.StopTimer()
		if out, err := n.smx("template", "rm", "--all"); err != nil {
			b.Fatalf("smx template rm --all: %v\n%s", err, out)
		}
		b.StartTimer()
		cold += cycle("")
		runs++
	}
	per := func(d time.Duration) float64 { return d.Seconds() / float64(runs) }
	b.ReportMetric(per(restore), "restore-s/pod")
	b.ReportMetric(per(pull), "pull+restore-s/pod")
	b.ReportMetric(per(boot), "boot-s/pod")
	b.ReportMetric(per(cold), "cold-s/pod")
	b.ReportMetric(restore.Seconds()/boot.Seconds(), "restore/boot")
	b.ReportMetric(pull.Seconds()/boot.Seconds(), "pull+restore/boot")
	b.ReportMetric(restore.Seconds()/cold.Seconds(), "restore/cold")
	b.ReportMetric(pull.Seconds()/cold.Seconds(), "pull+restore/cold")
}

// refusedRunp runs a pod sandbox of config cfg that node n must refuse,
// saying want, and checks that nothing was fetched from reg, that what
// stored() lists of the node's copies (of kind) did not change, and that
// nothing started.
func (n *node) refusedRunp(t *testing.T, reg *countingRegistry, crictl func(args ...string) (string, error), what, cfg, want, kind string, stored func() string) {
	t.Helper()
	blobs := reg.blobs.Load()
	was := stored()
	out, err := crictl("runp", "--runtime", "smx", cfg)
	out = strings.ReplaceAll(out, `\"`, `"`)
	if err == nil || !strings.Contains(out, want) {
		t.Fatalf("%s: crictl runp: %v\n%s\nwant %q", what, err, out, want)
	}
	t.Logf("%s: refused: %s", what, grepLines(out, "smx shim"))
	if got := reg.blobs.Load() - blobs; got != 0 {
		t.Errorf("%s: %d blobs fetched", what, got)
	}
	if now := stored(); now != was {
		t.Errorf("%s: node's %s are %q, were %q", what, kind, now, was)
	}
	if ls, _ := n.smx("agent", "ls"); strings.Contains(ls, "k8s-") {
		t.Errorf("%s: node has sandboxes:\n%s", what, ls)
	}
	n.awaitGone(t, what)
}
