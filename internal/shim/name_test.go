package shim

import (
	"strings"
	"testing"

	"github.com/smx-dev/smx/internal/sandbox"
)

func TestSandboxName(t *testing.T) {
	pod := map[string]string{
		"io.kubernetes.cri.sandbox-namespace": "team-a",
		"io.kubernetes.cri.sandbox-name":      "agent-7",
		"io.kubernetes.cri.container-name":    "claude",
	}
	long := strings.Repeat("x", 80)
	for _, c := range []struct {
		ns, id string
		ann    map[string]string
		prefix string
	}{
		{"default", "t1", nil, "ctr-default-t1"},
		{"k8s.io", "0123abcd", pod, "k8s-team-a-agent-7-claude-"},
		{"k8s.io", "pause1", map[string]string{"io.kubernetes.cri.sandbox-namespace": "team-a", "io.kubernetes.cri.sandbox-name": "agent-7"}, "k8s-team-a-agent-7-"},
		{"default", "a/b c:d", nil, "ctr-default-a-b-c-d"},
		{"default", long, nil, "ctr-default-xxx"},
	} {
		n := SandboxName(c.ns, c.id, c.ann)
		if err := sandbox.ValidName(n); err != nil {
			t.Errorf("%s/%s: %v", c.ns, c.id, err)
		}
		if !strings.HasPrefix(n, c.prefix) {
			t.Errorf("%s/%s: %q, want prefix %q", c.ns, c.id, n, c.prefix)
		}
	}
	// Distinct tasks, distinct sandboxes, even when their names are cut.
	if SandboxName("default", long+"1", nil) == SandboxName("default", long+"2", nil) {
		t.Error("two long IDs gave one name")
	}
	if SandboxName("k8s.io", "id1", pod) == SandboxName("k8s.io", "id2", pod) {
		t.Error("a restarted container got its predecessor's name")
	}
}

// Tasks group by the CRI plugin's annotations: the sandbox container is
// the pod's VM, app containers run in their pod's, anything else alone.
func TestClassify(t *testing.T) {
	pod := func(typ string) map[string]string {
		return map[string]string{ContainerTypeAnnotation: typ, SandboxIDAnnotation: "p1"}
	}
	for _, c := range []struct {
		id    string
		ann   map[string]string
		kind  kind
		vm    string
		group string
	}{
		{"t1", nil, standalone, "t1", "t1"},
		{"p1", pod("sandbox"), podSandbox, "p1", "p1"},
		{"c1", pod("container"), podContainer, "p1", "p1"},
		{"c2", map[string]string{ContainerTypeAnnotation: "container"}, standalone, "c2", "c2"},
	} {
		k, vm := classify(c.id, c.ann)
		if k != c.kind || vm != c.vm || groupID(c.id, c.ann) != c.group {
			t.Errorf("%s %v: %v in %s (group %s), want %v in %s (group %s)", c.id, c.ann, k, vm, groupID(c.id, c.ann), c.kind, c.vm, c.group)
		}
	}
	// A pod's VM is named like its pause container, whichever container asks.
	ann := map[string]string{"io.kubernetes.cri.sandbox-namespace": "ns", "io.kubernetes.cri.sandbox-name": "web",
		"io.kubernetes.cri.container-name": "app"}
	if n := podName("k8s.io", "p1", ann); !strings.HasPrefix(n, "k8s-ns-web-") || strings.Contains(n, "app") {
		t.Errorf("podName: %q", n)
	}
}
