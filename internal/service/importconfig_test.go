package service

import (
	"strings"
	"testing"

	"github.com/smx-dev/smx/internal/preset"
)

// TestMergeImported: where the preset and the user's imported
// configuration write one file, the preset's settings win (its sign-in
// type, its trusted /work) and the user's other settings stay; the
// preset's instructions come first.
func TestMergeImported(t *testing.T) {
	files := []preset.File{
		{Path: "/home/user/.gemini/settings.json", Content: `{"security": {"auth": {"selectedType": "gemini-api-key"}}, "telemetry": {"enabled": false}}`},
		{Path: "/home/user/.gemini/GEMINI.md", Content: "SMX-INSTRUCTIONS\n"},
		{Path: "/home/user/.codex/config.toml", Content: "preferred_auth_method = \"apikey\"\n[projects.\"/work\"]\ntrust_level = \"trusted\"\n"},
	}
	imported := []preset.File{
		{Path: "/home/user/.gemini/settings.json", Content: `{"security": {"auth": {"selectedType": "oauth-personal"}, "folderTrust": {"enabled": true}}, "ui": {"theme": "Dracula"}, "telemetry": {"enabled": true}}`},
		{Path: "/home/user/.gemini/GEMINI.md", Content: "USER-INSTRUCTIONS\n"},
		{Path: "/home/user/.gemini/commands/x.toml", Content: "prompt = \"x\"\n"},
		{Path: "/home/user/.codex/config.toml", Content: "model = \"o3\"\npreferred_auth_method = \"chatgpt\"\n"},
	}
	out := map[string]string{}
	for _, f := range mergeImported(files, imported) {
		out[f.Path] = f.Content
	}
	g := out["/home/user/.gemini/settings.json"]
	for _, want := range []string{`"selectedType": "gemini-api-key"`, `"theme": "Dracula"`, `"folderTrust"`} {
		if !strings.Contains(g, want) {
			t.Errorf("gemini settings.json lacks %s:\n%s", want, g)
		}
	}
	if strings.Contains(g, "oauth-personal") || !strings.Contains(g, `"enabled": false`) || strings.Contains(g, `"telemetry": {"enabled": true`) {
		t.Errorf("gemini settings.json: the user's values won over the preset's:\n%s", g)
	}
	if md := out["/home/user/.gemini/GEMINI.md"]; !strings.HasPrefix(md, "SMX-INSTRUCTIONS\n") || !strings.HasSuffix(md, "USER-INSTRUCTIONS\n") {
		t.Errorf("GEMINI.md:\n%s", md)
	}
	if out["/home/user/.gemini/commands/x.toml"] != "prompt = \"x\"\n" {
		t.Error("a file only the user has is not added")
	}
	if c := out["/home/user/.codex/config.toml"]; c != "preferred_auth_method = \"apikey\"\nmodel = \"o3\"\n[projects.\"/work\"]\ntrust_level = \"trusted\"\n" {
		t.Errorf("codex config.toml:\n%s", c)
	}
}
