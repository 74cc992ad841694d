package shim_test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/smx-dev/smx/internal/shim"
	"github.com/smx-dev/smx/internal/testutil"
)

// clusterNode is the name the kubelet registers its node under.
const clusterNode = "smx-node"

// TestCluster runs a pod with runtimeClassName smx on a one-node
// Kubernetes: etcd, kube-apiserver, kube-scheduler and kubelet from
// $SMX_TEST_K8S_BIN (scripts/cluster-test.sh builds them), over a private
// containerd whose CRI plugin has runtime handler smx. The scheduler
// places the pod; the kubelet runs it through the CRI plugin; the pod
// must reach phase Succeeded, its log must read back through the
// apiserver, and it must have been one smx VM whose signed log records
// its command. Without a controller manager the test creates what it
// would (the namespace's service account) and nothing removes the node's
// not-ready taint (no CNI here): the pod tolerates it, on the host's
// network.
func TestCluster(t *testing.T) {
	c := startCluster(t, clusterBinaries(t))
	n, api := c.n, c.api

	t0 := time.Now()
	api.create("/api/v1/namespaces/team-a/pods", obj{
		"apiVersion": "v1", "kind": "Pod",
		"metadata": obj{"name": "web"},
		"spec": obj{
			"runtimeClassName": "smx",
			"restartPolicy":    "Never",
			"hostNetwork":      true,
			// No token volume: its kube-root-ca.crt ConfigMap comes from
			// a controller manager.
			"automountServiceAccountToken": false,
			"enableServiceLinks":           false,
			"tolerations":                  []obj{{"operator": "Exists"}},
			"containers": []obj{{
				"name": "app", "image": appImage, "imagePullPolicy": "Never",
				"command":         []string{"sh", "-c", "echo hello-from-cluster; id -u; cat /app-marker"},
				"env":             []obj{{"name": "GREETING", "value": "hi"}},
				"securityContext": obj{"runAsUser": 65534},
			}},
		},
	})
	var pod struct {
		Spec   struct{ NodeName string }
		Status struct {
			Phase             string
			ContainerStatuses []struct {
				ContainerID string
				State       struct {
					Terminated *struct{ ExitCode int }
				}
			}
		}
	}
	// The node's QEMU processes by the sandbox they run, and its shim
	// daemons by their task, seen while the pod ran. (A first cold boot saves a boot
	// template, and a second, short-lived QEMU of the same sandbox
	// converts it to its shared-RAM form.)
	vms, shims := map[string]bool{}, map[string]bool{}
	api.waitSucceeded("web", &pod, func() {
		for _, l := range n.leftovers() {
			if _, name, ok := strings.Cut(l, "smx.hostname="); ok && strings.Contains(l, "qemu-system") {
				vms[strings.Fields(name)[0]] = true
			}
			// containerd runs the shim binary with start and delete
			// too; the daemon is the one without, known by its task
			// (a child between fork and exec shows its command line).
			if _, id, ok := strings.Cut(l, " -id "); ok && strings.Contains(l, "containerd-shim-smx-v1") &&
				!strings.HasSuffix(l, " start ") && !strings.HasSuffix(l, " delete ") {
				shims[strings.Fields(id)[0]] = true
			}
		}
	})
	t.Logf("pod created to Succeeded: %v", time.Since(t0).Round(time.Millisecond))
	if pod.Spec.NodeName != clusterNode || len(pod.Status.ContainerStatuses) != 1 ||
		!strings.HasPrefix(pod.Status.ContainerStatuses[0].ContainerID, "containerd://") ||
		pod.Status.ContainerStatuses[0].State.Terminated == nil || pod.Status.ContainerStatuses[0].State.Terminated.ExitCode != 0 {
		t.Fatalf("pod web: %+v, want scheduled to %s, its container exited 0 under containerd", pod, clusterNode)
	}
	if len(vms) != 1 || len(shims) != 1 {
		t.Fatalf("the pod ran the VMs of %v and %d smx shims, want one VM, k8s-team-a-web-*, and one shim", vms, len(shims))
	}
	for name := range vms {
		if !strings.HasPrefix(name, "k8s-team-a-web-") {
			t.Fatalf("the pod ran in VM %s, want k8s-team-a-web-*", name)
		}
	}

	// kubectl logs: the apiserver asks the kubelet.
	code, logs := api.do("GET", "/api/v1/namespaces/team-a/pods/web/log?container=app", nil)
	if code != http.StatusOK || string(logs) != "hello-from-cluster\n65534\napp-root\n" {
		t.Fatalf("GET pods/web/log: %d: %q, want the command's output as user 65534", code, logs)
	}

	// The pod was one smx sandbox, named after it, whose signed log
	// records the container's command.
	ls, err := n.smx("logs", "ls")
	if err != nil {
		t.Fatalf("smx logs ls: %v\n%s", err, ls)
	}
	var names []string
	for _, f := range strings.Fields(ls) {
		if strings.HasPrefix(f, "k8s-") {
			names = append(names, f)
		}
	}
	if len(names) != 1 || !strings.HasPrefix(names[0], "k8s-team-a-web-") {
		t.Fatalf("smx logs ls: want one log, k8s-team-a-web-*:\n%s", ls)
	}
	records, err := n.smx("agent", "logs", names[0])
	if err != nil || !strings.Contains(records, "hello-from-cluster") || !strings.Contains(records, "GREETING") {
		t.Fatalf("smx agent logs %s: %v\n%s", names[0], err, records)
	}
	t.Logf("smx agent logs %s:\n%s", names[0], records)
	if out, err := n.smx("agent", "logs", names[0], "--verify"); err != nil {
		t.Fatalf("smx agent logs --verify: %v\n%s", err, out)
	}

	// The kubelet stopped the pod's sandbox once its container exited (the
	// VM stops with it); once the pod is deleted, nothing of it is left
	// on the node.
	if code, body := api.do("DELETE", "/api/v1/namespaces/team-a/pods/web", nil); code != http.StatusOK {
		t.Fatalf("DELETE pod web: %d: %s", code, body)
	}
	testutil.WaitFor(t, "pod web deleted", 3*time.Minute, func() error {
		if code, body := api.do("GET", "/api/v1/namespaces/team-a/pods/web", nil); code != http.StatusNotFound {
			return fmt.Errorf("%d: %s", code, body)
		}
		return nil
	})
	testutil.WaitFor(t, "no QEMU, shim or supervisor left", 3*time.Minute, func() error {
		if left := n.leftovers(); len(left) > 0 {
			return fmt.Errorf("%s", strings.Join(left, "\n"))
		}
		return nil
	})
}

// TestClusterRestoreFromRegistry: on the one-node cluster, a pod with
// runtimeClassName smx annotated io.smx.from-snapshot with the reference
// host A pushed (pushWarm) is restored, not booted: the scheduler places
// it, the kubelet runs it through the CRI plugin, and its container, in
// the restored guest, prints A's file and A's counter going on; the
// output reads back through the apiserver. The node's settings admit the
// registry's agents/ repositories and A's key.
func TestClusterRestoreFromRegistry(t *testing.T) {
	k8s := clusterBinaries(t) // skips before host A's work when not opted in
	w := pushWarm(t)
	c := startCluster(t, k8s)
	n, api := c.n, c.api
	settings := fmt.Sprintf("pod_restore_from: [%s/agents]\npod_restore_keys: [%q]\n", w.host, w.key)
	if err := os.WriteFile(filepath.Join(n.home, shim.ConfigFile), []byte(settings), 0o644); err != nil {
		t.Fatal(err)
	}

	t0 := time.Now()
	api.create("/api/v1/namespaces/team-a/pods", obj{
		"apiVersion": "v1", "kind": "Pod",
		"metadata": obj{"name": "warm", "annotations": obj{shim.FromSnapshotAnnotation: w.ref}},
		"spec": obj{
			"runtimeClassName":             "smx",
			"restartPolicy":                "Never",
			"hostNetwork":                  true,
			"automountServiceAccountToken": false,
			"enableServiceLinks":           false,
			"tolerations":                  []obj{{"operator": "Exists"}},
			"containers": []obj{{
				"name": "agent", "image": appImage, "imagePullPolicy": "Never",
				"command": []string{"sh", "-c", readCounts},
			}},
		},
	})
	qemus := 0 // the most QEMU processes seen at once
	api.waitSucceeded("warm", nil, func() { qemus = max(qemus, n.count("qemu-system")) })
	t.Logf("pod created to Succeeded (pull and restore included): %v", time.Since(t0).Round(time.Millisecond))
	code, logs := api.do("GET", "/api/v1/namespaces/team-a/pods/warm/log?container=agent", nil)
	if code != http.StatusOK {
		t.Fatalf("GET pods/warm/log: %d: %s", code, logs)
	}
	checkCounts(t, "pod warm", string(logs), w.before)
	if qemus != 1 {
		t.Fatalf("the pod ran %d QEMU processes at once, want one", qemus)
	}
	ls, _ := n.smx("snapshot", "ls")
	if !strings.Contains(ls, "pulled-") {
		t.Fatalf("the node holds no pulled snapshot:\n%s", ls)
	}

	if code, body := api.do("DELETE", "/api/v1/namespaces/team-a/pods/warm", nil); code != http.StatusOK {
		t.Fatalf("DELETE pod warm: %d: %s", code, body)
	}
	testutil.WaitFor(t, "no QEMU, shim or supervisor left", 3*time.Minute, func() error {
		if left := n.leftovers(); len(left) > 0 {
			return fmt.Errorf("%s", strings.Join(left, "\n"))
		}
		return nil
	})
}

// TestClusterPodFromTemplate: on the one-node cluster, a pod with
// runtimeClassName smx annotated io.smx.from-template with the reference
// node A pushed (pushPodTemplate: a template of a CRI pod's shape, built
// on another containerd and state directory) starts from it: the node
// pulls the template, the pod's VM restores it instead of booting (its
// sandbox's sandbox.start record says so), and its container runs in its
// own image's root; the output reads back through the apiserver.
func TestClusterPodFromTemplate(t *testing.T) {
	k8s := clusterBinaries(t) // skips before node A's work when not opted in
	p := pushPodTemplate(t)
	c := startCluster(t, k8s)
	n, api := c.n, c.api
	settings := fmt.Sprintf("pod_restore_from: [%s/templates]\npod_restore_keys: [%q]\n", p.host, p.key)
	if err := os.WriteFile(filepath.Join(n.home, shim.ConfigFile), []byte(settings), 0o644); err != nil {
		t.Fatal(err)
	}

	t0 := time.Now()
	api.create("/api/v1/namespaces/team-a/pods", obj{
		"apiVersion": "v1", "kind": "Pod",
		"metadata": obj{"name": "from-tpl", "annotations": obj{shim.FromTemplateAnnotation: p.ref}},
		"spec": obj{
			"runtimeClassName":             "smx",
			"restartPolicy":                "Never",
			"hostNetwork":                  true,
			"automountServiceAccountToken": false,
			"enableServiceLinks":           false,
			"tolerations":                  []obj{{"operator": "Exists"}},
			"containers": []obj{{
				"name": "agent", "image": appImage, "imagePullPolicy": "Never",
				"command": []string{"sh", "-c", "echo marker $(cat /app-marker); exec sleep 600"},
			}},
		},
	})
	// Running, its container's line read back while the pod's sandbox is
	// there.
	for deadline := time.Now().Add(5 * time.Minute); ; time.Sleep(300 * time.Millisecond) {
		code, logs := api.do("GET", "/api/v1/namespaces/team-a/pods/from-tpl/log?container=agent", nil)
		if code == http.StatusOK && strings.Contains(string(logs), "marker app-root") {
			break
		}
		if time.Now().After(deadline) {
			_, body := api.do("GET", "/api/v1/namespaces/team-a/pods/from-tpl", nil)
			t.Fatalf("pod from-tpl: no line from its image's root after 5 minutes: %d %q\n%s", code, logs, body)
		}
	}
	t.Logf("pod created to its container's line (template pull included): %v", time.Since(t0).Round(time.Millisecond))
	sb := sandboxOf(t, n, "from-tpl")
	if out, err := n.smx("agent", "logs", sb, "--json"); err != nil || !strings.Contains(out, `"restored_from":"template `+p.tpl+`"`) {
		t.Fatalf("smx agent logs %s: %v: its start did not restore template %s\n%s", sb, err, p.tpl, out)
	}

	if code, body := api.do("DELETE", "/api/v1/namespaces/team-a/pods/from-tpl", nil); code != http.StatusOK {
		t.Fatalf("DELETE pod from-tpl: %d: %s", code, body)
	}
	testutil.WaitFor(t, "no QEMU, shim or supervisor left", 3*time.Minute, func() error {
		if left := n.leftovers(); len(left) > 0 {
			return fmt.Errorf("%s", strings.Join(left, "\n"))
		}
		return nil
	})
}

// clusterBinaries is $SMX_TEST_K8S_BIN, the directory of the cluster's
// programs; the test is skipped when it is not set.
func clusterBinaries(t *testing.T) string {
	t.Helper()
	k8s := os.Getenv("SMX_TEST_K8S_BIN")
	if k8s == "" {
		t.Skip("SMX_TEST_K8S_BIN is not set: scripts/cluster-test.sh builds etcd, kube-apiserver, kube-scheduler and kubelet and runs this test (as root)")
	}
	for _, b := range []string{"etcd", "kube-apiserver", "kube-scheduler", "kubelet"} {
		_, err := os.Stat(filepath.Join(k8s, b))
		testutil.Require(t, err == nil, b+" in "+k8s, "scripts/cluster-test.sh --build")
	}
	return k8s
}

// cluster is the one-node Kubernetes the cluster tests run on: etcd,
// kube-apiserver, kube-scheduler and a kubelet (node clusterNode) over a
// private CRI containerd, all on loopback, stopped when the test ends.
// Namespace team-a, its default service account and the RuntimeClass
// smx are made.
type cluster struct {
	n      *node
	k8s    string // the programs' directory
	dir    string // their state, logs, certificates and kubeconfigs
	server string // the apiserver's URL
	pki    *clusterPKI
	api    *apiClient
}

func startCluster(t *testing.T, k8s string) *cluster {
	t.Helper()
	keepKernelTunables(t)
	// After containerd stops: what a failed test's pods left mounted in
	// its state directory (the CRI plugin's /dev/shm of a runc pod
	// sandbox the kubelet did not remove).
	var nodeDir string
	t.Cleanup(func() { unmountUnder(nodeDir) })
	n := startCRIContainerd(t)
	nodeDir = n.dir
	dir := filepath.Join(n.dir, "k8s")
	pki := newClusterPKI(t, filepath.Join(dir, "pki"))
	etcdPort, etcdPeer, apiPort, schedPort, kubeletPort := freePort(t), freePort(t), freePort(t), freePort(t), freePort(t)
	server := "https://127.0.0.1:" + apiPort

	etcdURL := "http://127.0.0.1:" + etcdPort
	startProcess(t, dir, filepath.Join(k8s, "etcd"), "--name", "smx", "--data-dir", filepath.Join(dir, "etcd"),
		"--listen-client-urls", etcdURL, "--advertise-client-urls", etcdURL,
		"--listen-peer-urls", "http://127.0.0.1:"+etcdPeer, "--initial-advertise-peer-urls", "http://127.0.0.1:"+etcdPeer,
		"--initial-cluster", "smx=http://127.0.0.1:"+etcdPeer, "--unsafe-no-fsync")
	testutil.WaitFor(t, "etcd's /health", time.Minute, func() error {
		resp, err := http.Get(etcdURL + "/health")
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("status %s", resp.Status)
		}
		return nil
	})

	startProcess(t, dir, filepath.Join(k8s, "kube-apiserver"),
		"--etcd-servers", etcdURL,
		"--bind-address", "127.0.0.1", "--advertise-address", "127.0.0.1", "--secure-port", apiPort,
		"--tls-cert-file", pki.file("apiserver.crt"), "--tls-private-key-file", pki.file("apiserver.key"),
		"--client-ca-file", pki.file("ca.crt"),
		"--authorization-mode", "AlwaysAllow",
		"--service-account-issuer", "https://kubernetes.default.svc",
		"--service-account-key-file", pki.file("sa.pub"), "--service-account-signing-key-file", pki.file("sa.key"),
		// Its own Service's endpoint would be 127.0.0.1, which Endpoints
		// refuse; nothing here needs it.
		"--endpoint-reconciler-type", "none",
		// Logs and exec go to the kubelet at the node's address, through
		// the test's proxy; its self-signed serving certificate is not
		// checked.
		"--kubelet-preferred-address-types", "InternalIP",
		"--egress-selector-config-file", kubeletProxy(t, dir, kubeletPort),
		"--kubelet-client-certificate", pki.file("apiserver-kubelet.crt"), "--kubelet-client-key", pki.file("apiserver-kubelet.key"))
	api := &apiClient{t: t, base: server, c: &http.Client{Timeout: time.Minute, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{RootCAs: pki.pool, Certificates: []tls.Certificate{pki.admin}},
	}}}
	testutil.WaitFor(t, "kube-apiserver's /readyz", 3*time.Minute, func() error {
		if code, body := api.do("GET", "/readyz", nil); code != http.StatusOK {
			return fmt.Errorf("%d: %s", code, body)
		}
		return nil
	})

	schedConf := writeKubeconfig(t, dir, "scheduler", server, pki)
	startProcess(t, dir, filepath.Join(k8s, "kube-scheduler"), "--kubeconfig", schedConf,
		"--authentication-kubeconfig", schedConf, "--authorization-kubeconfig", schedConf,
		"--bind-address", "127.0.0.1", "--secure-port", schedPort, "--leader-elect=false")

	kubeletDir := filepath.Join(dir, "kubelet")
	kubeletConf := writeJSON(t, filepath.Join(dir, "kubelet.json"), obj{
		"apiVersion": "kubelet.config.k8s.io/v1beta1", "kind": "KubeletConfiguration",
		"containerRuntimeEndpoint": "unix://" + n.sock,
		"address":                  "127.0.0.1", "port": mustAtoi(t, kubeletPort), "readOnlyPort": 0, "healthzPort": 0,
		"authentication": obj{"anonymous": obj{"enabled": false}, "webhook": obj{"enabled": false},
			"x509": obj{"clientCAFile": pki.file("ca.crt")}},
		"authorization": obj{"mode": "AlwaysAllow"},
		// No QoS cgroups: the kubelet leaves the host's cgroup v1
		// hierarchy as it found it (smx pods use no cgroups).
		"cgroupDriver": "cgroupfs", "cgroupsPerQOS": false, "enforceNodeAllocatable": []string{"none"},
		"failCgroupV1": false, "failSwapOn": false,
		"podLogsDir": filepath.Join(dir, "pod-logs"),
		"resolvConf": "/etc/resolv.conf",
		// This machine's disk is shared: no image GC or eviction for it.
		"imageGCHighThresholdPercent": 100, "evictionHard": obj{"memory.available": "1Mi"},
		"serializeImagePulls": false,
	})
	// After the kubelet stops: it makes its root directory a mount of its
	// own.
	t.Cleanup(func() { exec.Command("umount", "-R", kubeletDir).Run() })
	keepKubeletPaths(t, dir)
	startProcess(t, dir, filepath.Join(k8s, "kubelet"), "--config", kubeletConf,
		"--kubeconfig", writeKubeconfig(t, dir, "kubelet", server, pki),
		"--root-dir", kubeletDir, "--cert-dir", filepath.Join(dir, "kubelet-pki"),
		"--hostname-override", clusterNode, "--node-ip", hostIP(t), "--v", "2")
	testutil.WaitFor(t, "node "+clusterNode+" registered", 3*time.Minute, func() error {
		if code, body := api.do("GET", "/api/v1/nodes/"+clusterNode, nil); code != http.StatusOK {
			return fmt.Errorf("%d: %s", code, body)
		}
		return nil
	})

	// What a controller manager and an operator would have made: the
	// namespace, its default service account, the RuntimeClass
	// (deploy/kubernetes/runtimeclass.yaml).
	api.create("/api/v1/namespaces", obj{"apiVersion": "v1", "kind": "Namespace", "metadata": obj{"name": "team-a"}})
	api.create("/api/v1/namespaces/team-a/serviceaccounts", obj{"apiVersion": "v1", "kind": "ServiceAccount", "metadata": obj{"name": "default"}})
	api.create("/apis/node.k8s.io/v1/runtimeclasses", obj{"apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass",
		"metadata": obj{"name": "smx"}, "handler": "smx"})
	return &cluster{n: n, k8s: k8s, dir: dir, server: server, pki: pki, api: api}
}

// unmountUnder unmounts whatever is mounted below dir, deepest first,
// and removes dir.
func unmountUnder(dir string) {
	if dir == "" {
		return
	}
	b, _ := os.ReadFile("/proc/self/mounts")
	lines := strings.Split(string(b), "\n")
	for i := len(lines) - 1; i >= 0; i-- {
		if f := strings.Fields(lines[i]); len(f) > 1 && strings.HasPrefix(f[1], dir+"/") {
			exec.Command("umount", "-l", f[1]).Run()
		}
	}
	os.RemoveAll(dir)
}

// keepKernelTunables puts back, when the test ends, the sysctls the
// kubelet sets when it starts (vm.overcommit_memory, kernel.panic,
// kernel.panic_on_oops, ...; it sets or refuses them, nothing between).
func keepKernelTunables(t *testing.T) {
	for _, k := range []string{"vm/overcommit_memory", "vm/panic_on_oom", "kernel/panic", "kernel/panic_on_oops",
		"kernel/keys/root_maxkeys", "kernel/keys/root_maxbytes"} {
		p := filepath.Join("/proc/sys", k)
		v, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if err := os.WriteFile(p, v, 0o644); err != nil {
				t.Errorf("restoring %s: %v", p, err)
			}
		})
	}
}

// keepKubeletPaths removes, after the kubelet stops, what it made outside
// its root directory in paths it does not let one choose: its device
// plugin socket's directory and the links to its containers' logs (those
// into dir, in a directory that was there before).
func keepKubeletPaths(t *testing.T, dir string) {
	for _, p := range []string{"/var/lib/kubelet", "/var/log/containers"} {
		_, err := os.Lstat(p)
		existed := err == nil
		t.Cleanup(func() {
			if !existed {
				os.RemoveAll(p)
				return
			}
			ents, _ := os.ReadDir(p)
			for _, e := range ents {
				if target, err := os.Readlink(filepath.Join(p, e.Name())); err == nil && strings.HasPrefix(target, dir+"/") {
					os.Remove(filepath.Join(p, e.Name()))
				}
			}
		})
	}
}

// startProcess starts one of the cluster's programs, its output in
// dir/NAME.log; the test's end stops it (SIGTERM, then SIGKILL after 20
// seconds) and, if the test failed, prints the log's tail. A program that
// exits before the test ends fails it.
func startProcess(t *testing.T, dir, path string, args ...string) {
	t.Helper()
	name := filepath.Base(path)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	logPath := filepath.Join(dir, name+".log")
	logf, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(path, args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	waited := make(chan error, 1)
	go func() { waited <- cmd.Wait() }()
	stopping := make(chan struct{})
	go func() {
		select {
		case err := <-waited:
			waited <- err
			t.Errorf("%s exited early: %v (log: %s)", name, err, logPath)
		case <-stopping:
		}
	}()
	t.Cleanup(func() {
		close(stopping)
		cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-waited:
		case <-time.After(20 * time.Second):
			cmd.Process.Kill()
			<-waited
		}
		logf.Close()
		if t.Failed() {
			b, _ := os.ReadFile(logPath)
			t.Logf("%s log (tail):\n%s", name, tail(string(b), 6000))
		}
	})
}

// hostIP is an IPv4 address of one of the host's interfaces other than
// loopback: the node's address (the kubelet refuses a loopback one).
// Nothing connects to it: the kubelet listens on 127.0.0.1 and the
// apiserver reaches it through kubeletProxy.
func hostIP(t *testing.T) string {
	t.Helper()
	ifaces, err := net.Interfaces()
	if err != nil {
		t.Fatal(err)
	}
	for _, ifc := range ifaces {
		if ifc.Flags&net.FlagUp == 0 || ifc.Flags&net.FlagLoopback != 0 {
			continue
		}
		addrs, _ := ifc.Addrs()
		for _, a := range addrs {
			if ipn, ok := a.(*net.IPNet); ok && ipn.IP.To4() != nil && !ipn.IP.IsLinkLocalUnicast() {
				return ipn.IP.String()
			}
		}
	}
	t.Skip("no IPv4 address on an interface other than loopback: the kubelet needs one for its node")
	return ""
}

// kubeletProxy is the apiserver's way to the kubelet: an HTTP CONNECT
// proxy on a unix socket in dir (the apiserver's egress selector for
// "cluster", whose file it returns) that connects whatever the apiserver
// asks for to the kubelet's port on 127.0.0.1.
func kubeletProxy(t *testing.T, dir, kubeletPort string) string {
	t.Helper()
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(dir, "egress.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				br := bufio.NewReader(c)
				req, err := http.ReadRequest(br)
				if err != nil || req.Method != http.MethodConnect {
					return
				}
				k, err := net.Dial("tcp", "127.0.0.1:"+kubeletPort)
				if err != nil {
					fmt.Fprintf(c, "HTTP/1.1 502 Bad Gateway\r\n\r\n")
					return
				}
				defer k.Close()
				fmt.Fprintf(c, "HTTP/1.1 200 Connection established\r\n\r\n")
				go func() { io.Copy(k, br); k.(*net.TCPConn).CloseWrite() }()
				io.Copy(c, k)
			}()
		}
	}()
	return writeJSON(t, filepath.Join(dir, "egress.json"), obj{
		"apiVersion": "apiserver.k8s.io/v1beta1", "kind": "EgressSelectorConfiguration",
		"egressSelections": []obj{{"name": "cluster", "connection": obj{
			"proxyProtocol": "HTTPConnect", "transport": obj{"uds": obj{"udsName": sock}}}}},
	})
}

func freePort(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return strconv.Itoa(ln.Addr().(*net.TCPAddr).Port)
}

func mustAtoi(t *testing.T, s string) int {
	i, err := strconv.Atoi(s)
	if err != nil {
		t.Fatal(err)
	}
	return i
}

// apiClient speaks JSON to the apiserver as an administrator
// (system:masters).
type apiClient struct {
	t    *testing.T
	base string
	c    *http.Client
}

// do is one request; its status code and body (an error's text as the
// body when there was no answer).
func (a *apiClient) do(method, path string, body any) (int, []byte) {
	var r io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			a.t.Fatal(err)
		}
		r = bytes.NewReader(b)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, a.base+path, r)
	if err != nil {
		a.t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := a.c.Do(req)
	if err != nil {
		return 0, []byte(err.Error())
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b
}

// get GETs path into v.
func (a *apiClient) get(path string, v any) error {
	code, body := a.do("GET", path, nil)
	if code != http.StatusOK {
		return fmt.Errorf("GET %s: %d: %s", path, code, body)
	}
	return json.Unmarshal(body, v)
}

// waitSucceeded polls pod name in team-a, calling each (what the test
// watches while the pod runs) before every look, until the pod has
// Succeeded; its last state is unmarshalled into pod unless pod is nil. A
// pod that failed or is not done within 5 minutes fails the test.
func (a *apiClient) waitSucceeded(name string, pod any, each func()) {
	a.t.Helper()
	for deadline := time.Now().Add(5 * time.Minute); ; time.Sleep(300 * time.Millisecond) {
		each()
		code, body := a.do("GET", "/api/v1/namespaces/team-a/pods/"+name, nil)
		if code != http.StatusOK {
			a.t.Fatalf("GET pod %s: %d: %s", name, code, body)
		}
		var st struct {
			Status struct{ Phase string }
		}
		if err := json.Unmarshal(body, &st); err != nil {
			a.t.Fatal(err)
		}
		if pod != nil {
			if err := json.Unmarshal(body, pod); err != nil {
				a.t.Fatal(err)
			}
		}
		if st.Status.Phase == "Succeeded" {
			return
		}
		if st.Status.Phase == "Failed" || time.Now().After(deadline) {
			a.t.Fatalf("pod %s is %q, want Succeeded:\n%s", name, st.Status.Phase, body)
		}
	}
}

// create POSTs object v to collection path.
func (a *apiClient) create(path string, v any) {
	a.t.Helper()
	if code, body := a.do("POST", path, v); code != http.StatusCreated {
		a.t.Fatalf("POST %s: %d: %s", path, code, body)
	}
}

// clusterPKI is the cluster's certificate authority and what it signed,
// as PEM files in dir: the apiserver's serving certificate; client
// certificates for the administrator (the test), the scheduler, the
// controller manager, the agent-sandbox controller, the kubelet (as its
// node) and the apiserver (to the kubelet); and the
// service-account signing key pair.
type clusterPKI struct {
	dir   string
	pool  *x509.CertPool
	admin tls.Certificate
}

func (p *clusterPKI) file(name string) string { return filepath.Join(p.dir, name) }

func newClusterPKI(t *testing.T, dir string) *clusterPKI {
	t.Helper()
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	p := &clusterPKI{dir: dir, pool: x509.NewCertPool()}
	caKey := p.key(t, "ca.key")
	now := time.Now()
	caTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "smx-test-ca"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		t.Fatal(err)
	}
	p.pool.AddCert(ca)
	p.write(t, "ca.crt", "CERTIFICATE", caDER)
	serial := int64(1)
	sign := func(name string, subject pkix.Name, usage x509.ExtKeyUsage, dns []string, ips []net.IP) tls.Certificate {
		key := p.key(t, name+".key")
		serial++
		der, err := x509.CreateCertificate(rand.Reader, &x509.Certificate{
			SerialNumber: big.NewInt(serial), Subject: subject,
			NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
			KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{usage},
			DNSNames: dns, IPAddresses: ips,
		}, ca, &key.PublicKey, caKey)
		if err != nil {
			t.Fatal(err)
		}
		p.write(t, name+".crt", "CERTIFICATE", der)
		return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
	}
	sign("apiserver", pkix.Name{CommonName: "kube-apiserver"}, x509.ExtKeyUsageServerAuth,
		[]string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc"},
		[]net.IP{net.IPv4(127, 0, 0, 1)})
	p.admin = sign("admin", pkix.Name{CommonName: "smx-test", Organization: []string{"system:masters"}}, x509.ExtKeyUsageClientAuth, nil, nil)
	sign("scheduler", pkix.Name{CommonName: "system:kube-scheduler"}, x509.ExtKeyUsageClientAuth, nil, nil)
	sign("controller-manager", pkix.Name{CommonName: "system:kube-controller-manager"}, x509.ExtKeyUsageClientAuth, nil, nil)
	sign("agent-sandbox", pkix.Name{CommonName: "agent-sandbox-controller"}, x509.ExtKeyUsageClientAuth, nil, nil)
	sign("kubelet", pkix.Name{CommonName: "system:node:" + clusterNode, Organization: []string{"system:nodes"}}, x509.ExtKeyUsageClientAuth, nil, nil)
	sign("apiserver-kubelet", pkix.Name{CommonName: "kube-apiserver-kubelet-client", Organization: []string{"system:masters"}}, x509.ExtKeyUsageClientAuth, nil, nil)
	sa := p.key(t, "sa.key")
	pub, err := x509.MarshalPKIXPublicKey(&sa.PublicKey)
	if err != nil {
		t.Fatal(err)
	}
	p.write(t, "sa.pub", "PUBLIC KEY", pub)
	return p
}

// key makes a P-256 key and writes it to file name.
func (p *clusterPKI) key(t *testing.T, name string) *ecdsa.PrivateKey {
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	der, err := x509.MarshalECPrivateKey(k)
	if err != nil {
		t.Fatal(err)
	}
	p.write(t, name, "EC PRIVATE KEY", der)
	return k
}

func (p *clusterPKI) write(t *testing.T, name, typ string, der []byte) {
	if err := os.WriteFile(p.file(name), pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
}

// writeKubeconfig writes dir/NAME.kubeconfig: the apiserver at server,
// with the client certificate NAME.crt.
func writeKubeconfig(t *testing.T, dir, name, server string, p *clusterPKI) string {
	return writeJSON(t, filepath.Join(dir, name+".kubeconfig"), obj{
		"apiVersion": "v1", "kind": "Config",
		"clusters":        []obj{{"name": "smx", "cluster": obj{"server": server, "certificate-authority": p.file("ca.crt")}}},
		"users":           []obj{{"name": name, "user": obj{"client-certificate": p.file(name + ".crt"), "client-key": p.file(name + ".key")}}},
		"contexts":        []obj{{"name": "smx", "context": obj{"cluster": "smx", "user": name}}},
		"current-context": "smx",
	})
}
