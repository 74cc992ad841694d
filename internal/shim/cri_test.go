package shim_test

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/smx-dev/smx/internal/shim"
	"github.com/smx-dev/smx/internal/testutil"
)

// pauseImage is the pod sandbox image of the CRI tests: busybox sleeping,
// built by the test (nothing is pulled).
const pauseImage = "smx.test/pause:1"

// criConfig enables containerd's CRI plugin with runtime handler smx, the
// test's pause image, no CNI (host-network pods only) and a stream server
// on a free loopback port.
const criConfig = `
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "` + pauseImage + `"
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  # This machine's root lacks CAP_SYS_RESOURCE: runc could not lower a pod
  # sandbox's oom_score_adj (its init died: "can't get final child's PID
  # from pipe").
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "NODEDIR/cni/bin"
    conf_dir = "NODEDIR/cni/conf"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.smx]
      runtime_type = "` + shim.RuntimeName + `"
      pod_annotations = ["` + shim.ProfileAnnotation + `", "` + shim.FromSnapshotAnnotation + `", "` + shim.FromTemplateAnnotation + `"]
      container_annotations = ["` + shim.ProfileAnnotation + `"]
    # A handler whose node settings admit no profile but locked.
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.smx-locked]
      runtime_type = "` + shim.RuntimeName + `"
      pod_annotations = ["` + shim.ProfileAnnotation + `"]
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.smx-locked.options]
        ConfigPath = "NODEDIR/pods-locked.yaml"
`

// crictlBinary is $SMX_TEST_CRICTL, else crictl on PATH.
func crictlBinary(t testing.TB) string {
	if p := os.Getenv("SMX_TEST_CRICTL"); p != "" {
		return p
	}
	p, err := exec.LookPath("crictl")
	testutil.Require(t, err == nil, "crictl", "go install sigs.k8s.io/cri-tools/cmd/crictl@v1.34.0 (or run scripts/test.sh)")
	return p
}

// startCRINode is startCRIContainerd with crictl against it.
func startCRINode(t testing.TB) (*node, func(args ...string) (string, error)) {
	crictl := crictlBinary(t)
	n := startCRIContainerd(t)
	ep := "unix://" + n.sock
	conf := "runtime-endpoint: " + ep + "\nimage-endpoint: " + ep + "\ntimeout: 180\n"
	if err := os.WriteFile(filepath.Join(n.dir, "crictl.yaml"), []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	run := func(args ...string) (string, error) {
		cmd := exec.Command(crictl, append([]string{"--config", filepath.Join(n.dir, "crictl.yaml")}, args...)...)
		cmd.Env = n.env
		var stderr strings.Builder
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			return strings.TrimSpace(string(out) + "\n" + stderr.String()), err
		}
		return strings.TrimSpace(string(out)), nil
	}
	t.Cleanup(func() {
		// Whatever a failed test left, before containerd stops.
		out, _ := run("pods", "-q")
		for _, id := range strings.Fields(out) {
			run("stopp", id)
			run("rmp", "-f", id)
		}
	})
	// The CRI plugin comes up after containerd answers.
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(300 * time.Millisecond) {
		if _, err := run("info"); err == nil {
			break
		}
		if time.Now().After(deadline) {
			out, err := run("info")
			t.Fatalf("crictl info: %v\n%s", err, out)
		}
	}
	return n, run
}

// startCRIContainerd is a node with the CRI plugin and the test's pause
// and app images in its k8s.io namespace.
func startCRIContainerd(t testing.TB) *node {
	n := startNodeWith(t, criConfig)
	for _, img := range []struct {
		ref   string
		files map[string]string
		cmd   []string
	}{
		// The mount points, as in any image docker built: the CRI plugin
		// makes a sandbox's root read-only, where runc cannot make them.
		{pauseImage, map[string]string{"proc/": "", "sys/": "", "dev/": ""}, []string{"sleep", "2147483647"}},
		{appImage, map[string]string{"app-marker": "app-root\n", "proc/": "", "sys/": "", "dev/": ""}, nil},
	} {
		archive := filepath.Join(n.dir, strings.NewReplacer("/", "-", ":", "-").Replace(img.ref)+".tar")
		imageArchive(t, archive, img.ref, img.files, img.cmd...)
		if out, err := n.ctrNS("k8s.io", "image", "import", archive); err != nil {
			t.Fatalf("ctr image import %s: %v\n%s", img.ref, err, out)
		}
	}
	return n
}

// benchConfigs writes the configs of benchmark pod i, host network and
// the pod annotations ann (none when nil), and of its container, which
// runs true; it returns their files.
func (n *node) benchConfigs(b *testing.B, i int, ann obj) (pod, ctr string) {
	b.Helper()
	sandbox := obj{
		"metadata":      obj{"name": fmt.Sprintf("bench-%d", i), "namespace": "bench", "uid": fmt.Sprintf("uid-%d", i)},
		"log_directory": filepath.Join(n.dir, "podlogs", fmt.Sprint(i)),
		"linux":         obj{"security_context": obj{"namespace_options": obj{"network": 2}}},
	}
	if ann != nil {
		sandbox["annotations"] = ann
	}
	pod = writeJSON(b, filepath.Join(n.dir, "bench-pod.json"), sandbox)
	ctr = writeJSON(b, filepath.Join(n.dir, "bench-ctr.json"), obj{
		"metadata": obj{"name": "app"}, "image": obj{"image": appImage},
		"command": []string{"true"}, "log_path": "app.log", "linux": obj{},
	})
	return pod, ctr
}

func writeJSON(t testing.TB, file string, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(file, b, 0o644); err != nil {
		t.Fatal(err)
	}
	return file
}

type obj = map[string]any

// TestCRI drives the runtime through containerd's CRI plugin with crictl,
// as the kubelet would: a host-network pod (this machine has no CNI) with
// runtime handler smx, one app container in it (create, start, logs,
// exec, stop, rm), then the pod's removal. The pod is one smx VM whose
// signed log records the container's command.
func TestCRI(t *testing.T) {
	n, crictl := startCRINode(t)
	podCfg := writeJSON(t, filepath.Join(n.dir, "pod.json"), obj{
		"metadata":      obj{"name": "web", "namespace": "team-a", "uid": "uid-web-1", "attempt": 0},
		"log_directory": filepath.Join(n.dir, "podlogs"),
		"linux":         obj{"security_context": obj{"namespace_options": obj{"network": 2}}}, // NODE
	})
	ctrCfg := writeJSON(t, filepath.Join(n.dir, "ctr.json"), obj{
		"metadata": obj{"name": "app"},
		"image":    obj{"image": appImage},
		"command":  []string{"sh", "-c", "echo hello-from-pod; id -u; cat /app-marker; exec sleep 1000"},
		"envs":     []obj{{"key": "GREETING", "value": "hi"}},
		"log_path": "app.log",
		"linux":    obj{"security_context": obj{"run_as_user": obj{"value": 65534}}},
	})

	t0 := time.Now()
	pod, err := crictl("runp", "--runtime", "smx", podCfg)
	if err != nil {
		t.Fatalf("crictl runp: %v\n%s", err, pod)
	}
	t.Logf("crictl runp: %v", time.Since(t0).Round(time.Millisecond))
	cid, err := crictl("create", pod, ctrCfg, podCfg)
	if err != nil {
		t.Fatalf("crictl create: %v\n%s", err, cid)
	}
	if out, err := crictl("start", cid); err != nil {
		t.Fatalf("crictl start: %v\n%s", err, out)
	}
	t.Logf("pod to container started: %v", time.Since(t0).Round(time.Millisecond))

	var logs string
	for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(300 * time.Millisecond) {
		logs, _ = crictl("logs", cid)
		if strings.Contains(logs, "app-root") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("crictl logs: no output after 2 minutes: %q", logs)
		}
	}
	if logs != "hello-from-pod\n65534\napp-root" {
		t.Fatalf("crictl logs: %q, want the command's output as user 65534", logs)
	}
	out, err := crictl("exec", "-s", cid, "sh", "-c", "echo $GREETING; cat /app-marker")
	if err != nil || out != "hi\napp-root" {
		t.Fatalf("crictl exec: %v: %q", err, out)
	}
	if q, sh := n.count("qemu-system"), n.count("containerd-shim-smx-v1"); q != 1 || sh != 1 {
		t.Fatalf("the pod runs %d QEMU and %d shims, want 1 and 1:\n%s", q, sh, strings.Join(n.leftovers(), "\n"))
	}

	// The pod is one smx sandbox, named after it, whose signed log
	// records the container's command.
	ls, err := n.smx("agent", "ls")
	if err != nil {
		t.Fatalf("smx agent ls: %v\n%s", err, ls)
	}
	var name string
	sandboxes := 0
	for _, l := range strings.Split(ls, "\n")[1:] {
		if f := strings.Fields(l); len(f) > 0 {
			sandboxes++
			if strings.HasPrefix(f[0], "k8s-team-a-web-") {
				name = f[0]
			}
		}
	}
	if name == "" || sandboxes != 1 {
		t.Fatalf("smx agent ls: want one sandbox, k8s-team-a-web-*:\n%s", ls)
	}

	if out, err := crictl("stop", "-t", "5", cid); err != nil {
		t.Fatalf("crictl stop: %v\n%s", err, out)
	}
	if out, err := crictl("rm", cid); err != nil {
		t.Fatalf("crictl rm: %v\n%s", err, out)
	}
	if out, err := crictl("stopp", pod); err != nil {
		t.Fatalf("crictl stopp: %v\n%s", err, out)
	}
	if out, err := crictl("rmp", pod); err != nil {
		t.Fatalf("crictl rmp: %v\n%s", err, out)
	}
	logRecords, err := n.smx("agent", "logs", name)
	if err != nil || !strings.Contains(logRecords, "hello-from-pod") || !strings.Contains(logRecords, "GREETING") {
		t.Fatalf("smx agent logs %s: %v\n%s", name, err, logRecords)
	}
	t.Logf("smx agent logs %s:\n%s", name, logRecords)
	if out, err := n.smx("agent", "logs", name, "--verify"); err != nil {
		t.Fatalf("smx agent logs --verify: %v\n%s", err, out)
	}

	n.awaitGone(t, "after rmp")

	// A pod that asks for a profile the node does not admit (open, by
	// default) fails RunPodSandbox with the shim's one line, which the
	// kubelet turns into the pod's FailedCreatePodSandBox event; nothing
	// is booted or left.
	openCfg := writeJSON(t, filepath.Join(n.dir, "pod-open.json"), obj{
		"metadata":      obj{"name": "wide", "namespace": "team-a", "uid": "uid-wide-1", "attempt": 0},
		"annotations":   obj{shim.ProfileAnnotation: "open"},
		"log_directory": filepath.Join(n.dir, "podlogs-open"),
		"linux":         obj{"security_context": obj{"namespace_options": obj{"network": 2}}},
	})
	out, err = crictl("runp", "--runtime", "smx", openCfg)
	out = strings.ReplaceAll(out, `\"`, `"`) // crictl quotes the error
	if err == nil || !strings.Contains(out, `annotation io.smx.profile="open": this node lets pods choose only locked, dev`) {
		t.Fatalf("crictl runp of a pod asking for open: %v\n%s", err, out)
	}
	t.Logf("refused: %s", grepLines(out, "smx shim"))
	// A runtime handler's options name other settings: under smx-locked
	// even dev is refused.
	if err := os.WriteFile(filepath.Join(n.dir, "pods-locked.yaml"), []byte("pod_profiles: []\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	devCfg := writeJSON(t, filepath.Join(n.dir, "pod-dev.json"), obj{
		"metadata":      obj{"name": "dev", "namespace": "team-a", "uid": "uid-dev-1", "attempt": 0},
		"annotations":   obj{shim.ProfileAnnotation: "dev"},
		"log_directory": filepath.Join(n.dir, "podlogs-dev"),
		"linux":         obj{"security_context": obj{"namespace_options": obj{"network": 2}}},
	})
	out, err = crictl("runp", "--runtime", "smx-locked", devCfg)
	out = strings.ReplaceAll(out, `\"`, `"`)
	if err == nil || !strings.Contains(out, `add "dev" to pod_profiles in `+filepath.Join(n.dir, "pods-locked.yaml")) {
		t.Fatalf("crictl runp --runtime smx-locked of a pod asking for dev: %v\n%s", err, out)
	}
	t.Logf("refused: %s", grepLines(out, "smx shim"))
	n.awaitGone(t, "after a refused runp")
}

// BenchmarkPodStart is a pod's whole life through the CRI plugin, as the
// kubelet drives it, with runtime handler smx and with runc side by side
// on one containerd: runp (host network), create and start of a container
// running `true`, its exit, stopp and rmp. start-s/op is the part from
// runp until start returned (the container running); the other metrics
// are its phases; pod/smx-run is the whole pod's life over the nearest
// smx peer's (below), run alternately with it.
func BenchmarkPodStart(b *testing.B) {
	n, crictl := startCRINode(b)
	i := 0
	// cycle is one pod's life; its phases: runp; create and start; until
	// the container exited; stopp and rmp.
	cycle := func(b *testing.B, rt string) (phases [4]time.Duration, err error) {
		i++
		podCfg, ctrCfg := n.benchConfigs(b, i, nil)
		t0 := time.Now()
		pod, err := crictl("runp", "--runtime", rt, podCfg)
		if err != nil {
			return phases, fmt.Errorf("crictl runp --runtime %s: %v\n%s", rt, err, pod)
		}
		t1 := time.Now()
		cid, err := crictl("create", pod, ctrCfg, podCfg)
		if err != nil {
			return phases, fmt.Errorf("crictl create: %v\n%s", err, cid)
		}
		if out, err := crictl("start", cid); err != nil {
			return phases, fmt.Errorf("crictl start: %v\n%s", err, out)
		}
		t2 := time.Now()
		for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(50 * time.Millisecond) {
			st, _ := crictl("inspect", "-o", "go-template", "--template", "{{.status.state}}", cid)
			if st == "CONTAINER_EXITED" {
				break
			}
			if time.Now().After(deadline) {
				return phases, fmt.Errorf("container %s not exited after 2 minutes: %q", cid, st)
			}
		}
		t3 := time.Now()
		for _, args := range [][]string{{"stopp", pod}, {"rmp", pod}} {
			if out, err := crictl(args...); err != nil {
				return phases, fmt.Errorf("crictl %v: %v\n%s", args, err, out)
			}
		}
		return [4]time.Duration{t1.Sub(t0), t2.Sub(t1), t3.Sub(t2), time.Since(t3)}, nil
	}
	// The nearest smx peer: `smx run` of the pod VM's image (the pause
	// image the shim imported, found once a pod ran), same profile, with a
	// folder mounted where the shim mounts the pod's share: boot, run
	// `true`, remove. It runs interleaved with the pods, so that both see
	// the same load on a shared machine.
	share := filepath.Join(n.dir, "bench-share")
	if err := os.MkdirAll(share, 0o700); err != nil {
		b.Fatal(err)
	}
	smxRun := func(b *testing.B) time.Duration {
		out, err := n.smx("image", "ls")
		img := ""
		for _, f := range strings.Fields(out) {
			if strings.HasPrefix(f, "ctr-") {
				img = f
			}
		}
		if err != nil || img == "" {
			b.Fatalf("no ctr- image: %v\n%s", err, out)
		}
		t0 := time.Now()
		if out, err := n.smx("run", "--image", img, "--profile", shim.DefaultProfile, "-v", share+":"+shim.PodShareGuest+":protect=off", "--", "true"); err != nil {
			b.Fatalf("smx run: %v\n%s", err, out)
		}
		return time.Since(t0)
	}
	for _, rt := range []string{"smx", "runc"} {
		b.Run("crictl-"+rt, func(b *testing.B) {
			// Untimed first runs: the pause image's import and the cold
			// boots that make the boot templates.
			if _, err := cycle(b, rt); err != nil {
				b.Fatal(err)
			}
			if rt == "smx" {
				smxRun(b)
			}
			var sum [4]time.Duration
			var run time.Duration
			runs := 0
			for b.Loop() {
				ph, err := cycle(b, rt)
				if err != nil {
					b.Fatal(err)
				}
				for j := range ph {
					sum[j] += ph[j]
				}
				runs++
				if rt == "smx" {
					b.StopTimer()
					run += smxRun(b)
					b.StartTimer()
				}
			}
			if os.Getenv("SMX_BENCH_DEBUG") != "" {
				ls, _ := n.smx("logs", "ls")
				for _, f := range strings.Fields(ls) {
					if strings.HasPrefix(f, "k8s-bench-") {
						l, _ := n.smx("agent", "logs", f)
						b.Logf("%s", grepLines(l, "sandbox.start"))
					}
				}
			}
			per := func(d time.Duration) float64 { return d.Seconds() / float64(runs) }
			total := sum[0] + sum[1] + sum[2] + sum[3]
			b.ReportMetric(per(sum[0]+sum[1]), "start-s/op")
			b.ReportMetric(per(sum[0]), "runp-s/op")
			b.ReportMetric(per(sum[1]), "create+start-s/op")
			b.ReportMetric(per(sum[2]), "exit-s/op")
			b.ReportMetric(per(sum[3]), "stopp+rmp-s/op")
			if rt == "smx" {
				b.ReportMetric(per(run), "smx-run-s/op")
				b.ReportMetric(total.Seconds()/run.Seconds(), "pod/smx-run")
			}
		})
	}
}
