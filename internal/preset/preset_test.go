package preset

import (
	"errors"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/smx-dev/smx/internal/errdefs"
	"github.com/smx-dev/smx/internal/policy"
)

// Every shipped preset parses, pins its npm packages, and carries a profile
// that loads (extends dev) with its credential bound to a path matcher, so
// telemetry on the same host never gets the key.
func TestShippedPresets(t *testing.T) {
	names, err := List("")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"claude", "codex", "gemini", "shell"} {
		if !strings.Contains(strings.Join(names, ","), want) {
			t.Fatalf("presets %v lack %s", names, want)
		}
	}
	for _, n := range names {
		p, err := Get(n, "")
		if err != nil {
			t.Fatal(err)
		}
		f := filepath.Join(t.TempDir(), n+".yaml")
		os.WriteFile(f, []byte(p.Profile), 0o600)
		prof, err := policy.Load(f)
		if err != nil {
			t.Fatalf("%s: profile: %v", n, err)
		}
		// What the host runs stays read-only to the agent (policy, protected).
		if o := prof.Openings(); len(o) != 0 {
			t.Errorf("%s: profile opens files the host runs: %+v", n, o)
		}
		work := policy.FileMount{Guest: "/work", Rule: "-v /src:/work"}
		for _, path := range []string{"/work/.git/config", "/work/.git/hooks/pre-commit", "/work/a/.envrc", "/work/.vscode/tasks.json"} {
			if d := prof.DecideMounted(work, path, "rw"); d.Allow {
				t.Errorf("%s: %s is writable (%s)", n, path, d.Rule)
			}
		}
		if p.Credential == nil {
			continue
		}
		if len(prof.Credentials) != 1 || !prof.Credentials[0].HasMatchers() {
			t.Errorf("%s: want one credential with path matchers, got %+v", n, prof.Credentials)
		}
		if prof.Credentials[0].From != p.Credential.Secret {
			t.Errorf("%s: the profile's credential reads %q, creds login stores %q", n, prof.Credentials[0].From, p.Credential.Secret)
		}
		if !slicesHas(p.Image.Apt, "nodejs") || len(p.Image.Npm) == 0 {
			t.Errorf("%s: recipe %+v lacks Node.js or the agent's package", n, p.Image)
		}
		for _, k := range []string{"NODE_EXTRA_CA_CERTS", "SSL_CERT_FILE"} {
			if p.Env[k] == "" {
				t.Errorf("%s: %s unset: the agent would not trust the sandbox CA", n, k)
			}
		}
	}
	// Agents run as the image's unprivileged user, with their files in its
	// home, and the workspace shown as that user's.
	for _, n := range names {
		p, _ := Get(n, "")
		if p.User != "user" || p.UID != 1000 || p.GID != 1000 {
			t.Errorf("%s: runs as %q %d:%d, want the image's unprivileged user 1000:1000", n, p.User, p.UID, p.GID)
		}
		files := p.Files
		if p.Credential != nil && p.Credential.OAuth != nil {
			files = append(slices.Clone(files), p.Credential.OAuth.Files...)
		}
		for _, f := range files {
			if !strings.HasPrefix(f.Path, "/home/user/") {
				t.Errorf("%s: %s is outside the user's home", n, f.Path)
			}
		}
		if p.Env["IS_SANDBOX"] != "" {
			t.Errorf("%s: IS_SANDBOX is only for agents run as root", n)
		}
	}
	c, _ := Get("claude", "")
	if c.Env["CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC"] != "1" {
		t.Error("claude: non-essential traffic is not turned off")
	}
}

func slicesHas(l []string, s string) bool {
	for _, x := range l {
		if x == s {
			return true
		}
	}
	return false
}

func TestParseRejects(t *testing.T) {
	for name, src := range map[string]string{
		"unpinned npm":  "image: {npm: [\"@openai/codex\"]}\nprofile: 'extends: dev'\ncommand: [codex]\n",
		"range npm":     "image: {npm: [\"@openai/codex@^0.17.0\"]}\nprofile: 'extends: dev'\ncommand: [codex]\n",
		"bad apt":       "image: {apt: [\"git;rm\"]}\nprofile: 'extends: dev'\ncommand: [sh]\n",
		"no command":    "profile: 'extends: dev'\n",
		"no profile":    "command: [sh]\n",
		"unknown key":   "command: [sh]\nprofile: 'extends: dev'\nimages: {}\n",
		"relative file": "command: [sh]\nprofile: 'extends: dev'\nfiles: [{path: etc/x, content: y}]\n",
		"bad env":       "command: [sh]\nprofile: 'extends: dev'\nenv: {\"A-B\": x}\n",
		"uid of root":   "command: [sh]\nprofile: 'extends: dev'\nuser: root\nuid: 1000\n",
		"bad uid":       "command: [sh]\nprofile: 'extends: dev'\nuser: u\nuid: -1\n",
	} {
		if _, err := Parse("x", "test", []byte(src)); !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("%s: err %v, want ErrInvalid", name, err)
		}
	}
}

// uid defaults to the image's unprivileged user for any user but root,
// gid to uid.
func TestPresetOwnerDefaults(t *testing.T) {
	for src, want := range map[string][2]uint32{
		"":                                 {0, 0},
		"user: root\n":                     {0, 0},
		"user: user\n":                     {1000, 1000},
		"user: dev\nuid: 1001\n":           {1001, 1001},
		"user: dev\nuid: 1001\ngid: 100\n": {1001, 100},
	} {
		p, err := Parse("x", "test", []byte("command: [sh]\nprofile: 'extends: dev'\n"+src))
		if err != nil || p.UID != want[0] || p.GID != want[1] {
			t.Errorf("%q: %+v, %v; want %d:%d", src, p, err, want[0], want[1])
		}
	}
}

// A user's preset of the same name wins over the shipped one; an unknown
// name lists what there is.
func TestUserPresets(t *testing.T) {
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "claude.yaml"), []byte("command: [claude, --model, x]\nprofile: 'extends: locked'\n"), 0o644)
	os.WriteFile(filepath.Join(dir, "mine.yaml"), []byte("command: [bash]\nprofile: 'extends: dev'\n"), 0o644)
	p, err := Get("claude", dir)
	if err != nil || p.Source != filepath.Join(dir, "claude.yaml") || p.Command[2] != "x" {
		t.Fatalf("user's claude: %+v, %v", p, err)
	}
	names, _ := List(dir)
	if !strings.Contains(strings.Join(names, ","), "mine") {
		t.Fatalf("List = %v", names)
	}
	if _, err := Get("nosuch", dir); !errors.Is(err, errdefs.ErrNotFound) || !strings.Contains(err.Error(), "claude, codex") {
		t.Fatalf("unknown preset: %v", err)
	}
}

// The image name follows the recipe: apt order does not matter, a new npm
// version does.
func TestRecipeHash(t *testing.T) {
	a := Recipe{Apt: []string{"git", "curl"}, Npm: []string{"x@1.0.0"}}
	b := Recipe{Apt: []string{"curl", "git", "git"}, Npm: []string{"x@1.0.0"}}
	c := Recipe{Apt: []string{"git", "curl"}, Npm: []string{"x@1.0.1"}}
	if a.Hash() != b.Hash() || a.Hash() == c.Hash() {
		t.Fatalf("hashes: %s %s %s", a.Hash(), b.Hash(), c.Hash())
	}
	p := &Preset{Name: "claude", Image: a}
	if !strings.HasPrefix(p.ImageName(), "claude-") || len(p.ImageName()) != len("claude-")+12 {
		t.Fatalf("ImageName = %s", p.ImageName())
	}
}

// With a sign-in, the claude preset's binding sends the token as a bearer
// token (to the model and account paths only), the API-key placeholder
// leaves the environment and the placeholder sign-in file is added.
func TestWithSignIn(t *testing.T) {
	p, _ := Get("claude", "")
	q, err := p.WithSignIn()
	if err != nil {
		t.Fatal(err)
	}
	f := filepath.Join(t.TempDir(), "p.yaml")
	os.WriteFile(f, []byte(q.Profile), 0o600)
	prof, err := policy.Load(f)
	if err != nil {
		t.Fatalf("profile: %v\n%s", err, q.Profile)
	}
	c := prof.Credentials[0]
	if c.Header != "Authorization" || c.Format != "Bearer {}" || c.From != "claude" ||
		!c.MatchRequest("POST", "/v1/messages", nil) || c.MatchRequest("POST", "/api/event_logging/v2/batch", nil) {
		t.Fatalf("binding: %+v", c)
	}
	// The sign-in never goes where it would mint another credential: the
	// CLI's own account reads only, and the minting endpoints are refused
	// outright whichever way the agent signs in.
	if !c.MatchRequest("GET", "/api/oauth/profile", nil) {
		t.Error("the sign-in does not reach /api/oauth/profile, which the CLI reads at start")
	}
	for _, pth := range []string{"/api/oauth/claude_cli/create_api_key", "/api/oauth/claude_cli/roles", "/v1/oauth/token", "/api/oauth/organizations/o/api_keys"} {
		if c.MatchRequest("POST", pth, nil) {
			t.Errorf("the sign-in would be sent to %s", pth)
		}
	}
	if !c.Denies("/api/oauth/claude_cli/create_api_key") {
		t.Error("create_api_key is not refused with the sign-in")
	}
	if key, err := policy.Parse("k.yaml", []byte(p.Profile), nil); err != nil || !key.Credentials[0].Denies("/api/oauth/claude_cli/create_api_key") {
		t.Errorf("create_api_key is not refused with the API key: %v", err)
	}
	if _, ok := q.Env["ANTHROPIC_API_KEY"]; ok {
		t.Error("the API-key placeholder is still set")
	}
	if _, ok := p.Env["ANTHROPIC_API_KEY"]; !ok {
		t.Error("WithSignIn changed the preset it was called on")
	}
	var has bool
	for _, fl := range q.Files {
		has = has || fl.Path == "/home/user/.claude/.credentials.json"
	}
	if !has {
		t.Error("no placeholder sign-in file")
	}
	shell, _ := Get("shell", "")
	if _, err := shell.WithSignIn(); !errors.Is(err, errdefs.ErrInvalid) {
		t.Errorf("shell has no sign-in: %v", err)
	}
}

// The gemini preset sends the key only on model calls, turns usage
// statistics, telemetry and update checks off, trusts /work (the CLI
// drops --yolo in an untrusted folder), and its sign-in talks to the Code
// Assist API with the token while the guest's settings name the sign-in.
func TestGeminiPreset(t *testing.T) {
	p, err := Get("gemini", "")
	if err != nil {
		t.Fatal(err)
	}
	if !slices.ContainsFunc(p.Image.Npm, func(s string) bool { return strings.HasPrefix(s, "@google/gemini-cli@") }) {
		t.Fatalf("recipe %v", p.Image.Npm)
	}
	if !strings.HasPrefix(p.Env["GEMINI_API_KEY"], "smx-placeholder") || p.Env["NODE_EXTRA_CA_CERTS"] == "" {
		t.Fatalf("env %v", p.Env)
	}
	f := filepath.Join(t.TempDir(), "p.yaml")
	os.WriteFile(f, []byte(p.Profile), 0o600)
	prof, err := policy.Load(f)
	if err != nil {
		t.Fatal(err)
	}
	c := prof.Credentials[0]
	if c.Domain != "generativelanguage.googleapis.com" || c.Header != "x-goog-api-key" {
		t.Fatalf("binding %+v", c)
	}
	for path, want := range map[string]bool{
		"/v1beta/models/gemini-2.5-pro:streamGenerateContent": true,
		"/v1beta/models/gemini-2.5-flash:generateContent":     true,
		"/v1beta/models/gemini-2.5-flash:countTokens":         true,
		"/v1beta/models":                     false,
		"/v1beta/files":                      false,
		"/v1beta/models/x/y:generateContent": false,
		"/upload/v1beta/files":               false,
	} {
		if got := c.MatchRequest("POST", path, nil); got != want {
			t.Errorf("POST %s carries the key: %v, want %v", path, got, want)
		}
	}
	if c.MatchRequest("GET", "/v1beta/models/gemini-2.5-pro:generateContent", nil) {
		t.Error("a GET carries the key")
	}
	settings := map[string]string{}
	for _, fl := range p.Files {
		settings[fl.Path] = fl.Content
	}
	for _, want := range []string{`"usageStatisticsEnabled": false`, `"telemetry": {"enabled": false}`, `"enableAutoUpdate": false`,
		`"enableAutoUpdateNotification": false`, `"selectedType": "gemini-api-key"`} {
		if !strings.Contains(settings["/home/user/.gemini/settings.json"], want) {
			t.Errorf("settings.json lacks %s", want)
		}
	}
	if !strings.Contains(settings["/home/user/.gemini/trustedFolders.json"], `"/work": "TRUST_FOLDER"`) {
		t.Error("/work is not trusted")
	}
	if settings["/home/user/.gemini/GEMINI.md"] != InstructionsMarker+"\n" {
		t.Errorf("GEMINI.md: %q", settings["/home/user/.gemini/GEMINI.md"])
	}

	q, err := p.WithSignIn()
	if err != nil {
		t.Fatal(err)
	}
	os.WriteFile(f, []byte(q.Profile), 0o600)
	if prof, err = policy.Load(f); err != nil {
		t.Fatal(err)
	}
	c = prof.Credentials[0]
	if c.Domain != "cloudcode-pa.googleapis.com" || c.Header != "Authorization" || c.Format != "Bearer {}" ||
		!c.MatchRequest("POST", "/v1internal:streamGenerateContent", nil) || c.MatchRequest("POST", "/v1beta/models/x:generateContent", nil) {
		t.Fatalf("sign-in binding %+v", c)
	}
	if _, ok := q.Env["GEMINI_API_KEY"]; ok {
		t.Error("the API-key placeholder is still set with a sign-in")
	}
	n := 0
	for _, fl := range q.Files {
		if fl.Path == "/home/user/.gemini/settings.json" {
			n++
			if !strings.Contains(fl.Content, `"oauth-personal"`) {
				t.Errorf("the sign-in's settings select %q", fl.Content)
			}
		}
	}
	if n != 1 {
		t.Errorf("%d settings.json files", n)
	}
	if o := p.Credential.OAuth; o.Import != "gemini" || o.File != ".gemini/oauth_creds.json" || o.ClientSecret == "" {
		t.Errorf("oauth %+v", o)
	}
}

// No shipped sign-in is ever sent where it could be exchanged for another
// credential: its binding's host is not the token endpoint's (the host
// refreshes there itself), and no token-exchange path matches it.
func TestSignInNeverReachesTokenEndpoints(t *testing.T) {
	names, _ := List("")
	for _, n := range names {
		p, _ := Get(n, "")
		if p.Credential == nil || p.Credential.OAuth == nil {
			continue
		}
		q, err := p.WithSignIn()
		if err != nil {
			t.Fatal(err)
		}
		prof, err := policy.Parse(n+".yaml", []byte(q.Profile), nil)
		if err != nil {
			t.Fatal(err)
		}
		c := prof.Credentials[0]
		tok, err := url.Parse(p.Credential.OAuth.TokenURL)
		if err != nil {
			t.Fatal(err)
		}
		if c.Domain == tok.Hostname() || !c.HasMatchers() {
			t.Errorf("%s: the sign-in is sent to %s (token endpoint %s) without path matchers %v", n, c.Domain, tok.Host, c.Paths)
		}
		for _, pth := range []string{tok.Path, "/oauth/token", "/v1/oauth/token", "/token", "/api/oauth/claude_cli/create_api_key", "/v1/api_keys", "/backend-api/api_keys"} {
			if c.MatchRequest("POST", pth, nil) && !c.Denies(pth) {
				t.Errorf("%s: the sign-in would be sent to %s%s", n, c.Domain, pth)
			}
		}
	}
}

func TestParseRejectsServices(t *testing.T) {
	for name, src := range map[string]string{
		"no command":     "services: [{name: d}]\n",
		"bad name":       "services: [{name: 'D d', command: [d]}]\n",
		"duplicate":      "services: [{name: d, command: [d]}, {name: d, command: [e]}]\n",
		"relative ready": "services: [{name: d, command: [d], ready: run/d.sock}]\n",
		"unclean ready":  "services: [{name: d, command: [d], ready: /run/../d.sock}]\n",
	} {
		if _, err := Parse("x", "test", []byte("command: [sh]\nprofile: 'extends: dev'\n"+src)); !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("%s: err %v, want ErrInvalid", name, err)
		}
	}
}

// The docker preset runs dockerd before its shell and allows the public
// registries' names; --docker (WithDocker) puts the same on another
// preset without losing what it had: its packages, credential and rules.
func TestWithDocker(t *testing.T) {
	load := func(p *Preset) *policy.Profile {
		t.Helper()
		f := filepath.Join(t.TempDir(), p.Name+".yaml")
		os.WriteFile(f, []byte(p.Profile), 0o600)
		prof, err := policy.Load(f)
		if err != nil {
			t.Fatalf("%s: profile: %v\n%s", p.Name, err, p.Profile)
		}
		return prof
	}
	allows := func(prof *policy.Profile, host string) bool {
		return prof.Decide(policy.Request{Kind: policy.KindNet, Proto: "tcp", Host: host, Port: 443}).Allow
	}
	d, err := Get("docker", "")
	if err != nil {
		t.Fatal(err)
	}
	if len(d.Services) != 1 || d.Services[0].Command[0] != "dockerd" || d.Services[0].Ready == "" || !slicesHas(d.Image.Apt, "docker.io") {
		t.Fatalf("docker preset: services %+v, apt %v", d.Services, d.Image.Apt)
	}
	if same, _ := d.WithDocker(); same.Image.Hash() != d.Image.Hash() || len(same.Services) != 1 {
		t.Errorf("docker with --docker is not the docker preset: %+v", same)
	}
	c, _ := Get("claude", "")
	cd, err := c.WithDocker()
	if err != nil {
		t.Fatal(err)
	}
	if !slicesHas(cd.Image.Apt, "docker.io") || !slicesHas(cd.Image.Apt, "nodejs") || !slices.Equal(cd.Image.Npm, c.Image.Npm) {
		t.Errorf("claude --docker recipe: %+v", cd.Image)
	}
	if cd.Image.Hash() == c.Image.Hash() || cd.ImageName() == c.ImageName() {
		t.Error("claude --docker shares claude's image")
	}
	if len(cd.Services) != 1 || len(c.Services) != 0 || !slices.Equal(cd.Command, c.Command) || cd.User != c.User {
		t.Errorf("claude --docker: services %+v (claude's own %+v), command %v, user %s", cd.Services, c.Services, cd.Command, cd.User)
	}
	for _, pr := range []*Preset{d, cd} {
		prof := load(pr)
		for _, host := range []string{"ghcr.io", "registry-1.docker.io", "quay.io", "cdn01.quay.io", "registry.npmjs.org"} {
			if !allows(prof, host) {
				t.Errorf("%s: %s:443 refused", pr.Name, host)
			}
		}
		for _, host := range []string{"registry.evil.test", "ghcr.io.evil.test"} {
			if allows(prof, host) {
				t.Errorf("%s: %s:443 allowed", pr.Name, host)
			}
		}
	}
	if prof := load(cd); len(prof.Credentials) != 1 || prof.Credentials[0].From != "claude" {
		t.Errorf("claude --docker lost its credential: %+v", prof.Credentials)
	}
	if prof := load(c); allows(prof, "ghcr.io") {
		t.Error("claude without --docker allows ghcr.io")
	}
}
