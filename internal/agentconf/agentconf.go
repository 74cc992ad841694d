// Package agentconf picks the part of a user's Claude Code, Codex or Gemini
// CLI configuration that may be copied into a guest (`smx agent run
// --import-config`): settings, instructions, sub-agents, commands, skills,
// hooks and MCP server definitions, never sign-ins, keys, history or
// sessions.
//
// It works from an allow-list: only the files and folders named in Sources
// are read, each through an os.Root on its configuration folder, so a
// symlink that leads out of that folder is refused rather than followed.
// What is read is bounded (per file, in all, in count). Settings files
// (JSON, TOML) lose every entry whose name or value looks like a secret
// (a token, key, password, Authorization header); the host's home path in
// them becomes the guest's. Instruction, command, skill and hook files are
// copied as they are.
package agentconf

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"regexp"
	"slices"
	"strings"
)

// Limits on what one import reads.
const (
	MaxFile  = 1 << 20  // one file
	MaxTotal = 16 << 20 // all files
	MaxFiles = 2000
	// maxClaudeJSON bounds ~/.claude.json, which also holds the CLI's
	// per-project history and grows large; only mcpServers is kept.
	maxClaudeJSON = 64 << 20
)

// Source is one agent's importable configuration: files and folders under
// Dir (relative to the home), and Extra, a handler for a file outside Dir.
type Source struct {
	Dir   string   // e.g. ".claude"
	Files []string // files under Dir, copied when present
	Trees []string // folders under Dir, copied whole (within the limits)
	// Settings are the files of Files scrubbed of secret-looking entries.
	Settings []string
}

// Sources are the allow-lists, by agent (preset.OAuthLogin.Import names).
var Sources = map[string]Source{
	"claude": {Dir: ".claude",
		Files:    []string{"settings.json", "settings.local.json", "CLAUDE.md"},
		Trees:    []string{"agents", "commands", "skills", "hooks", "output-styles"},
		Settings: []string{"settings.json", "settings.local.json"}},
	"codex": {Dir: ".codex",
		Files:    []string{"config.toml", "AGENTS.md"},
		Trees:    []string{"prompts"},
		Settings: []string{"config.toml"}},
	"gemini": {Dir: ".gemini",
		Files:    []string{"settings.json", "GEMINI.md"},
		Trees:    []string{"commands"},
		Settings: []string{"settings.json"}},
}

// File is one file to write in the guest, Path relative to the guest
// user's home.
type File struct {
	Path string
	Data []byte
	Exec bool
}

// Import is what Collect found.
type Import struct {
	Files []File
	// Skipped says, one line each, what was left out and why (a symlink
	// out of the folder, a file over the limit, secret-looking entries).
	Skipped []string
}

// Collect reads agent's importable configuration under home (the host
// user's) for a guest whose home is guestHome. A configuration folder
// that does not exist gives an empty Import, not an error.
func Collect(home, agent, guestHome string) (*Import, error) {
	src, ok := Sources[agent]
	if !ok {
		return nil, fmt.Errorf("agentconf: no configuration to import for %q (claude, codex and gemini have one)", agent)
	}
	imp := &Import{}
	c := &collector{imp: imp, home: strings.TrimSuffix(home, "/"), guestHome: strings.TrimSuffix(guestHome, "/")}
	root, err := os.OpenRoot(path.Join(home, src.Dir))
	if err == nil {
		defer root.Close()
		for _, f := range src.Files {
			c.file(root, src.Dir, f, slices.Contains(src.Settings, f))
		}
		for _, t := range src.Trees {
			c.tree(root, src.Dir, t)
		}
	} else if !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("agentconf: %w", err)
	}
	if agent == "claude" {
		c.claudeMCP()
	}
	return imp, c.err
}

type collector struct {
	imp             *Import
	home, guestHome string
	total           int
	err             error
}

func (c *collector) skip(format string, a ...any) {
	c.imp.Skipped = append(c.imp.Skipped, fmt.Sprintf(format, a...))
}

// read reads name under root, bounded; a missing file is (nil, nil).
func (c *collector) read(root *os.Root, dir, name string, limit int64) ([]byte, os.FileMode, error) {
	f, err := root.Open(name)
	if errors.Is(err, fs.ErrNotExist) {
		if _, lerr := root.Lstat(name); lerr == nil {
			// Present, yet not openable within the root: a symlink out.
			c.skip("%s/%s: a symlink that leads out of ~/%s", dir, name, dir)
		}
		return nil, 0, nil
	}
	if err != nil {
		c.skip("%s/%s: %v", dir, name, err)
		return nil, 0, nil
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil || !st.Mode().IsRegular() {
		return nil, 0, nil
	}
	b, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil {
		return nil, 0, err
	}
	if int64(len(b)) > limit {
		c.skip("%s/%s: larger than %d bytes", dir, name, limit)
		return nil, 0, nil
	}
	return b, st.Mode(), nil
}

func (c *collector) add(p string, b []byte, mode os.FileMode) {
	if len(c.imp.Files) >= MaxFiles || c.total+len(b) > MaxTotal {
		c.skip("%s: over the import's limit (%d files, %d bytes)", p, MaxFiles, MaxTotal)
		return
	}
	c.total += len(b)
	c.imp.Files = append(c.imp.Files, File{Path: p, Data: b, Exec: mode&0o111 != 0})
}

func (c *collector) file(root *os.Root, dir, name string, settings bool) {
	b, mode, err := c.read(root, dir, name, MaxFile)
	if err != nil {
		c.skip("%s/%s: %v", dir, name, err)
	}
	if b == nil {
		return
	}
	if settings {
		var dropped []string
		if strings.HasSuffix(name, ".toml") {
			b, dropped = scrubTOML(b)
		} else if b, dropped, err = c.scrubJSON(b); err != nil {
			c.skip("%s/%s: not JSON (%v); not copied", dir, name, err)
			return
		}
		if len(dropped) > 0 {
			c.skip("%s/%s: secret-looking entries left out: %s", dir, name, strings.Join(dropped, ", "))
		}
		b = c.rehome(b)
	}
	c.add(path.Join(dir, name), b, mode)
}

func (c *collector) tree(root *os.Root, dir, top string) {
	fsys := root.FS()
	if _, err := fs.Stat(fsys, top); err != nil {
		if _, lerr := root.Lstat(top); lerr == nil {
			c.skip("%s/%s: a symlink that leads out of ~/%s", dir, top, dir)
		}
		return
	}
	fs.WalkDir(fsys, top, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			c.skip("%s/%s: %v", dir, p, err)
			return nil
		}
		if d.IsDir() {
			return nil
		}
		if d.Type()&fs.ModeSymlink != 0 {
			// Followed only when it stays inside the folder (and is
			// then copied as a file); a folder reached by a symlink is
			// not walked.
			st, err := fs.Stat(fsys, p)
			if err != nil {
				c.skip("%s/%s: a symlink that leads out of ~/%s", dir, p, dir)
				return nil
			}
			if !st.Mode().IsRegular() {
				c.skip("%s/%s: a symlink to a folder, not followed", dir, p)
				return nil
			}
		} else if !d.Type().IsRegular() {
			return nil
		}
		b, mode, err := c.read(root, dir, p, MaxFile)
		if err != nil {
			c.skip("%s/%s: %v", dir, p, err)
		}
		if b != nil {
			c.add(path.Join(dir, p), b, mode)
		}
		return nil
	})
}

// claudeMCP takes mcpServers from ~/.claude.json, and nothing else of it:
// the rest is the CLI's account, sign-in state and per-project history.
func (c *collector) claudeMCP() {
	root, err := os.OpenRoot(c.home)
	if err != nil {
		return
	}
	defer root.Close()
	b, _, err := c.read(root, "~", ".claude.json", maxClaudeJSON)
	if err != nil || b == nil {
		return
	}
	var all map[string]json.RawMessage
	if err := json.Unmarshal(b, &all); err != nil {
		c.skip(".claude.json: not JSON (%v); its MCP servers are not copied", err)
		return
	}
	servers, ok := all["mcpServers"]
	if !ok {
		return
	}
	out, dropped, err := c.scrubJSON(append(append([]byte(`{"mcpServers":`), servers...), '}'))
	if err != nil {
		return
	}
	if len(dropped) > 0 {
		c.skip(".claude.json mcpServers: secret-looking entries left out: %s", strings.Join(dropped, ", "))
	}
	c.add(".claude.json", c.rehome(out), 0o600)
}

// rehome turns the host home's path into the guest's (hook commands,
// MCP server paths).
func (c *collector) rehome(b []byte) []byte {
	if c.home == "" || c.home == "/" || c.guestHome == "" {
		return b
	}
	return bytes.ReplaceAll(b, []byte(c.home+"/"), []byte(c.guestHome+"/"))
}

// secretName matches setting names that hold secrets by convention.
var secretName = regexp.MustCompile(`(?i)(token|secret|passw|api_?key|apikey|private_?key|auth|credential|bearer|cookie|session)`)

// secretValue matches values that look like keys or tokens of the
// common services, and Authorization header values.
var secretValue = regexp.MustCompile(`(?i)^(bearer |basic |token )|^(sk-|ghp_|gho_|ghu_|ghs_|ghr_|github_pat_|glpat-|xox[abposr]-|AIza|ya29\.|AKIA|npm_|hf_)`)

func (c *collector) scrubJSON(b []byte) ([]byte, []string, error) {
	var v any
	d := json.NewDecoder(bytes.NewReader(b))
	d.UseNumber()
	if err := d.Decode(&v); err != nil {
		return nil, nil, err
	}
	var dropped []string
	v = scrubValue(v, "", &dropped)
	// Hook commands keep their && and > as written.
	var out bytes.Buffer
	enc := json.NewEncoder(&out)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "  ")
	err := enc.Encode(v)
	return out.Bytes(), dropped, err
}

func scrubValue(v any, at string, dropped *[]string) any {
	switch v := v.(type) {
	case map[string]any:
		for k, e := range v {
			p := strings.TrimPrefix(at+"."+k, ".")
			if s, ok := e.(string); ok && (secretName.MatchString(k) || secretValue.MatchString(s)) {
				delete(v, k)
				*dropped = append(*dropped, p)
				continue
			}
			v[k] = scrubValue(e, p, dropped)
		}
	case []any:
		out := v[:0]
		for i, e := range v {
			if s, ok := e.(string); ok && secretValue.MatchString(s) {
				*dropped = append(*dropped, fmt.Sprintf("%s[%d]", at, i))
				continue
			}
			out = append(out, scrubValue(e, at, dropped))
		}
		return out
	}
	return v
}

var tomlKey = regexp.MustCompile(`^\s*("[^"]*"|'[^']*'|[A-Za-z0-9_.-]+)\s*=\s*(.*)$`)

// scrubTOML drops the `key = value` entries of a TOML file whose key or
// value looks like a secret, and any entry holding such a key inline
// (`env = { GITHUB_TOKEN = "..." }`). It works on lines: a dropped entry
// whose value runs over several lines takes its continuation lines with
// it (bracket and triple-quote counting).
func scrubTOML(b []byte) ([]byte, []string) {
	lines := strings.SplitAfter(string(b), "\n")
	var out strings.Builder
	var dropped []string
	table := ""
	for i := 0; i < len(lines); i++ {
		l := lines[i]
		t := strings.TrimSpace(l)
		if strings.HasPrefix(t, "[") && !strings.HasPrefix(t, "[[") && strings.HasSuffix(t, "]") {
			table = strings.Trim(t, "[]")
		}
		m := tomlKey.FindStringSubmatch(strings.TrimRight(l, "\r\n"))
		if m == nil {
			out.WriteString(l)
			continue
		}
		key, val := strings.Trim(m[1], `"'`), strings.TrimSpace(m[2])
		// The whole entry, continuation lines and all.
		entry := []string{l}
		depth, triple := bracketDepth(val), strings.Count(val, `"""`)%2 == 1 || strings.Count(val, "'''")%2 == 1
		for (depth > 0 || triple) && i+1 < len(lines) {
			i++
			entry = append(entry, lines[i])
			if triple {
				triple = !strings.Contains(lines[i], `"""`) && !strings.Contains(lines[i], "'''")
				continue
			}
			depth += bracketDepth(lines[i])
		}
		body := strings.Join(entry, "")
		unq := strings.Trim(val, `"'`)
		if secretName.MatchString(key) || secretValue.MatchString(unq) || inlineSecret(body) {
			dropped = append(dropped, strings.TrimPrefix(table+"."+key, "."))
			continue
		}
		out.WriteString(body)
	}
	return []byte(out.String()), dropped
}

// bracketDepth counts the brackets a line leaves open.
func bracketDepth(s string) int {
	return strings.Count(s, "[") + strings.Count(s, "{") - strings.Count(s, "]") - strings.Count(s, "}")
}

var inlineKey = regexp.MustCompile(`[{,]\s*("[^"]*"|[A-Za-z0-9_-]+)\s*=\s*("[^"]*"|'[^']*')`)

func inlineSecret(body string) bool {
	for _, m := range inlineKey.FindAllStringSubmatch(body, -1) {
		if secretName.MatchString(strings.Trim(m[1], `"`)) || secretValue.MatchString(strings.Trim(m[2], `"'`)) {
			return true
		}
	}
	return false
}

// tomlEntry is one logical line of a TOML file: a table header, a
// `key = value` entry with its continuation lines, or anything else.
type tomlEntry struct {
	header, key, text string
}

func tomlEntries(src string) []tomlEntry {
	lines := strings.SplitAfter(src, "\n")
	var out []tomlEntry
	for i := 0; i < len(lines); i++ {
		l := lines[i]
		if l == "" {
			continue
		}
		if !strings.HasSuffix(l, "\n") {
			l += "\n"
		}
		t := strings.TrimSpace(l)
		if strings.HasPrefix(t, "[") && tomlKey.FindStringSubmatch(t) == nil {
			out = append(out, tomlEntry{header: t, text: l})
			continue
		}
		m := tomlKey.FindStringSubmatch(strings.TrimRight(l, "\r\n"))
		if m == nil {
			out = append(out, tomlEntry{text: l})
			continue
		}
		e := tomlEntry{key: strings.Trim(m[1], `"'`), text: l}
		val := strings.TrimSpace(m[2])
		depth, triple := bracketDepth(val), strings.Count(val, `"""`)%2 == 1
		for (depth > 0 || triple) && i+1 < len(lines) {
			i++
			e.text += lines[i]
			if triple {
				triple = !strings.Contains(lines[i], `"""`)
				continue
			}
			depth += bracketDepth(lines[i])
		}
		out = append(out, e)
	}
	return out
}

// MergeTOML lays TOML file over on base, both as smx writes or imports
// them: over's top-level keys and tables replace base's of the same
// name; base's other entries stay. The result keeps TOML's order (top-level
// keys before any table).
func MergeTOML(base, over string) string {
	split := func(src string) (top []tomlEntry, tables [][]tomlEntry) {
		for _, e := range tomlEntries(src) {
			switch {
			case e.header != "":
				tables = append(tables, []tomlEntry{e})
			case len(tables) > 0:
				tables[len(tables)-1] = append(tables[len(tables)-1], e)
			default:
				top = append(top, e)
			}
		}
		return top, tables
	}
	bTop, bTables := split(base)
	oTop, oTables := split(over)
	var sb strings.Builder
	keys := map[string]bool{}
	for _, e := range oTop {
		keys[e.key] = true
		sb.WriteString(e.text)
	}
	for _, e := range bTop {
		if e.key == "" || !keys[e.key] {
			sb.WriteString(e.text)
		}
	}
	headers := map[string]bool{}
	for _, t := range oTables {
		headers[t[0].header] = true
	}
	write := func(t []tomlEntry) {
		for _, e := range t {
			sb.WriteString(e.text)
		}
	}
	for _, t := range bTables {
		if !headers[t[0].header] {
			write(t)
		}
	}
	for _, t := range oTables {
		write(t)
	}
	return sb.String()
}
