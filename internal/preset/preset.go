// Package preset reads agent presets: small YAML files that say how to run
// one coding agent in a sandbox (image recipe, profile, credential,
// placeholder environment, command line, files for the guest home). The
// shipped ones live in the repository's presets/ folder (embedded); a user's
// own go in ~/.config/smx/presets/NAME.yaml and win over a shipped one of
// the same name.
//
// A preset is data: it never runs on the host. Its image recipe is built by
// internal/image (packages from the distribution, npm packages at pinned
// versions whose install scripts run in the image's chroot), its profile is
// an ordinary profile (internal/policy) and its files are copied into the
// guest when the sandbox starts.
package preset

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"sync"

	"go.yaml.in/yaml/v3"

	"github.com/smx-dev/smx/internal/errdefs"
	"github.com/smx-dev/smx/presets"
)

// Preset is one parsed, checked preset file.
type Preset struct {
	Name        string            `json:"name"`
	Source      string            `json:"source"` // "builtin" or the file it came from
	Description string            `json:"description,omitempty"`
	Image       Recipe            `json:"image"`
	Profile     string            `json:"profile"` // profile YAML (usually `extends: dev` plus credentials)
	Credential  *Credential       `json:"credential,omitempty"`
	Env         map[string]string `json:"env,omitempty"`
	Command     []string          `json:"command"`
	User        string            `json:"user,omitempty"`
	// UID and GID are User's ids in the image: the workspace mount shows
	// the host user's files as theirs (so an unprivileged agent can write
	// them), and files under the user's home belong to them.
	UID     uint32 `json:"uid,omitempty"`
	GID     uint32 `json:"gid,omitempty"`
	Workdir string `json:"workdir,omitempty"`
	Files   []File `json:"files,omitempty"`
	// Services are daemons started in the guest, as root, before the
	// agent (the docker preset's dockerd).
	Services []Service `json:"services,omitempty"`
}

// Service is a daemon the guest runs beside the agent: started as root in
// its own session once the preset's files are in place, its output in
// /var/log/smx-NAME.log; the agent starts once Ready (a path the daemon
// creates when it serves, such as its socket) exists. It runs until the
// sandbox stops, and runs on after a snapshot restore like every process.
type Service struct {
	Name    string   `json:"name" yaml:"name"`
	Command []string `json:"command" yaml:"command"`
	Ready   string   `json:"ready,omitempty" yaml:"ready"`
}

// Recipe says what goes into a preset's image on top of Debian bookworm.
type Recipe struct {
	Apt []string `json:"apt,omitempty"` // Debian packages
	Npm []string `json:"npm,omitempty"` // npm packages, each NAME@EXACT-VERSION
}

// Credential says which host-side secret `smx creds login NAME` fills and
// how the gateway sends it (an API key, as the profile's binding says), and
// how a sign-in imported from the agent's own config differs (OAuth).
type Credential struct {
	Secret string      `json:"secret" yaml:"secret"`
	Header string      `json:"header" yaml:"header"`
	Format string      `json:"format,omitempty" yaml:"format"`
	OAuth  *OAuthLogin `json:"oauth,omitempty" yaml:"oauth"`
}

// OAuthLogin describes a subscription sign-in: where the agent keeps it on
// the host, how to refresh it, how the gateway sends the access token, and
// what the guest gets instead (a placeholder config that makes the CLI
// believe it is signed in).
type OAuthLogin struct {
	Import   string `json:"import" yaml:"import"` // importer: claude, codex or gemini
	File     string `json:"file" yaml:"file"`     // relative to the host user's home
	TokenURL string `json:"token_url" yaml:"token_url"`
	ClientID string `json:"client_id" yaml:"client_id"`
	// ClientSecret is the agent CLI's own installed-app client secret,
	// public by design (it ships in the CLI), for token endpoints that want
	// it (Google's).
	ClientSecret string            `json:"client_secret,omitempty" yaml:"client_secret"`
	Domain       string            `json:"domain,omitempty" yaml:"domain"` // when the signed-in API is elsewhere
	Header       string            `json:"header" yaml:"header"`
	Format       string            `json:"format,omitempty" yaml:"format"`
	Paths        []string          `json:"paths,omitempty" yaml:"paths"`
	EnvUnset     []string          `json:"env_unset,omitempty" yaml:"env_unset"`
	Env          map[string]string `json:"env,omitempty" yaml:"env"`
	Files        []File            `json:"files,omitempty" yaml:"files"`
}

// File is written into the guest at start, owned by the preset's user when
// it lies under that user's home.
type File struct {
	Path    string `json:"path" yaml:"path"`
	Content string `json:"content" yaml:"content"`
	// Exec makes the file executable (an imported hook script); a file
	// starting with #! is anyway.
	Exec bool `json:"-" yaml:"-"`
}

// InstructionsMarker in a file's content is replaced by the text from
// Instructions: what the sandbox allows and where to look when refused.
const InstructionsMarker = "{{instructions}}"

type file struct {
	Description string            `yaml:"description"`
	Image       Recipe            `yaml:"image"`
	Profile     string            `yaml:"profile"`
	Credential  *Credential       `yaml:"credential"`
	Env         map[string]string `yaml:"env"`
	Command     []string          `yaml:"command"`
	User        string            `yaml:"user"`
	UID         *uint32           `yaml:"uid"`
	GID         *uint32           `yaml:"gid"`
	Workdir     string            `yaml:"workdir"`
	Files       []File            `yaml:"files"`
	Services    []Service         `yaml:"services"`
}

var (
	nameRE = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[a-z0-9][a-z0-9_-]{0,31}$`) })
	aptRE  = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[a-z0-9][a-z0-9+.-]+$`) })
	npmRE  = sync.OnceValue(func() *regexp.Regexp {
		return regexp.MustCompile(`^(@[a-z0-9][a-z0-9._-]*/)?[a-z0-9][a-z0-9._-]*@[0-9]+\.[0-9]+\.[0-9]+(-[0-9A-Za-z.-]+)?$`)
	})
	envKeyRE = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`) })
)

// UserDir is where a user's own presets live: $XDG_CONFIG_HOME/smx/presets
// (~/.config/smx/presets).
func UserDir() string {
	d, err := os.UserConfigDir()
	if err != nil {
		return ""
	}
	return filepath.Join(d, "smx", "presets")
}

// Parse reads one preset file's content. name is the preset's name (the
// file name without .yaml); source says where it came from, for messages.
func Parse(name, source string, data []byte) (*Preset, error) {
	fail := func(format string, args ...any) (*Preset, error) {
		return nil, fmt.Errorf("preset %s (%s): %s: %w", name, source, fmt.Sprintf(format, args...), errdefs.ErrInvalid)
	}
	if !nameRE().MatchString(name) {
		return fail("invalid name: use lower-case letters, digits, '-' and '_'")
	}
	var f file
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&f); err != nil {
		return fail("%v", err)
	}
	for _, p := range f.Image.Apt {
		if !aptRE().MatchString(p) {
			return fail("image.apt: invalid Debian package name %q", p)
		}
	}
	for _, p := range f.Image.Npm {
		if !npmRE().MatchString(p) {
			return fail("image.npm: %q is not NAME@VERSION with an exact version (x.y.z): pin every npm package", p)
		}
	}
	if len(f.Command) == 0 {
		return fail("command is empty")
	}
	if strings.TrimSpace(f.Profile) == "" {
		return fail("profile is empty: say at least `extends: dev`")
	}
	for k := range f.Env {
		if !envKeyRE().MatchString(k) {
			return fail("env: invalid variable name %q", k)
		}
	}
	if f.Workdir != "" && !strings.HasPrefix(f.Workdir, "/") {
		return fail("workdir %q is not absolute", f.Workdir)
	}
	// uid defaults to the unprivileged user internal/image makes (1000)
	// for any user but root; gid to uid.
	root := f.User == "" || f.User == "root"
	var uid, gid uint32
	if !root {
		uid = 1000
	}
	if f.UID != nil {
		uid = *f.UID
	}
	gid = uid
	if f.GID != nil {
		gid = *f.GID
	}
	if root && (uid != 0 || gid != 0) {
		return fail("uid and gid are the ids of user, which is root: drop them, or name the user")
	}
	if uid >= 1<<32-1 || gid >= 1<<32-1 {
		return fail("uid and gid must be below 4294967295")
	}
	for _, fl := range f.Files {
		if !strings.HasPrefix(fl.Path, "/") || filepath.Clean(fl.Path) != fl.Path {
			return fail("files: path %q must be absolute and clean", fl.Path)
		}
	}
	seen := map[string]bool{}
	for _, sv := range f.Services {
		if !nameRE().MatchString(sv.Name) || seen[sv.Name] {
			return fail("services: name %q must be unique, of lower-case letters, digits, '-' and '_'", sv.Name)
		}
		seen[sv.Name] = true
		if len(sv.Command) == 0 {
			return fail("services: %s: command is empty", sv.Name)
		}
		if sv.Ready != "" && (!strings.HasPrefix(sv.Ready, "/") || filepath.Clean(sv.Ready) != sv.Ready) {
			return fail("services: %s: ready %q must be an absolute, clean path", sv.Name, sv.Ready)
		}
	}
	if c := f.Credential; c != nil && (c.Secret == "" || c.Header == "") {
		return fail("credential needs secret and header")
	}
	if c := f.Credential; c != nil && c.OAuth != nil {
		o := c.OAuth
		if !slices.Contains([]string{"claude", "codex", "gemini"}, o.Import) || o.File == "" || o.TokenURL == "" || o.Header == "" {
			return fail("credential.oauth needs import (claude, codex or gemini), file, token_url and header")
		}
		for _, fl := range o.Files {
			if !strings.HasPrefix(fl.Path, "/") || filepath.Clean(fl.Path) != fl.Path {
				return fail("credential.oauth.files: path %q must be absolute and clean", fl.Path)
			}
		}
	}
	return &Preset{
		Name: name, Source: source, Description: f.Description, Image: f.Image,
		Profile: f.Profile, Credential: f.Credential, Env: f.Env, Command: f.Command,
		User: f.User, UID: uid, GID: gid, Workdir: f.Workdir, Files: f.Files, Services: f.Services,
	}, nil
}

// Get finds a preset: the user's directory first (when dir is not empty),
// then the shipped ones.
func Get(name, dir string) (*Preset, error) {
	if !nameRE().MatchString(name) {
		return nil, fmt.Errorf("preset %q: invalid name: %w", name, errdefs.ErrInvalid)
	}
	if dir != "" {
		p := filepath.Join(dir, name+".yaml")
		b, err := os.ReadFile(p)
		if err == nil {
			return Parse(name, p, b)
		}
		if !errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("preset %s: %w", name, err)
		}
	}
	b, err := presets.FS.ReadFile(name + ".yaml")
	if err != nil {
		names, _ := List(dir)
		return nil, fmt.Errorf("no preset named %q: use one of %s, or add %s: %w", name,
			strings.Join(names, ", "), filepath.Join(dir, name+".yaml"), errdefs.ErrNotFound)
	}
	return Parse(name, "builtin", b)
}

// List names every preset, shipped and the user's, sorted.
func List(dir string) ([]string, error) {
	seen := map[string]bool{}
	ents, err := fs.ReadDir(presets.FS, ".")
	if err != nil {
		return nil, err
	}
	for _, e := range ents {
		if n, ok := strings.CutSuffix(e.Name(), ".yaml"); ok {
			seen[n] = true
		}
	}
	if dir != "" {
		if m, err := filepath.Glob(filepath.Join(dir, "*.yaml")); err == nil {
			for _, f := range m {
				if n := strings.TrimSuffix(filepath.Base(f), ".yaml"); nameRE().MatchString(n) {
					seen[n] = true
				}
			}
		}
	}
	out := make([]string, 0, len(seen))
	for n := range seen {
		out = append(out, n)
	}
	sort.Strings(out)
	return out, nil
}

// recipeVersion changes when the way recipes are built changes, so an image
// built the old way is not reused.
const recipeVersion = "smx-recipe-1"

// Hash identifies the recipe's content: the same lists (in any order) give
// the same hash.
func (r Recipe) Hash() string {
	apt, npm := slices.Clone(r.Apt), slices.Clone(r.Npm)
	slices.Sort(apt)
	// npm order matters (a later package may use an earlier one's node).
	b, _ := json.Marshal(struct {
		V   string
		Apt []string
		Npm []string
	}{recipeVersion, slices.Compact(apt), npm})
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

// ImageName is the name of the preset's image in the image store: the
// preset's name and the first 12 hex digits of the recipe hash. A changed
// recipe gets a new image; an unchanged one is reused.
func (p *Preset) ImageName() string { return p.Name + "-" + p.Image.Hash()[:12] }

// EnvList returns the environment as sorted KEY=VALUE strings.
func (p *Preset) EnvList() []string {
	keys := make([]string, 0, len(p.Env))
	for k := range p.Env {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	out := make([]string, 0, len(keys))
	for _, k := range keys {
		out = append(out, k+"="+p.Env[k])
	}
	return out
}

// Instructions is the text put into the agent's user-level instructions
// file (CLAUDE.md, AGENTS.md, GEMINI.md) in the guest home: what the
// sandbox is, what it allows, and where to look when something is refused.
func Instructions(profileName, profileSummary string) string {
	return `# You are running in an smx sandbox

This machine is a microVM. A permission gateway on the host decides every
network connection, file access under mounted folders, Git push and SSH
connection against the sandbox's profile (` + profileName + `). Nothing
inside this VM can change that profile.

What the profile allows:

` + profileSummary + `
When something is refused:
- A refused connection is reset, and a refused name does not resolve
  (NXDOMAIN); a refused plain-HTTP request (on port 80, or on a connection
  the profile allowed) is answered 403 with the rule that refused it.
- Git pushes the profile does not allow are refused by the Git gateway with
  a message naming the rule.
- Run ` + "`smx-why`" + ` to list the sandbox's recent refusals with their rules.
- Do not retry a refused action or work around it (other hosts, proxies,
  other protocols): the refusal is deliberate. Say what was refused and why,
  and let the user change the profile if the action is needed.

API keys and tokens are held on the host and added by the gateway; the
keys in this VM's environment are placeholders. Do not look for real ones.
`
}

// WithSignIn returns the preset as it runs with an imported sign-in instead
// of an API key: the profile's binding of the credential's secret sends the
// token as the sign-in does (header, format, paths, domain), the API-key
// placeholder goes from the environment and the sign-in's placeholder
// config is added.
func (p *Preset) WithSignIn() (*Preset, error) {
	if p.Credential == nil || p.Credential.OAuth == nil {
		return nil, fmt.Errorf("preset %s has no sign-in to use: %w", p.Name, errdefs.ErrInvalid)
	}
	o := p.Credential.OAuth
	var doc yaml.Node
	if err := yaml.Unmarshal([]byte(p.Profile), &doc); err != nil || len(doc.Content) == 0 {
		return nil, fmt.Errorf("preset %s: profile: %v: %w", p.Name, err, errdefs.ErrInvalid)
	}
	found := false
	for _, cred := range mappingValue(doc.Content[0], "credentials").contentOr() {
		if v := mappingValue(cred, "from"); v == nil || v.Value != p.Credential.Secret {
			continue
		}
		found = true
		setScalar(cred, "header", o.Header)
		format := o.Format
		if format == "" {
			format = "{}"
		}
		setScalar(cred, "format", format)
		if o.Domain != "" {
			setScalar(cred, "domain", o.Domain)
		}
		if len(o.Paths) > 0 {
			seq := &yaml.Node{Kind: yaml.SequenceNode}
			for _, pth := range o.Paths {
				seq.Content = append(seq.Content, &yaml.Node{Kind: yaml.ScalarNode, Value: pth})
			}
			setNode(cred, "paths", seq)
		}
	}
	if !found {
		return nil, fmt.Errorf("preset %s: its profile binds no credential from %s: %w", p.Name, p.Credential.Secret, errdefs.ErrInvalid)
	}
	out, err := yaml.Marshal(&doc)
	if err != nil {
		return nil, err
	}
	q := *p
	q.Profile = string(out)
	q.Env = map[string]string{}
	for k, v := range p.Env {
		if !slices.Contains(o.EnvUnset, k) {
			q.Env[k] = v
		}
	}
	for k, v := range o.Env {
		q.Env[k] = v
	}
	// The sign-in's files replace the preset's of the same path (the
	// agent's settings name another way to sign in).
	q.Files = nil
	for _, f := range p.Files {
		if !slices.ContainsFunc(o.Files, func(g File) bool { return g.Path == f.Path }) {
			q.Files = append(q.Files, f)
		}
	}
	q.Files = append(q.Files, o.Files...)
	return &q, nil
}

type node yaml.Node

func mappingValue(m *yaml.Node, key string) *node {
	if m == nil || m.Kind != yaml.MappingNode {
		return nil
	}
	for i := 0; i+1 < len(m.Content); i += 2 {
		if m.Content[i].Value == key {
			return (*node)(m.Content[i+1])
		}
	}
	return nil
}

func (n *node) contentOr() []*yaml.Node {
	if n == nil {
		return nil
	}
	return n.Content
}

func setNode(m *yaml.Node, key string, v *yaml.Node) {
	for i := 0; i+1 < len(m.Content); i += 2 {
		if m.Content[i].Value == key {
			m.Content[i+1] = v
			return
		}
	}
	m.Content = append(m.Content, &yaml.Node{Kind: yaml.ScalarNode, Value: key}, v)
}

func setScalar(m *yaml.Node, key, v string) {
	setNode(m, key, &yaml.Node{Kind: yaml.ScalarNode, Value: v, Style: yaml.DoubleQuotedStyle})
}
