package cli_test

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestAgentRunImportConfig: `smx agent run claude --import-config` copies
// the allow-listed part of the user's Claude configuration into the
// guest's home, owned by the guest user, and nothing else: the sign-in,
// history, projects, todos, a file a symlink leads to out of ~/.claude and
// secret-looking settings are absent, which a grep of the whole guest
// home for the secret's value proves. The preset's own files stay in
// force (its onboarding keys, its instructions before the user's).
func TestAgentRunImportConfig(t *testing.T) {
	const secret = "sk-ant-oat01-IMPORTSECRET0123456789"
	script := `cd; find .claude .claude.json -type f | sort; echo ==owners; stat -c '%u:%g %n' .claude/agents/rev.md .claude/hooks/done.sh .claude.json; ` +
		`echo ==exec; test -x .claude/hooks/done.sh && echo hook-exec; echo ==json; cat .claude.json; echo ==settings; cat .claude/settings.json; ` +
		`echo ==md; cat .claude/CLAUDE.md; echo ==grep; grep -rl ` + secret + ` /home /work /tmp /root 2>/dev/null; echo grep-done`
	bin, home := claudeStandIn(t, `command: [sh, -c, '`+strings.ReplaceAll(script, "'", "''")+`']`)

	user := t.TempDir()
	write := func(rel, content string, mode os.FileMode) {
		p := filepath.Join(user, rel)
		os.MkdirAll(filepath.Dir(p), 0o755)
		if err := os.WriteFile(p, []byte(content), mode); err != nil {
			t.Fatal(err)
		}
	}
	write(".claude/settings.json", `{"model":"opus","env":{"ANTHROPIC_API_KEY":"`+secret+`","FOO":"bar"},
	 "hooks":{"Stop":[{"hooks":[{"type":"command","command":"`+user+`/.claude/hooks/done.sh"}]}]}}`, 0o644)
	write(".claude/CLAUDE.md", "USER-INSTRUCTIONS be brief\n", 0o644)
	write(".claude/agents/rev.md", "reviewer\n", 0o644)
	write(".claude/commands/ship.md", "ship it\n", 0o644)
	write(".claude/skills/tidy/SKILL.md", "tidy\n", 0o644)
	write(".claude/hooks/done.sh", "#!/bin/sh\necho done\n", 0o755)
	write(".claude/.credentials.json", `{"claudeAiOauth":{"accessToken":"`+secret+`"}}`, 0o600)
	write(".claude/history.jsonl", `{"display":"`+secret+`"}`+"\n", 0o600)
	write(".claude/projects/-work/s.jsonl", secret+"\n", 0o600)
	write(".claude/todos/t.json", secret+"\n", 0o600)
	write(".claude/statsig/s", secret+"\n", 0o600)
	write("elsewhere.md", secret+"\n", 0o600)
	os.Symlink(filepath.Join(user, "elsewhere.md"), filepath.Join(user, ".claude/commands/leak.md"))
	write(".claude.json", `{"oauthAccount":{"emailAddress":"me@example.com"},"userID":"`+secret+`","projects":{"/x":{"history":["`+secret+`"]}},
	 "mcpServers":{"gh":{"command":"npx","args":["gh-mcp"],"env":{"GITHUB_TOKEN":"`+secret+`","LEVEL":"1"}}}}`, 0o600)

	v := &vmEnv{t: t, bin: bin, home: home, name: "importcfg"}
	t.Cleanup(func() { v.smx("agent", "rm", "-f", v.name) })
	c := v.cmd("agent", "run", "claude", t.TempDir(), "--rm", "--name", v.name, "--memory", "512M", "--import-config")
	c.Env = append(c.Env, "HOME="+user)
	var stdout, stderr bytes.Buffer
	c.Stdout, c.Stderr = &stdout, &stderr
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	timer := time.AfterFunc(4*time.Minute, func() { c.Process.Kill() })
	err := c.Wait()
	if !timer.Stop() {
		t.Fatalf("agent run did not end in 4 minutes\nstdout: %s\nstderr:\n%s", stdout.String(), stderr.String())
	}
	out := stdout.String()
	if err != nil {
		t.Fatalf("agent run: %v\nstdout:\n%s\nstderr:\n%s", err, out, stderr.String())
	}
	section := func(name string) string {
		_, after, _ := strings.Cut(out, "=="+name+"\n")
		before, _, _ := strings.Cut(after, "\n==")
		return before
	}
	files := strings.Fields(strings.SplitN(out, "==owners", 2)[0])
	for _, want := range []string{".claude/settings.json", ".claude/CLAUDE.md", ".claude/agents/rev.md", ".claude/commands/ship.md",
		".claude/skills/tidy/SKILL.md", ".claude/hooks/done.sh", ".claude.json"} {
		if !strings.Contains(strings.Join(files, " ")+" ", want+" ") {
			t.Errorf("%s absent in the guest; files: %q", want, files)
		}
	}
	for _, f := range files {
		// The preset's placeholder sign-in is /home/user/.claude/.credentials.json
		// only with an imported sign-in; none is stored here.
		if strings.Contains(f, "history") || strings.Contains(f, "projects") || strings.Contains(f, "todos") ||
			strings.Contains(f, "statsig") || strings.Contains(f, "leak") || strings.Contains(f, ".credentials") {
			t.Errorf("%s copied into the guest", f)
		}
	}
	if g := section("grep"); strings.TrimSpace(g) != "grep-done" {
		t.Errorf("the secret's value is in the guest:\n%s", g)
	}
	if o := section("owners"); strings.Count(o, "1000:1000 ") != 3 {
		t.Errorf("owners:\n%s", o)
	}
	if !strings.Contains(section("exec"), "hook-exec") {
		t.Error("the hook script is not executable in the guest")
	}
	js := section("json")
	if !strings.Contains(js, `"hasCompletedOnboarding": true`) || !strings.Contains(js, `"LEVEL": "1"`) || strings.Contains(js, "oauthAccount") || strings.Contains(js, "me@example.com") {
		t.Errorf(".claude.json in the guest:\n%s", js)
	}
	if s := section("settings"); !strings.Contains(s, `"/home/user/.claude/hooks/done.sh"`) || !strings.Contains(s, `"FOO": "bar"`) {
		t.Errorf("settings.json in the guest:\n%s", s)
	}
	md := section("md")
	if i, j := strings.Index(md, "smx-why"), strings.Index(md, "USER-INSTRUCTIONS"); i < 0 || j < i {
		t.Errorf("CLAUDE.md: want smx's instructions, then the user's:\n%s", md)
	}
	if !strings.Contains(stderr.String(), "--import-config: .claude/commands/leak.md: a symlink that leads out") ||
		!strings.Contains(stderr.String(), "secret-looking entries left out: env.ANTHROPIC_API_KEY") {
		t.Errorf("stderr does not say what was left out:\n%s", stderr.String())
	}
}
