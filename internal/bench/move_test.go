package bench

import (
	"encoding/json"
	"fmt"
	"io"
	"log"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/registry"
)

// BenchmarkPullRestore compares, on a second host (a state directory of
// its own that never saw the sandbox), a cold boot to the first exec with
// a pull from a registry (go-containerregistry's, on loopback) and a start
// from what was pulled to the first exec: a snapshot (pull, restore,
// exec) and a boot template (pull, create, start, exec). Each round pulls
// afresh (what the round before pulled is removed first), and the three
// run in turn in every round, so they see the same load. The ratios of
// the medians are reported as metrics (goal: pull+restore/cold ≤ 0.5).
func BenchmarkPullRestore(b *testing.B) {
	setup(b)
	reg := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	defer reg.Close()
	addr := strings.TrimPrefix(reg.URL, "http://")

	homeB, err := os.MkdirTemp("", "smx-bench-b-")
	if err != nil {
		b.Fatal(err)
	}
	defer os.RemoveAll(homeB)
	if err := os.Symlink(filepath.Join(home, "kernels"), filepath.Join(homeB, "kernels")); err != nil {
		b.Fatal(err)
	}
	onB := func(args ...string) (string, error) {
		cmd := exec.Command(filepath.Join(bin, "smx"), args...)
		cmd.Env = append(os.Environ(), "SMX_HOME="+homeB, "XDG_CONFIG_HOME="+filepath.Join(homeB, ".config"))
		out, err := cmd.CombinedOutput()
		if err != nil {
			return string(out), fmt.Errorf("smx (B) %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return string(out), nil
	}
	must := func(out string, err error) string {
		b.Helper()
		if err != nil {
			b.Fatal(err)
		}
		return out
	}
	must(onB("image", "build", "busybox", "--from", "busybox"))

	// On A: a sandbox whose first start saves a template, and a snapshot
	// of it; both pushed.
	src := "bench-move-src"
	smx("agent", "rm", "-f", src)
	must(smx("agent", "create", src, "--memory", "512M"))
	defer smx("agent", "rm", "-f", src)
	must(smx("agent", "start", src))
	must(smx("agent", "exec", src, "--", "true"))
	smx("snapshot", "rm", "bench-move")
	must(smx("snapshot", "create", src, "--name", "bench-move"))
	defer smx("snapshot", "rm", "bench-move")
	var sb struct {
		Spec struct {
			Template string `json:"template"`
		} `json:"spec"`
	}
	json.Unmarshal([]byte(must(smx("agent", "inspect", src, "--json"))), &sb)
	tpl := sb.Spec.Template
	if tpl == "" {
		var list []struct {
			Name string `json:"name"`
		}
		json.Unmarshal([]byte(must(smx("template", "ls", "--json"))), &list)
		if len(list) == 0 {
			b.Fatal("A has no boot template")
		}
		tpl = list[0].Name
	}
	keyA := filepath.Join(b.TempDir(), "a.pub")
	os.WriteFile(keyA, []byte(must(smx("logs", "export-key"))), 0o644)
	snapRef, tplRef := addr+"/bench/snap:1", addr+"/bench/tpl:1"
	must(smx("snapshot", "push", "bench-move", snapRef))
	must(smx("template", "push", tpl, tplRef))

	var cold, snap, tmpl []time.Duration
	timed := func(fn func()) time.Duration { t := time.Now(); fn(); return time.Since(t) }
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		cold = append(cold, timed(func() {
			must(onB("agent", "create", "cold", "--memory", "512M"))
			must(onB("agent", "start", "--cold", "cold"))
			must(onB("agent", "exec", "cold", "--", "true"))
		}))
		b.StopTimer()
		onB("agent", "rm", "-f", "cold")
		onB("snapshot", "rm", "moved")
		b.StartTimer()
		snap = append(snap, timed(func() {
			must(onB("snapshot", "pull", snapRef, "--key", keyA, "--name", "moved"))
			must(onB("agent", "restore", "moved", "--name", "restored"))
			must(onB("agent", "exec", "restored", "--", "true"))
		}))
		b.StopTimer()
		onB("agent", "rm", "-f", "restored")
		onB("template", "rm", "--all")
		b.StartTimer()
		tmpl = append(tmpl, timed(func() {
			must(onB("template", "pull", tplRef, "--key", keyA))
			must(onB("agent", "create", "fromtpl", "--memory", "512M"))
			must(onB("agent", "start", "fromtpl"))
			must(onB("agent", "exec", "fromtpl", "--", "true"))
		}))
		b.StopTimer()
		var st struct {
			Spec struct {
				Template string `json:"template"`
			} `json:"spec"`
		}
		json.Unmarshal([]byte(must(onB("agent", "inspect", "fromtpl", "--json"))), &st)
		if st.Spec.Template != tpl {
			b.Fatalf("B's sandbox did not start from the pulled template %s (%q)", tpl, st.Spec.Template)
		}
		onB("agent", "rm", "-f", "fromtpl")
		b.StartTimer()
	}
	b.StopTimer()
	med := func(d []time.Duration) float64 {
		s := slices.Clone(d)
		slices.Sort(s)
		return float64(s[len(s)/2])
	}
	b.ReportMetric(med(cold)/1e6, "cold-ms")
	b.ReportMetric(med(snap)/1e6, "pull+restore-ms")
	b.ReportMetric(med(tmpl)/1e6, "pull+template-ms")
	b.ReportMetric(med(snap)/med(cold), "pull+restore/cold")
	b.ReportMetric(med(tmpl)/med(cold), "pull+template/cold")
	b.Logf("cold %v; pull+restore %v; pull+template %v", cold, snap, tmpl)
}
