package agentconf

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

const secret = "sk-ant-oat01-SECRETVALUE"

func write(t *testing.T, root, rel, content string) {
	t.Helper()
	p := filepath.Join(root, rel)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestCollectClaude: the allow-list's files arrive, with the host home
// rewritten; credentials, history, projects, a symlink out of the folder
// and secret-looking settings do not.
func TestCollectClaude(t *testing.T) {
	home := t.TempDir()
	write(t, home, ".claude/settings.json", `{"model":"opus","env":{"ANTHROPIC_API_KEY":"`+secret+`","FOO":"bar"},
	 "apiKeyHelper":"/bin/key","hooks":{"Stop":[{"hooks":[{"type":"command","command":"`+home+`/.claude/hooks/done.sh"}]}]}}`)
	write(t, home, ".claude/CLAUDE.md", "be brief\n")
	write(t, home, ".claude/agents/rev.md", "reviewer\n")
	write(t, home, ".claude/skills/x/SKILL.md", "skill\n")
	write(t, home, ".claude/hooks/done.sh", "#!/bin/sh\necho done\n")
	os.Chmod(filepath.Join(home, ".claude/hooks/done.sh"), 0o755)
	write(t, home, ".claude/.credentials.json", `{"claudeAiOauth":{"accessToken":"`+secret+`"}}`)
	write(t, home, ".claude/history.jsonl", secret+"\n")
	write(t, home, ".claude/projects/p/s.jsonl", secret+"\n")
	write(t, home, ".claude/todos/t.json", secret+"\n")
	write(t, home, "outside.md", secret+"\n")
	os.Symlink(filepath.Join(home, "outside.md"), filepath.Join(home, ".claude/commands/leak.md"))
	os.MkdirAll(filepath.Join(home, ".claude/commands"), 0o755)
	os.Symlink(filepath.Join(home, "outside.md"), filepath.Join(home, ".claude/commands/leak.md"))
	write(t, home, ".claude/commands/ok.md", "ok\n")
	os.Symlink("ok.md", filepath.Join(home, ".claude/commands/alias.md"))
	write(t, home, ".claude.json", `{"oauthAccount":{"emailAddress":"a@b"},"userID":"`+secret+`","projects":{"/x":{}},
	 "mcpServers":{"gh":{"command":"npx","args":["gh-mcp"],"env":{"GITHUB_TOKEN":"ghp_zzz","LEVEL":"1"}},
	 "web":{"type":"http","url":"https://mcp.example/","headers":{"Authorization":"Bearer `+secret+`"}}}}`)

	imp, err := Collect(home, "claude", "/home/user")
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]File{}
	for _, f := range imp.Files {
		got[f.Path] = f
		if strings.Contains(string(f.Data), secret) || strings.Contains(string(f.Data), "ghp_") {
			t.Errorf("%s carries a secret:\n%s", f.Path, f.Data)
		}
	}
	for _, want := range []string{".claude/settings.json", ".claude/CLAUDE.md", ".claude/agents/rev.md", ".claude/skills/x/SKILL.md",
		".claude/hooks/done.sh", ".claude/commands/ok.md", ".claude/commands/alias.md", ".claude.json"} {
		if _, ok := got[want]; !ok {
			t.Errorf("%s not imported (skipped: %q)", want, imp.Skipped)
		}
	}
	for _, no := range []string{".claude/.credentials.json", ".claude/history.jsonl", ".claude/projects/p/s.jsonl", ".claude/todos/t.json", ".claude/commands/leak.md"} {
		if _, ok := got[no]; ok {
			t.Errorf("%s imported", no)
		}
	}
	if !got[".claude/hooks/done.sh"].Exec {
		t.Error("hook script lost its execute bit")
	}
	s := string(got[".claude/settings.json"].Data)
	if !strings.Contains(s, `"/home/user/.claude/hooks/done.sh"`) || !strings.Contains(s, `"FOO": "bar"`) || strings.Contains(s, "apiKeyHelper") {
		t.Errorf("settings.json:\n%s", s)
	}
	cj := string(got[".claude.json"].Data)
	if !strings.Contains(cj, `"LEVEL": "1"`) || strings.Contains(cj, "oauthAccount") || strings.Contains(cj, "projects") || strings.Contains(cj, "Authorization") {
		t.Errorf(".claude.json:\n%s", cj)
	}
	if !strings.Contains(strings.Join(imp.Skipped, "\n"), "leak.md: a symlink that leads out") {
		t.Errorf("skipped: %q", imp.Skipped)
	}
}

// TestCollectCodexTOML: secret-looking entries leave config.toml, plain,
// inline and multi-line ones alike; auth.json stays behind.
func TestCollectCodexTOML(t *testing.T) {
	home := t.TempDir()
	write(t, home, ".codex/config.toml", `model = "o3"
experimental_bearer_token = "abc"
[mcp_servers.gh]
command = "npx"
args = [
  "gh-mcp",
]
env = { GITHUB_TOKEN = "ghp_x", LEVEL = "1" }
[mcp_servers.gh.env]
API_KEY = "zzz"
MODE = "fast"
[model_providers.p]
http_headers = { "X-Key" = "sk-abc" }
base_url = "https://p.example"
`)
	write(t, home, ".codex/auth.json", `{"OPENAI_API_KEY":"`+secret+`"}`)
	write(t, home, ".codex/prompts/fix.md", "fix it\n")
	imp, err := Collect(home, "codex", "/home/user")
	if err != nil {
		t.Fatal(err)
	}
	var cfg string
	for _, f := range imp.Files {
		if f.Path == ".codex/auth.json" {
			t.Error("auth.json imported")
		}
		if f.Path == ".codex/config.toml" {
			cfg = string(f.Data)
		}
	}
	want := "model = \"o3\"\n[mcp_servers.gh]\ncommand = \"npx\"\nargs = [\n  \"gh-mcp\",\n]\n[mcp_servers.gh.env]\nMODE = \"fast\"\n[model_providers.p]\nbase_url = \"https://p.example\"\n"
	if cfg != want {
		t.Errorf("config.toml:\n%s\nwant:\n%s", cfg, want)
	}
	if len(imp.Files) != 2 {
		t.Errorf("files: %v", imp.Files)
	}
}

// TestMergeTOML: the preset's keys and tables replace the user's of the
// same name, the user's others stay, top-level keys before tables.
func TestMergeTOML(t *testing.T) {
	user := "model = \"o3\"\npreferred_auth_method = \"chatgpt\"\nlist = [\n  1,\n]\n[projects.\"/work\"]\ntrust_level = \"untrusted\"\n[mcp_servers.gh]\ncommand = \"npx\"\n"
	mine := "preferred_auth_method = \"apikey\"\n[projects.\"/work\"]\ntrust_level = \"trusted\"\n"
	want := "preferred_auth_method = \"apikey\"\nmodel = \"o3\"\nlist = [\n  1,\n]\n[mcp_servers.gh]\ncommand = \"npx\"\n[projects.\"/work\"]\ntrust_level = \"trusted\"\n"
	if got := MergeTOML(user, mine); got != want {
		t.Errorf("MergeTOML:\n%s\nwant:\n%s", got, want)
	}
}
