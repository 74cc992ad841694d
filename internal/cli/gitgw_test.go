package cli_test

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/smx-dev/smx/internal/testutil"
)

// TestGitGateway: an agent in a sandbox with no token clones, fetches and
// pushes through the Git gateway with plain https:// URLs. The forge is a
// real git http-backend behind HTTPS and basic auth, in a network
// namespace; the token stays on the host, main is refused with a message
// the agent reads, a denied repository fails with Git's own error, and
// every action is in the sandbox's log.
func TestGitGateway(t *testing.T) {
	testutil.RequireQEMU(t)
	h := testutil.NewNetHost(t)
	const token = "ghp_vmtest_3a9f6e21c0d84b57"
	v, forge, image := newForgeVM(t, h, h.PublicIPs[0].String(), token, "gitgw")
	forge.NewRepo(t, "acme/app.git", 3)
	forge.NewRepo(t, "acme/secret.git", 1)
	profile := filepath.Join(t.TempDir(), "git.yaml")
	os.WriteFile(profile, []byte(`network:
  mode: default-deny
  allow:
    - domain: forge.test
      ports: [8443]
git:
  repos:
    - repo: forge.test/acme/*
      read: allow
      push: allow
      refs:
        - ref: refs/heads/main
          push: deny
    - repo: forge.test/acme/secret
      read: deny
credentials:
  - name: forge
    from: forge-token
    forge: forge.test
    methods: [GET]
    paths: [/api/repos/acme/*/pulls]
`), 0o644)
	hosts := testutil.HostsFile(t, map[string]string{"forge.test": h.PublicIPs[0].String()})
	v.createStart(v.name, image, profile, []string{"SMX_HOSTS_FILE=" + hosts, "SMX_EXTRA_CA_FILE=" + forge.CAFile})

	script := `export HOME=/root; cd /root
git config --global user.name agent; git config --global user.email agent@example.test
git clone -q https://forge.test:8443/acme/app app && echo CLONE-OK
cd app && git checkout -q -b agent/fix-123 && echo fix > fix.txt && git add fix.txt && git commit -qm fix
git push -q origin agent/fix-123 && echo PUSH-OK
git push origin agent/fix-123:main 2>&1; echo PUSH-MAIN-RC=$?
git -c protocol.version=2 fetch -q origin && echo FETCH-OK
git clone -q --depth 1 https://forge.test:8443/acme/app /root/shallow && echo SHALLOW-OK
git -c protocol.version=0 clone -q https://forge.test:8443/acme/app /root/v0 && echo V0-OK
git clone -q https://forge.test:8443/ACME/x/../Secret.git /root/secret 2>&1; echo SECRET-RC=$?
echo API-PULLS-$(curl -s https://forge.test:8443/api/repos/acme/app/pulls)
echo API-POST-$(curl -s -X POST https://forge.test:8443/api/repos/acme/app/pulls)
echo API-USER-$(curl -s https://forge.test:8443/api/user)
echo API-DOTS-$(curl -s --path-as-is https://forge.test:8443/api/repos/acme/app/../../../user/pulls)
`
	out, err := v.smx("agent", "exec", v.name, "--", "sh", "-c", script)
	if err != nil {
		t.Fatalf("guest script: %v\n%s", err, out)
	}
	for _, want := range []string{
		"API-PULLS-auth=yes", "API-POST-auth=no", "API-USER-auth=no", "API-DOTS-auth=no",
		"CLONE-OK", "PUSH-OK", "FETCH-OK", "SHALLOW-OK", "V0-OK", "PUSH-MAIN-RC=1", "SECRET-RC=128",
		"! [remote rejected] agent/fix-123 -> main (smx: push to refs/heads/main denied by rule git.repos[0].refs[0] repo forge.test/acme/* ref refs/heads/main (profile git, git.yaml:12:11))",
		"fatal: remote error: smx: reading forge.test/acme/secret denied by rule git.repos[1] repo forge.test/acme/secret (profile git, git.yaml:14:7)",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("guest output lacks %q", want)
		}
	}
	if t.Failed() {
		t.Fatalf("guest output:\n%s", out)
	}
	pushed := testutil.Git(t, filepath.Join(forge.Root, "acme/app.git"), "rev-parse", "refs/heads/agent/fix-123")
	if len(pushed) != 40 {
		t.Fatalf("agent/fix-123 is not on the forge: %q", pushed)
	}
	for _, r := range forge.Requests() {
		if strings.Contains(r, "/api/") {
			continue
		}
		if !strings.HasSuffix(r, "auth=yes") || strings.Contains(strings.ToLower(r), "secret") {
			t.Errorf("forge request %s", r)
		}
	}

	// The token is nowhere in the guest: environments, files, the
	// clone's .git/config, memory. The pattern must not carry it in.
	pattern := token[:len(token)-1] + "[" + token[len(token)-1:] + "]"
	out, _ = v.smx("agent", "exec", v.name, "--", "sh", "-c",
		"cat /proc/[0-9]*/environ 2>/dev/null | tr '\\0' '\\n' | grep -c '"+pattern+"'; grep -r -l '"+pattern+"' /etc /root /tmp /home /run /var/tmp 2>/dev/null; cat /root/app/.git/config; echo scanned")
	if strings.Contains(out, token) || !strings.Contains(out, "url = https://forge.test:8443/acme/app") || !strings.Contains(out, "scanned") {
		t.Fatalf("guest scan:\n%s", out)
	}
	const canary = "canary-9d2e4f7a1b"
	if out, err := v.smx("agent", "exec", v.name, "--", "sh", "-c", "echo "+canary+" > /tmp/canary"); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	ram := dumpGuestRAM(t, v, 512<<20)
	if !bytes.Contains(ram, []byte(canary)) {
		t.Fatal("the memory dump does not show what the guest holds")
	}
	if bytes.Contains(ram, []byte(token)) {
		t.Fatal("the token is in the guest's memory")
	}

	logs, err := v.smx("agent", "logs", v.name, "--json")
	if err != nil {
		t.Fatalf("logs: %v\n%s", err, logs)
	}
	for _, want := range []string{`"kind":"git.fetch"`, `"kind":"git.push"`, `"kind":"git.refused"`, `"credential":"forge"`, `"kind":"cred.use"`, `"path":"/api/repos/acme/app/pulls"`,
		`"repo":"forge.test/acme/app"`, `"repo":"forge.test/acme/secret"`, `"ref":"refs/heads/main"`, `"ref":"refs/heads/agent/fix-123"`} {
		if !strings.Contains(logs, want) {
			t.Errorf("log lacks %s", want)
		}
	}
	if strings.Contains(logs, token) {
		t.Fatal("the token is in the log")
	}
	if out, err := v.smx("agent", "logs", v.name, "--verify"); err != nil {
		t.Fatalf("logs --verify: %v\n%s", err, out)
	}
	refusals, _ := v.smx("agent", "logs", v.name, "--refusals")
	if !strings.Contains(refusals, "git.refused") || !strings.Contains(refusals, "refs/heads/main") {
		t.Errorf("--refusals:\n%s", refusals)
	}
	if t.Failed() {
		t.Logf("log:\n%s", logs)
	}
}
