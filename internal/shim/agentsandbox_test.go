package shim_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/smx-dev/smx/internal/testutil"
	"go.yaml.in/yaml/v3"
)

// agentSandboxManifest is the file of agent-sandbox resources this test
// applies: what the repository ships is what is tested.
const agentSandboxManifest = "../../deploy/kubernetes/agent-sandbox.yaml"

// TestClusterAgentSandbox runs kubernetes-sigs/agent-sandbox's controller
// on TestCluster's one-node cluster and applies the resources of
// deploy/kubernetes/agent-sandbox.yaml: the Sandbox must become a pod with
// runtimeClassName smx, running as exactly one smx VM whose signed log
// records its profile and command, and deleting the Sandbox must remove
// the pod and leave no QEMU or shim; the SandboxWarmPool (one replica
// here) must keep one such pod running, which the SandboxClaim then takes
// (the same VM, now its Sandbox's) while the pool boots another; deleting
// the claim and the pool must leave nothing. The project's CRDs come from
// its module as test/agent-sandbox/go.mod pins it (from the module
// cache), its controller from the cache beside $SMX_TEST_K8S_BIN
// ($SMX_TEST_AGENT_SANDBOX overrides; scripts/cluster-test.sh builds
// both). A kube-controller-manager running only its garbage collector
// removes what the controller made once its owner is deleted.
//
// What the test changes in the manifest's pod templates, for this cluster
// only: the image (the test's, nothing is pulled), the command (the
// manifest's, behind a shell that first prints a marker), host network
// and a toleration of every taint (no CNI: the node stays NotReady), and
// the warm pool's replicas (1, not 3).
func TestClusterAgentSandbox(t *testing.T) {
	k8s := clusterBinaries(t)
	if _, err := os.Stat(filepath.Join(k8s, "kube-controller-manager")); err != nil {
		t.Skipf("no kube-controller-manager in %s: scripts/cluster-test.sh --build builds it", k8s)
	}
	mod := agentSandboxModule(t)
	controller := os.Getenv("SMX_TEST_AGENT_SANDBOX")
	if controller == "" {
		controller = filepath.Join(filepath.Dir(k8s), "agent-sandbox-"+mod.Version)
	}
	controller = filepath.Join(controller, "agent-sandbox-controller")
	if _, err := os.Stat(controller); err != nil {
		t.Skipf("no %s: scripts/cluster-test.sh --build builds agent-sandbox %s's controller", controller, mod.Version)
	}
	manifest := map[string]obj{}
	for _, d := range yamlDocs(t, agentSandboxManifest) {
		manifest[fmt.Sprint(d["kind"])] = d
	}
	for _, kind := range []string{"Sandbox", "SandboxTemplate", "SandboxWarmPool", "SandboxClaim"} {
		if manifest[kind] == nil {
			t.Fatalf("%s has no %s", agentSandboxManifest, kind)
		}
	}

	c := startCluster(t, k8s)
	crds := c.installCRDs(t, filepath.Join(mod.Dir, "k8s", "crds"))
	t.Logf("agent-sandbox %s: CRDs %s established", mod.Version, strings.Join(crds, ", "))
	kcm := writeKubeconfig(t, c.dir, "controller-manager", c.server, c.pki)
	startProcess(t, c.dir, filepath.Join(k8s, "kube-controller-manager"), "--kubeconfig", kcm,
		"--authentication-kubeconfig", kcm, "--authorization-kubeconfig", kcm,
		"--bind-address", "127.0.0.1", "--secure-port", freePort(t), "--leader-elect=false",
		"--controllers", "garbagecollector")
	startProcess(t, c.dir, controller, "--kubeconfig", writeKubeconfig(t, c.dir, "agent-sandbox", c.server, c.pki),
		"--extensions", "--metrics-bind-address", "0", "--health-probe-bind-address", "0")

	// The Sandbox: the controller makes a pod of the same name (and a
	// headless Service); the kubelet runs it as one smx VM.
	sb := manifest["Sandbox"]
	name := fmt.Sprint(sb["metadata"].(obj)["name"])
	forTestNode(t, sb["spec"].(obj)["podTemplate"].(obj), "hello-from-"+name)
	sandboxes := "/apis/agents.x-k8s.io/v1alpha1/namespaces/team-a/sandboxes"
	t0 := time.Now()
	c.api.create(sandboxes, sb)
	pod, _ := c.awaitSmxPod(t, "Sandbox "+name, func(p *clusterPod) bool { return p.Metadata.Name == name }, "Sandbox", name, 0)
	t.Logf("Sandbox created to its pod Running and Ready: %v", time.Since(t0).Round(time.Millisecond))
	c.awaitSandboxReady(t, name)
	t.Logf("Sandbox created to Ready: %v", time.Since(t0).Round(time.Millisecond))
	c.checkSmxLog(t, pod, sb["spec"].(obj)["podTemplate"].(obj), "hello-from-"+name)

	// Deleting the Sandbox deletes what it owns (the garbage collector),
	// the kubelet stops the pod, and its VM goes.
	if code, body := c.api.do("DELETE", sandboxes+"/"+name, nil); code != http.StatusOK {
		t.Fatalf("DELETE Sandbox %s: %d: %s", name, code, body)
	}
	c.awaitGone(t, "/api/v1/namespaces/team-a/pods/"+name, "/api/v1/namespaces/team-a/services/"+name)

	// The warm pool: its controller keeps one pod of the template
	// running, an smx VM ready before anyone claims it.
	tmpl, pool := manifest["SandboxTemplate"], manifest["SandboxWarmPool"]
	tmplName, poolName := fmt.Sprint(tmpl["metadata"].(obj)["name"]), fmt.Sprint(pool["metadata"].(obj)["name"])
	forTestNode(t, tmpl["spec"].(obj)["podTemplate"].(obj), "hello-from-"+tmplName)
	pool["spec"].(obj)["replicas"] = 1
	ext := "/apis/extensions.agents.x-k8s.io/v1alpha1/namespaces/team-a/"
	c.api.create(ext+"sandboxtemplates", tmpl)
	t0 = time.Now()
	c.api.create(ext+"sandboxwarmpools", pool)
	warm, warmQEMU := c.awaitSmxPod(t, "SandboxWarmPool "+poolName, func(p *clusterPod) bool {
		return strings.HasPrefix(p.Metadata.Name, poolName+"-")
	}, "SandboxWarmPool", poolName, 0)
	t.Logf("SandboxWarmPool created to its pod Running and Ready: %v", time.Since(t0).Round(time.Millisecond))
	testutil.WaitFor(t, "SandboxWarmPool "+poolName+" readyReplicas 1", 2*time.Minute, func() error {
		var p struct {
			Status struct{ Replicas, ReadyReplicas int }
		}
		if err := c.api.get(ext+"sandboxwarmpools/"+poolName, &p); err != nil {
			return err
		}
		if p.Status.Replicas != 1 || p.Status.ReadyReplicas != 1 {
			return fmt.Errorf("status %+v", p.Status)
		}
		return nil
	})
	c.checkSmxLog(t, warm, tmpl["spec"].(obj)["podTemplate"].(obj), "hello-from-"+tmplName)

	// A claim on the template takes the warm pod, VM and all: the claim's
	// Sandbox (named after it) owns the pod, whose QEMU is the one that
	// booted for the pool; the pool boots another.
	claim := manifest["SandboxClaim"]
	claimName := fmt.Sprint(claim["metadata"].(obj)["name"])
	t0 = time.Now()
	c.api.create(ext+"sandboxclaims", claim)
	testutil.WaitFor(t, "SandboxClaim "+claimName+"'s Sandbox owning pod "+warm.Metadata.Name, 2*time.Minute, func() error {
		var p clusterPod
		if err := c.api.get("/api/v1/namespaces/team-a/pods/"+warm.Metadata.Name, &p); err != nil {
			return err
		}
		if !p.controlledBy("Sandbox", claimName) || !p.ready() {
			return fmt.Errorf("pod %+v", p)
		}
		return nil
	})
	c.awaitSandboxReady(t, claimName)
	t.Logf("SandboxClaim created to its Sandbox Ready on the warm pod: %v", time.Since(t0).Round(time.Millisecond))
	if cl, _ := os.ReadFile("/proc/" + warmQEMU + "/cmdline"); !strings.Contains(string(cl), "smx.hostname=k8s-team-a-"+warm.Metadata.Name+"-") {
		t.Fatalf("the warm pod's QEMU (PID %s) is gone after the claim took it", warmQEMU)
	}
	refill, _ := c.awaitSmxPod(t, "SandboxWarmPool "+poolName+" after the claim", func(p *clusterPod) bool {
		return strings.HasPrefix(p.Metadata.Name, poolName+"-") && p.Metadata.Name != warm.Metadata.Name
	}, "SandboxWarmPool", poolName, 1)
	t.Logf("SandboxClaim created to the pool's new pod Running and Ready: %v", time.Since(t0).Round(time.Millisecond))

	// Deleting the claim deletes its Sandbox and the Sandbox its pod; deleting
	// the pool, its new pod.
	if code, body := c.api.do("DELETE", ext+"sandboxclaims/"+claimName, nil); code != http.StatusOK {
		t.Fatalf("DELETE SandboxClaim %s: %d: %s", claimName, code, body)
	}
	if code, body := c.api.do("DELETE", ext+"sandboxwarmpools/"+poolName, nil); code != http.StatusOK {
		t.Fatalf("DELETE SandboxWarmPool %s: %d: %s", poolName, code, body)
	}
	c.awaitGone(t, sandboxes+"/"+claimName, "/api/v1/namespaces/team-a/pods/"+warm.Metadata.Name,
		"/api/v1/namespaces/team-a/pods/"+refill.Metadata.Name)
}

// awaitSandboxReady waits until Sandbox name of namespace team-a has
// condition Ready and its Service.
func (c *cluster) awaitSandboxReady(t *testing.T, name string) {
	t.Helper()
	testutil.WaitFor(t, "Sandbox "+name+" Ready", 2*time.Minute, func() error {
		var s struct {
			Status struct {
				Service    string
				Conditions []struct{ Type, Status, Message string }
			}
		}
		if err := c.api.get("/apis/agents.x-k8s.io/v1alpha1/namespaces/team-a/sandboxes/"+name, &s); err != nil {
			return err
		}
		for _, cond := range s.Status.Conditions {
			if cond.Type == "Ready" && cond.Status == "True" && s.Status.Service == name {
				return nil
			}
		}
		return fmt.Errorf("status %+v", s.Status)
	})
}

// agentSandboxModule is sigs.k8s.io/agent-sandbox at the version
// test/agent-sandbox/go.mod requires, in the module cache.
func agentSandboxModule(t *testing.T) (m struct{ Version, Dir, Error string }) {
	t.Helper()
	cmd := exec.Command("go", "mod", "download", "-json", "sigs.k8s.io/agent-sandbox")
	cmd.Dir = filepath.Join("..", "..", "test", "agent-sandbox")
	out, err := cmd.Output()
	if jerr := json.Unmarshal(out, &m); err != nil || jerr != nil || m.Error != "" || m.Dir == "" {
		t.Fatalf("go mod download sigs.k8s.io/agent-sandbox (in test/agent-sandbox): %v %s\n%s", err, m.Error, out)
	}
	return m
}

// yamlDocs is the YAML documents of file, as JSON-ready objects.
func yamlDocs(t *testing.T, file string) []obj {
	t.Helper()
	f, err := os.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var docs []obj
	for dec := yaml.NewDecoder(f); ; {
		var d obj
		if err := dec.Decode(&d); errors.Is(err, io.EOF) {
			return docs
		} else if err != nil {
			t.Fatalf("%s: %v", file, err)
		}
		if d != nil {
			docs = append(docs, d)
		}
	}
}

// forTestNode makes a manifest's pod template runnable on the test's
// cluster: the test's image (nothing is pulled), the container's command
// behind a shell that prints marker and the image's marker file first,
// host network and a toleration of every taint (no CNI: the node stays
// NotReady). runtimeClassName and the rest are the manifest's.
func forTestNode(t *testing.T, podTemplate obj, marker string) {
	t.Helper()
	spec := podTemplate["spec"].(obj)
	if spec["runtimeClassName"] != "smx" {
		t.Fatalf("%s: a pod template without runtimeClassName smx: %v", agentSandboxManifest, spec)
	}
	spec["hostNetwork"] = true
	spec["tolerations"] = []obj{{"operator": "Exists"}}
	ctr := spec["containers"].([]any)[0].(obj)
	ctr["image"], ctr["imagePullPolicy"] = appImage, "Never"
	ctr["command"] = append([]any{"sh", "-c", "echo " + marker + "; cat /app-marker; exec \"$@\"", "sh"}, ctr["command"].([]any)...)
}

// installCRDs creates the CustomResourceDefinitions of dir's YAML files
// and waits until the apiserver serves them; their names.
func (c *cluster) installCRDs(t *testing.T, dir string) []string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no CRDs in %s: %v", dir, err)
	}
	const crds = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
	var names []string
	for _, f := range files {
		for _, d := range yamlDocs(t, f) {
			if d["kind"] == "CustomResourceDefinition" {
				c.api.create(crds, d)
				names = append(names, fmt.Sprint(d["metadata"].(obj)["name"]))
			}
		}
	}
	for _, name := range names {
		testutil.WaitFor(t, "CRD "+name+" Established", time.Minute, func() error {
			var crd struct {
				Status struct {
					Conditions []struct{ Type, Status string }
				}
			}
			if err := c.api.get(crds+"/"+name, &crd); err != nil {
				return err
			}
			for _, cond := range crd.Status.Conditions {
				if cond.Type == "Established" && cond.Status == "True" {
					return nil
				}
			}
			return fmt.Errorf("conditions %+v", crd.Status.Conditions)
		})
	}
	return names
}

// clusterPod is what the tests read of a pod.
type clusterPod struct {
	Metadata struct {
		Name            string
		OwnerReferences []struct {
			Kind, Name string
			Controller bool
		}
	}
	Spec struct {
		NodeName, RuntimeClassName string
	}
	Status struct {
		Phase      string
		Conditions []struct{ Type, Status string }
	}
}

func (p *clusterPod) controlledBy(kind, name string) bool {
	for _, o := range p.Metadata.OwnerReferences {
		if o.Controller && o.Kind == kind && o.Name == name {
			return true
		}
	}
	return false
}

func (p *clusterPod) ready() bool {
	for _, c := range p.Status.Conditions {
		if c.Type == "Ready" {
			return p.Status.Phase == "Running" && c.Status == "True"
		}
	}
	return false
}

// awaitSmxPod waits until a pod of namespace team-a that pick chooses is
// Running and Ready, watching the node's processes meanwhile, and checks
// that it is controlled by the ownerKind ownerName, asks for
// runtimeClassName smx, and ran as one smx VM (k8s-team-a-POD-*, one QEMU
// process, whose PID it returns; the short-lived QEMU converting a new
// boot template, in a smx-slim- directory, is no VM of it) under one shim,
// beside the VMs and shims of others pods already running.
func (c *cluster) awaitSmxPod(t *testing.T, what string, pick func(*clusterPod) bool, ownerKind, ownerName string, others int) (clusterPod, string) {
	t.Helper()
	qemus, shims := map[string]string{}, map[string]bool{} // QEMU's PID: its sandbox
	var pod *clusterPod
	for deadline := time.Now().Add(5 * time.Minute); ; time.Sleep(300 * time.Millisecond) {
		for _, l := range c.n.leftovers() {
			pid, cl, _ := strings.Cut(l, ": ")
			if _, name, ok := strings.Cut(cl, "smx.hostname="); ok && strings.Contains(cl, "qemu-system") && !strings.Contains(cl, "/smx-slim-") {
				qemus[pid] = strings.Fields(name)[0]
			}
			if _, id, ok := strings.Cut(cl, " -id "); ok && strings.Contains(cl, "containerd-shim-smx-v1") &&
				!strings.HasSuffix(cl, " start ") && !strings.HasSuffix(cl, " delete ") {
				shims[strings.Fields(id)[0]] = true
			}
		}
		var list struct{ Items []clusterPod }
		if err := c.api.get("/api/v1/namespaces/team-a/pods", &list); err != nil {
			t.Fatal(err)
		}
		var picked []clusterPod
		for _, p := range list.Items {
			if pick(&p) {
				picked = append(picked, p)
			}
		}
		if len(picked) > 1 {
			t.Fatalf("%s: %d pods, want one: %+v", what, len(picked), picked)
		}
		if len(picked) == 1 {
			pod = &picked[0]
			if pod.ready() {
				break
			}
			if pod.Status.Phase == "Failed" || pod.Status.Phase == "Succeeded" {
				t.Fatalf("%s: pod %s is %s, want Running: %+v", what, pod.Metadata.Name, pod.Status.Phase, pod)
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: no pod Running and Ready after 5 minutes (the controller's log says why): %+v", what, pod)
		}
	}
	if !pod.controlledBy(ownerKind, ownerName) || pod.Spec.RuntimeClassName != "smx" || pod.Spec.NodeName != clusterNode {
		t.Fatalf("%s: pod %+v, want one controlled by %s %s, runtimeClassName smx, on %s", what, pod, ownerKind, ownerName, clusterNode)
	}
	prefix := "k8s-team-a-" + pod.Metadata.Name + "-"
	var mine []string
	for pid, vm := range qemus {
		if strings.HasPrefix(vm, prefix) {
			mine = append(mine, pid)
		}
	}
	if len(mine) != 1 || len(qemus) != 1+others || len(shims) != 1+others {
		t.Fatalf("%s: pod %s: QEMU processes %v (PID: VM) and %d smx shims, want one VM %s* and one shim, and %d of other pods",
			what, pod.Metadata.Name, qemus, len(shims), prefix, others)
	}
	if got := c.n.count("smx.hostname=" + prefix); got != 1 {
		t.Fatalf("%s: %d QEMU processes of %s* now, want 1", what, got, prefix)
	}
	return *pod, mine[0]
}

// checkSmxLog checks that the pod's container printed marker (its log read
// through the apiserver) and that the pod's smx VM has a signed log that
// records the profile of the pod template's annotation and the
// container's command, and verifies.
func (c *cluster) checkSmxLog(t *testing.T, pod clusterPod, podTemplate obj, marker string) {
	t.Helper()
	path := "/api/v1/namespaces/team-a/pods/" + pod.Metadata.Name + "/log"
	testutil.WaitFor(t, "GET "+path, time.Minute, func() error {
		if code, logs := c.api.do("GET", path, nil); code != http.StatusOK || string(logs) != marker+"\napp-root\n" {
			return fmt.Errorf("%d: %q, want %q", code, logs, marker+"\napp-root\n")
		}
		return nil
	})
	ls, err := c.n.smx("logs", "ls")
	if err != nil {
		t.Fatalf("smx logs ls: %v\n%s", err, ls)
	}
	var names []string
	for _, f := range strings.Fields(ls) {
		if strings.HasPrefix(f, "k8s-team-a-"+pod.Metadata.Name+"-") {
			names = append(names, f)
		}
	}
	if len(names) != 1 {
		t.Fatalf("smx logs ls: want one log of pod %s, k8s-team-a-%s-*:\n%s", pod.Metadata.Name, pod.Metadata.Name, ls)
	}
	profile := fmt.Sprint(podTemplate["metadata"].(obj)["annotations"].(obj)["io.smx.profile"])
	records, err := c.n.smx("agent", "logs", names[0])
	if err != nil || !strings.Contains(records, marker) || !strings.Contains(records, "infinity") ||
		!strings.Contains(records, `profile="`+profile+`"`) {
		t.Fatalf("smx agent logs %s: %v, want profile %s and the container's command (%s, sleep infinity):\n%s", names[0], err, profile, marker, records)
	}
	t.Logf("smx agent logs %s:\n%s", names[0], records)
	if out, err := c.n.smx("agent", "logs", names[0], "--verify"); err != nil {
		t.Fatalf("smx agent logs %s --verify: %v\n%s", names[0], err, out)
	}
}

// awaitGone waits until the apiserver answers 404 for each path and then
// until the node has no QEMU, shim or supervisor left.
func (c *cluster) awaitGone(t *testing.T, paths ...string) {
	t.Helper()
	t0 := time.Now()
	for _, p := range paths {
		testutil.WaitFor(t, p+" deleted", 3*time.Minute, func() error {
			if code, body := c.api.do("GET", p, nil); code != http.StatusNotFound {
				return fmt.Errorf("%d: %s", code, body)
			}
			return nil
		})
	}
	testutil.WaitFor(t, "no QEMU, shim or supervisor left", 3*time.Minute, func() error {
		if left := c.n.leftovers(); len(left) > 0 {
			return fmt.Errorf("%s", strings.Join(left, "\n"))
		}
		return nil
	})
	t.Logf("deleted, and nothing left on the node: %v", time.Since(t0).Round(time.Millisecond))
}
