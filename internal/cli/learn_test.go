package cli_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/smx-dev/smx/internal/testutil"
)

// TestProfileLearn: a scripted workload runs under an open profile
// (HTTP to two subdomains of one parent and to one other host, a clone
// and a push through the Git gateway with a host-held forge token, files
// written in a shared folder); `smx profile learn` writes a profile from
// the sandbox's verified log that passes `profile check`; the same
// workload in a new sandbox under the learned profile is refused
// nothing; one more host is refused, with its record.
func TestProfileLearn(t *testing.T) {
	testutil.RequireQEMU(t)
	h := testutil.NewNetHost(t)
	const token = "ghp_learn_5c1f0e9a7b3d2468"
	v, forge, image := newForgeVM(t, h, h.PublicIPs[3].String(), token, "learn-run")
	forge.NewRepo(t, "acme/app.git", 2)
	dir := t.TempDir()
	// open, plus the forge named so that the Git gateway sees the refs
	// (under plain open a push is an HTTPS flow like any other) and the
	// forge's token.
	runProfile := filepath.Join(dir, "run.yaml")
	os.WriteFile(runProfile, []byte(`extends: open
git:
  repos:
    - repo: forge.test/acme/*
      read: allow
      push: allow
credentials:
  - name: forge
    from: forge-token
    forge: forge.test
`), 0o644)
	hosts := testutil.HostsFile(t, map[string]string{
		"a.svc.example.test": h.PublicIPs[0].String(),
		"b.svc.example.test": h.PublicIPs[1].String(),
		"plain.example.org":  h.PublicIPs[2].String(),
		"more.example.org":   h.PublicIPs[2].String(),
		"forge.test":         h.PublicIPs[3].String(),
	})
	src := t.TempDir()
	start := func(name, profile string) {
		t.Helper()
		v.createStart(name, image, profile, []string{"SMX_HOSTS_FILE=" + hosts, "SMX_EXTRA_CA_FILE=" + forge.CAFile}, "-v", src+":/work")
	}
	workload := `export HOME=/root; cd /root; rm -rf app
git config --global user.name agent; git config --global user.email agent@example.test
for h in a.svc.example.test b.svc.example.test plain.example.org; do curl -sf -o /dev/null http://$h/ && echo GET-$h-OK; done
git clone -q https://forge.test:8443/acme/app app && echo CLONE-OK
cd app && git checkout -q -b agent/learn origin/agent/learn 2>/dev/null || git checkout -q -b agent/learn
echo "run $RUN" >> notes.txt && git add notes.txt && git commit -qm "run $RUN" && git push -q origin agent/learn && echo PUSH-OK
mkdir -p /work/out && for f in a b c; do echo "$RUN" > /work/out/$f.txt; done && echo "$RUN" > /work/summary.txt && echo FILES-OK
`
	wantOK := []string{"GET-a.svc.example.test-OK", "GET-b.svc.example.test-OK", "GET-plain.example.org-OK", "CLONE-OK", "PUSH-OK", "FILES-OK"}
	runWorkload := func(name, run string) {
		t.Helper()
		out, err := v.smx("agent", "exec", name, "--env", "RUN="+run, "--", "sh", "-c", workload)
		if err != nil {
			t.Fatalf("workload in %s: %v\n%s", name, err, out)
		}
		for _, w := range wantOK {
			if !strings.Contains(out, w) {
				t.Errorf("%s: workload output lacks %s", name, w)
			}
		}
		if t.Failed() {
			t.Fatalf("workload output:\n%s", out)
		}
	}

	start(v.name, runProfile)
	runWorkload(v.name, "1")
	// Stopped, the log is closed and signed to its end.
	if out, err := v.smx("agent", "stop", v.name); err != nil {
		t.Fatalf("stop: %v\n%s", err, out)
	}
	learned := filepath.Join(dir, "learned.yaml")
	out, err := v.smx("profile", "learn", v.name, "-o", learned)
	if err != nil {
		t.Fatalf("learn: %v\n%s", err, out)
	}
	if strings.Contains(out, "would still be refused") {
		t.Errorf("learn notes:\n%s", out)
	}
	b, _ := os.ReadFile(learned)
	y := string(b)
	t.Logf("learned profile:\n%s\nlearn said:\n%s", y, out)
	for _, want := range []string{
		"mode: default-deny",
		`domain: "*.svc.example.test"`,
		"# 2 names under svc.example.test reached: a.svc.example.test, b.svc.example.test; from net.flow #",
		"domain: plain.example.org",
		"domain: forge.test",
		"repo: forge.test/acme/app",
		"ref: refs/heads/agent/learn",
		"path: /work/out/**",
		"path: /work/summary.txt",
		"forge: forge.test",
		"from file.write #",
		"from git.push #",
	} {
		if !strings.Contains(y, want) {
			t.Errorf("learned profile lacks %q", want)
		}
	}
	if strings.Contains(y, "more.example.org") || strings.Contains(y, "refs/heads/main") || strings.Contains(y, token) {
		t.Error("learned profile allows more than the run did")
	}
	if out, err := v.smx("profile", "check", learned); err != nil || !strings.Contains(out, "learned.yaml: ok") {
		t.Fatalf("profile check: %v\n%s", err, out)
	}
	c := v.cmd("profile", "diff", "open", learned)
	out2, err := c.Output()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 1 || !strings.Contains(string(out2), "+ network.allow: {domain: '*.svc.example.test', ports: [80]}") {
		t.Errorf("profile diff open learned: %v\n%s", err, out2)
	}
	if t.Failed() {
		logs, _ := v.smx("agent", "logs", v.name)
		t.Fatalf("log of %s:\n%s", v.name, logs)
	}

	// The same workload under the learned profile: nothing refused.
	const rerun = "learn-rerun"
	start(rerun, learned)
	runWorkload(rerun, "2")
	if out, err := v.smx("agent", "logs", rerun, "--refusals"); err != nil || strings.TrimSpace(out) != "" {
		t.Fatalf("refusals under the learned profile (%v):\n%s", err, out)
	}
	// One more host: refused, and the log says so.
	out, _ = v.smx("agent", "exec", rerun, "--", "sh", "-c", "curl -s -o /dev/null http://more.example.org/; echo RC=$?; echo x > /work/elsewhere.txt; echo WRITE-RC=$?")
	if strings.Contains(out, "RC=0\n") || !strings.Contains(out, "Read-only file system") || strings.Contains(out, "WRITE-RC=0") {
		t.Errorf("more.example.org or /work/elsewhere.txt was not refused:\n%s", out)
	}
	// A refused lookup is logged once a second with a count: wait for it.
	var refusals string
	for i := 0; i < 20; i++ {
		refusals, _ = v.smx("agent", "logs", rerun, "--refusals")
		if strings.Contains(refusals, "more.example.org") {
			break
		}
		time.Sleep(500 * time.Millisecond)
	}
	if !strings.Contains(refusals, "net.refused") || !strings.Contains(refusals, "more.example.org") ||
		!strings.Contains(refusals, "file.refused") || !strings.Contains(refusals, "/work/elsewhere.txt") {
		t.Errorf("the refusals are not in the log:\n%s", refusals)
	}
	if got := testutil.Git(t, filepath.Join(forge.Root, "acme/app.git"), "log", "-1", "--format=%s", "refs/heads/agent/learn"); got != "run 2" {
		t.Errorf("agent/learn on the forge is %q, want the rerun's commit", got)
	}
}

// TestProfileLearnSSH: SSH sessions through the gateway (one with sftp,
// one with a host-held key) are learned as SSH rules and an ssh_host
// credential, only for the hosts used; under the learned profile the same
// sessions pass and a host the run did not use is refused.
func TestProfileLearnSSH(t *testing.T) {
	e := startSSHEnv(t, "learnssh")
	script := "ssh " + sshOpts + " root@build1.test 'echo EXEC-OK' && echo 'ls /' | sftp " + sshOpts + " -b - root@build1.test >/dev/null && echo SFTP-OK && " +
		"ssh " + sshOpts + " root@legacy.test 'echo KEY-OK'"
	run := func() {
		t.Helper()
		out, code := e.guestSSH(script)
		if code != 0 || !strings.Contains(out, "EXEC-OK") || !strings.Contains(out, "SFTP-OK") || !strings.Contains(out, "KEY-OK") {
			t.Fatalf("ssh workload: code %d\n%s", code, out)
		}
	}
	run()
	if out, err := e.smx("agent", "stop", e.name); err != nil {
		t.Fatalf("stop: %v\n%s", err, out)
	}
	learned := filepath.Join(e.dir, "learned.yaml")
	out, err := e.smx("profile", "learn", e.name, "-o", learned)
	if err != nil || strings.Contains(out, "would still be refused") {
		t.Fatalf("learn: %v\n%s", err, out)
	}
	b, _ := os.ReadFile(learned)
	y := string(b)
	t.Logf("learned:\n%s", y)
	for _, want := range []string{"host: build1.test", "sftp: allow", "host: legacy.test", "ssh_host: legacy.test", "from: legacy-key", "from ssh.session #"} {
		if !strings.Contains(y, want) {
			t.Errorf("learned profile lacks %q", want)
		}
	}
	for _, not := range []string{"nosftp.test", "changed.test", "forge.test", "admin"} {
		if strings.Contains(y, not) {
			t.Errorf("learned profile names %s, which the run never used", not)
		}
	}
	if out, err := e.smx("profile", "check", learned); err != nil {
		t.Fatalf("check: %v\n%s", err, out)
	}
	if t.Failed() {
		t.FailNow()
	}
	if out, err := e.smx("agent", "policy", e.name, learned); err != nil {
		t.Fatalf("policy: %v\n%s", err, out)
	}
	c := e.cmd("agent", "start", e.name)
	c.Env = append(c.Env, e.hostEnv...)
	if out, err := c.CombinedOutput(); err != nil {
		t.Fatalf("start: %v\n%s", err, out)
	}
	mark := e.records(t, false)
	run()
	for _, r := range e.records(t, true) {
		if r.Seq > mark[len(mark)-1].Seq {
			t.Errorf("refused under the learned profile: %s %v", r.Kind, r.Fields)
		}
	}
	if out, code := e.guestSSH("ssh " + sshOpts + " root@nosftp.test true"); code == 0 {
		t.Errorf("nosftp.test (not used by the run) was reached:\n%s", out)
	}
}
