package shim_test

import (
	"crypto/rand"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/registry"
	"golang.org/x/mod/sumdb/note"

	"github.com/smx-dev/smx/internal/shim"
)

// podTemplate is node A's side of the template tests: a registry on
// loopback holding the boot template of a CRI pod's shape, pushed by node
// A (a containerd and an smx state directory of its own, whose pod's
// first start saved it) under ref signed by A's log key, and under
// strangerRef signed by a key nobody trusts. A's pod is removed.
type podTemplate struct {
	reg              *countingRegistry
	host             string // the registry's host:port
	ref, strangerRef string
	tpl              string // the template's name
	key              string // A's log key, as `smx logs export-key` prints it
}

// podConfig writes a CRI pod config of pod name in namespace team-a,
// host network, with annotations ann, into n's directory.
func podConfig(t testing.TB, n *node, name string, ann obj) string {
	return writeJSON(t, filepath.Join(n.dir, name+".json"), obj{
		"metadata":      obj{"name": name, "namespace": "team-a", "uid": "uid-" + name, "attempt": 0},
		"annotations":   ann,
		"log_directory": filepath.Join(n.dir, "podlogs-"+name),
		"linux":         obj{"security_context": obj{"namespace_options": obj{"network": 2}}},
	})
}

func pushPodTemplate(t testing.TB) *podTemplate {
	t.Helper()
	reg := &countingRegistry{reg: registry.New(registry.Logger(log.New(io.Discard, "", 0)))}
	srv := httptest.NewServer(reg)
	t.Cleanup(srv.Close)
	host := strings.TrimPrefix(srv.URL, "http://")
	p := &podTemplate{reg: reg, host: host, ref: host + "/templates/pause:1", strangerRef: host + "/templates/pause:stranger"}

	// A pod of the shape other nodes' pods have (the CRI plugin's pause
	// image, the shim's machine, the pod share), whose first start boots
	// cold and saves the template.
	a, crictlA := startCRINode(t)
	t0 := time.Now()
	podA, err := crictlA("runp", "--runtime", "smx", podConfig(t, a, "builder", obj{}))
	if err != nil {
		t.Fatalf("node A: crictl runp: %v\n%s", err, podA)
	}
	t.Logf("node A: crictl runp (cold boot, template saved): %v", time.Since(t0).Round(time.Millisecond))
	var tpls []struct {
		Name string `json:"name"`
	}
	out, err := a.smx("template", "ls", "--json")
	if err := json.Unmarshal([]byte(out), &tpls); err != nil || len(tpls) != 1 {
		t.Fatalf("node A: smx template ls: %v: want the pod's one template\n%s", err, out)
	}
	p.tpl = tpls[0].Name
	if out, err := a.smx("template", "push", p.tpl, p.ref); err != nil {
		t.Fatalf("node A: smx template push: %v\n%s", err, out)
	}
	skey, _, err := note.GenerateKey(rand.Reader, "stranger")
	if err != nil {
		t.Fatal(err)
	}
	strangerKey := filepath.Join(a.dir, "stranger.key")
	os.WriteFile(strangerKey, []byte(skey+"\n"), 0o600)
	if out, err := a.smx("template", "push", p.tpl, p.strangerRef, "--sign-key", strangerKey); err != nil {
		t.Fatalf("node A: smx template push --sign-key: %v\n%s", err, out)
	}
	key, err := a.smx("logs", "export-key")
	if err != nil {
		t.Fatalf("node A: smx logs export-key: %v\n%s", err, key)
	}
	p.key = strings.TrimSpace(key)
	for _, args := range [][]string{{"stopp", podA}, {"rmp", podA}} {
		if out, err := crictlA(args...); err != nil {
			t.Fatalf("node A: crictl %v: %v\n%s", args, err, out)
		}
	}
	a.awaitGone(t, "node A's pod")
	return p
}

// sandboxOf is the name of the sandbox of pod (namespace team-a) on n.
func sandboxOf(t testing.TB, n *node, pod string) string {
	t.Helper()
	ls, _ := n.smx("agent", "ls")
	for _, f := range strings.Fields(ls) {
		if strings.HasPrefix(f, "k8s-team-a-"+pod+"-") {
			return f
		}
	}
	t.Fatalf("no sandbox for pod %s:\n%s", pod, ls)
	return ""
}

// TestCRIPodFromTemplate: node A (a containerd and an smx state
// directory of its own) runs a pod, whose first start saves a boot
// template for its shape, and pushes that template to a registry on
// loopback, signed by A's log key (and once more signed by a stranger).
// Node B, a second containerd whose state directory never saw any of it,
// runs pods annotated io.smx.from-template with that reference, through
// the CRI plugin as the kubelet would: the shim pulls the template,
// checked against B's pod_restore_keys, and boots the pod the normal way,
// whose first start restores the template instead of booting cold (its
// sandbox.start record says restored_from template ...), while its app
// container runs in its own image's root. A second pod pulls nothing
// again (only the signed meta is read, to check its signer). A
// reference outside pod_restore_from and a stranger-signed template are
// refused at RunPodSandbox, nothing fetched, stored or started, and a
// task of another image than the template's before it boots; a task of
// the template's image but another machine shape boots cold, and the
// shim's log says so.
func TestCRIPodFromTemplate(t *testing.T) {
	p := pushPodTemplate(t)
	reg, host, ref, strangerRef, tpl := p.reg, p.host, p.ref, p.strangerRef, p.tpl
	podCfg := func(n *node, name string, ann obj) string { return podConfig(t, n, name, ann) }
	removePod := func(crictl func(...string) (string, error), podID string) {
		t.Helper()
		for _, args := range [][]string{{"stopp", podID}, {"rmp", podID}} {
			if out, err := crictl(args...); err != nil {
				t.Fatalf("crictl %v: %v\n%s", args, err, out)
			}
		}
	}

	// Node B admits the registry's templates/ repositories signed by A.
	b, crictl := startCRINode(t)
	settings := fmt.Sprintf("pod_restore_from: [%s/templates]\npod_restore_keys: [%q]\n", host, p.key)
	if err := os.WriteFile(filepath.Join(b.home, shim.ConfigFile), []byte(settings), 0o644); err != nil {
		t.Fatal(err)
	}
	templates := func() string {
		ents, _ := os.ReadDir(filepath.Join(b.home, "templates"))
		var names []string
		for _, e := range ents {
			if !strings.HasPrefix(e.Name(), ".") {
				names = append(names, e.Name())
			}
		}
		return strings.Join(names, " ")
	}
	// The app container reads its own image's root: the pod keeps it.
	ctrCfg := writeJSON(t, filepath.Join(b.dir, "ctr.json"), obj{
		"metadata": obj{"name": "app"},
		"image":    obj{"image": appImage},
		"command":  []string{"sh", "-c", "echo marker $(cat /app-marker); exec sleep 1000"},
		"log_path": "app.log",
		"linux":    obj{},
	})
	runPod := func(name string) (podID string) {
		t.Helper()
		t0 := time.Now()
		cfg := podCfg(b, name, obj{shim.FromTemplateAnnotation: ref})
		podID, err := crictl("runp", "--runtime", "smx", cfg)
		if err != nil {
			t.Fatalf("crictl runp %s: %v\n%s", name, err, podID)
		}
		t.Logf("crictl runp %s (pull and start): %v", name, time.Since(t0).Round(time.Millisecond))
		cid, err := crictl("create", podID, ctrCfg, cfg)
		if err != nil {
			t.Fatalf("crictl create: %v\n%s", err, cid)
		}
		if out, err := crictl("start", cid); err != nil {
			t.Fatalf("crictl start: %v\n%s", err, out)
		}
		for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(300 * time.Millisecond) {
			logs, _ := crictl("logs", cid)
			if strings.Contains(logs, "marker app-root") {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("crictl logs: the app container did not run in its image's root: %q", logs)
			}
		}
		// Started from the pulled template, not booted cold.
		sb := sandboxOf(t, b, name)
		logs, err := b.smx("agent", "logs", sb, "--json")
		if err != nil || !strings.Contains(logs, `"restored_from":"template `+tpl+`"`) {
			t.Fatalf("smx agent logs %s: %v: its start did not restore template %s\n%s", sb, err, tpl, logs)
		}
		return podID
	}

	blobs0 := reg.blobs.Load()
	pod1 := runPod("first")
	pulled := reg.blobs.Load() - blobs0
	if pulled < 3 {
		t.Fatalf("the first pod fetched %d blobs, want the template's layers", pulled)
	}
	if got := templates(); got != tpl {
		t.Fatalf("node B holds templates %q, want %q", got, tpl)
	}
	// A second pod: the node's template, only its signed meta read again
	// (its signer checked against the node's keys as they are now).
	blobs1 := reg.blobs.Load()
	pod2 := runPod("second")
	if got := reg.blobs.Load() - blobs1; got > 1 {
		t.Fatalf("the second pod fetched %d blobs (the first %d): want at most the signed meta", got, pulled)
	}
	if q := b.count("qemu-system"); q != 2 {
		t.Fatalf("two pods run %d QEMU, want 2:\n%s", q, strings.Join(b.leftovers(), "\n"))
	}
	removePod(crictl, pod1)
	removePod(crictl, pod2)
	b.awaitGone(t, "after the pods")

	// Refusals: nothing fetched, stored or started.
	refused := func(what string, ann obj, want string) {
		t.Helper()
		b.refusedRunp(t, reg, crictl, what, podCfg(b, "refused", ann), want, "templates", templates)
	}
	refused("a repository outside pod_restore_from", obj{shim.FromTemplateAnnotation: host + "/other/pause:1"},
		`annotation io.smx.from-template="`+host+`/other/pause:1": this node lets pods restore only from `+host+`/templates`)
	refused("a template signed by a key the node does not list", obj{shim.FromTemplateAnnotation: strangerRef}, "is signed by stranger+")
	refused("a snapshot and a template at once", obj{shim.FromTemplateAnnotation: ref, shim.FromSnapshotAnnotation: ref}, "not both")

	// A task whose image is not the template's could only boot cold: a
	// stand-alone task of the app image is refused before it boots.
	out, err := b.ctrNS("k8s.io", "run", "--rm", "--runtime", shim.RuntimeName,
		"--annotation", shim.FromTemplateAnnotation+"="+ref, appImage, "other-image", "true")
	if err == nil || !strings.Contains(out, "template "+tpl+" serves the image of digest") {
		t.Fatalf("ctr run of another image from the template: %v\n%s", err, out)
	}
	t.Logf("another image: refused: %s", grepLines(out, "smx shim"))
	if ls, _ := b.smx("agent", "ls"); strings.Contains(ls, "ctr-") || strings.Contains(ls, "other-image") {
		t.Errorf("another image: node B has sandboxes:\n%s", ls)
	}
	b.awaitGone(t, "another image")

	// A task of the template's image whose machine is not the template's
	// (a stand-alone task has no pod share, so its guest's command line
	// differs) boots cold: it runs, and the shim says why it was not warm.
	out, err = b.ctrNS("k8s.io", "run", "--rm", "--runtime", shim.RuntimeName,
		"--annotation", shim.FromTemplateAnnotation+"="+ref, pauseImage, "other-shape", "echo", "ran-cold")
	if err != nil || !strings.Contains(out, "ran-cold") {
		t.Fatalf("ctr run of another shape from the template: %v\n%s", err, out)
	}
	clog, _ := os.ReadFile(filepath.Join(b.dir, "containerd.log"))
	if !strings.Contains(string(clog), "booted cold") || !strings.Contains(string(clog), "not from template "+tpl) {
		t.Fatalf("another shape: the shim's log does not say the task booted cold:\n%s", grepLines(string(clog), "smx shim"))
	}
	t.Logf("another shape: %s", grepLines(string(clog), "booted cold"))
	b.awaitGone(t, "another shape")
}
