package console_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/emulation"
	"github.com/chromedp/chromedp"

	"github.com/smx-dev/smx/internal/testutil"
)

var testBin string

func TestMain(m *testing.M) {
	code := m.Run()
	testutil.CleanupSmxHome(testBin)
	os.Exit(code)
}

// chromium finds Debian's chromium (scripts/test.sh installs it).
func chromium(t *testing.T) string {
	t.Helper()
	// The binary itself, not Debian's wrapper script, which reads the
	// desktop's settings.
	if _, err := os.Stat("/usr/lib/chromium/chromium"); err == nil {
		return "/usr/lib/chromium/chromium"
	}
	p, err := exec.LookPath("chromium")
	testutil.Require(t, err == nil, "chromium", "apt-get install chromium (or run scripts/test.sh)")
	return p
}

// artefacts is where the test's screenshots go: $SMX_TEST_ARTIFACTS/NAME
// when set, else the test's artifact directory (kept under the output
// directory with go test -artifacts, as scripts/test.sh runs it).
func artefacts(t *testing.T) string {
	t.Helper()
	dir := t.ArtifactDir()
	if root := os.Getenv("SMX_TEST_ARTIFACTS"); root != "" {
		dir = filepath.Join(root, t.Name())
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("screenshots in %s", dir)
	return dir
}

// runUI starts `smx ui --no-open` against home and returns the login URL.
func runUI(t *testing.T, bin, home string) string {
	t.Helper()
	cmd := testutil.SmxCmd(bin, home, "ui", "--no-open")
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Signal(os.Interrupt)
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			cmd.Process.Kill()
			<-done
			t.Errorf("smx ui did not stop on SIGINT within 10s; stderr:\n%s", stderr.String())
		}
	})
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		t.Fatalf("smx ui printed no URL: %v; stderr:\n%s", err, stderr.String())
	}
	u := strings.TrimSpace(line)
	if !regexp.MustCompile(`^http://127\.0\.0\.1:\d+/login\?token=[0-9a-f]{48}$`).MatchString(u) {
		t.Fatalf("smx ui printed %q, want http://127.0.0.1:PORT/login?token=TOKEN", u)
	}
	return u
}

func smx(t *testing.T, bin, home string, args ...string) string {
	t.Helper()
	out, err := testutil.SmxCmd(bin, home, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("smx %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// TestConsoleInBrowser drives the console in a real headless Chromium
// against a real `smx ui` and real sandboxes: the login and the checks at
// the door, a sandbox created from the CLI appearing live, a refusal
// appearing with its rule and explained in one click, the buttons calling
// the API, and a tampered log shown as failing verification at the record
// changed. Each page is saved as a screenshot.
func TestConsoleInBrowser(t *testing.T) {
	browser := chromium(t)
	testBin = testutil.Binaries(t)
	bin := testBin
	home := testutil.SmxHome(t, bin)
	shots := artefacts(t)
	name := fmt.Sprintf("ui-%d", os.Getpid()%100000)
	t.Cleanup(func() { testutil.SmxCmd(bin, home, "agent", "rm", "-f", name).Run() })

	// A profile whose refusal cites its own file and line.
	prof := filepath.Join(t.TempDir(), "ui.yaml")
	if err := os.WriteFile(prof, []byte("extends: dev\nnetwork:\n  mode: default-deny\n  deny:\n    - cidr: 192.0.2.0/24\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	login := runUI(t, bin, home)
	base := strings.TrimSuffix(login[:strings.Index(login, "/login")], "/")
	port := base[strings.LastIndex(base, ":")+1:]
	token := login[strings.Index(login, "token=")+len("token="):]

	// A page on another site, which tries to pause the sandbox through
	// the user's browser with a form post.
	evil := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, `<!doctype html><form id=f method=post action="%s/v1/sandboxes/%s/pause"></form><script>document.getElementById("f").submit()</script>`, base, name)
	}))
	defer evil.Close()
	evilPort := evil.URL[strings.LastIndex(evil.URL, ":")+1:]

	br := newBrowser(t, browser, shots)
	run, text, eval, shot, scheme, waitText, get := br.run, br.text, br.eval, br.shot, br.scheme, br.waitText, br.get
	ctx := br.ctx

	// The door: no token, a wrong one, and the right one under a name
	// that rebinds to loopback are all refused; none spends the token.
	run("open without logging in", chromedp.Navigate(base+"/"))
	if s := text("body"); !strings.Contains(s, "Not logged in") {
		t.Fatalf("without a session the console shows %q", s)
	}
	run("wrong token", chromedp.Navigate(base+"/login?token="+strings.Repeat("0", len(token))))
	if s := text("body"); !strings.Contains(s, "Login refused") {
		t.Fatalf("a wrong token shows %q", s)
	}
	run("rebound name", chromedp.Navigate("http://rebind.test:"+port+"/login?token="+token))
	if s := text("body"); !strings.Contains(s, "unexpected Host") {
		t.Fatalf("a request for rebind.test shows %q", s)
	}
	shot("0-refused-host.png")

	run("log in", chromedp.Navigate(login), chromedp.WaitVisible(chromedp.CSS("#sandboxes")))
	loc := get("location", chromedp.Location())
	if strings.Contains(loc, "token") {
		t.Errorf("after login the address still holds the token: %s", loc)
	}
	run("token spent", chromedp.Navigate(login))
	if s := text("body"); !strings.Contains(s, "Login refused") {
		t.Fatalf("the token's second use shows %q", s)
	}

	// A sandbox created and started from the CLI appears live.
	run("sandboxes page", chromedp.Navigate(base+"/#/sandboxes"), chromedp.WaitVisible(chromedp.CSS("#sandboxes")))
	smx(t, bin, home, "agent", "create", name, "--profile", prof)
	row := fmt.Sprintf(`tr[data-name=%q]`, name)
	waitText("created sandbox appears", row+" td.state", regexp.MustCompile(`^created`))
	smx(t, bin, home, "agent", "start", name)
	waitText("started sandbox shows running", row+" td.state", regexp.MustCompile(`^running`))
	if s := text(row); !strings.Contains(s, "ui.yaml") || !strings.Contains(s, "512 MiB") {
		t.Errorf("sandbox row %q lacks its profile or memory", s)
	}
	// What its QEMU uses on the host: resident memory at once, CPU once
	// two readings are a few seconds apart.
	waitText("host usage", row+" td.usage", regexp.MustCompile(`CPU \d+% · RSS \d+(\.\d)? MiB`))

	// Another site's form post reaches the console without the session
	// (SameSite=Strict) and is refused for its Origin; nothing paused.
	run("foreign origin", chromedp.Navigate("http://evil.test:"+evilPort+"/"),
		chromedp.Func(func(ctx context.Context, t *chromedp.Target) error {
			_, err := chromedp.Poll[chromedp.Void](`document.body && document.body.textContent.includes("cross-origin request refused")`)(ctx, t)
			return err
		}))
	if st := status(t, bin, home, name); st != "running" {
		t.Fatalf("after the foreign page's post the sandbox is %s, want running", st)
	}

	// The timeline: verified, then a refusal appears live with its rule.
	run("timeline", chromedp.Navigate(base+"/#/sandbox/"+name), chromedp.WaitVisible(chromedp.CSS("#timeline")))
	waitText("log verified", "#verify", regexp.MustCompile(`^Verified: \d+ records, hash chain intact`))
	if s := text("#verify-key"); !strings.HasPrefix(s, "Signing key: the key pinned for this machine") {
		t.Errorf("the verification banner says %q of the key, want the pinned key", s)
	}
	out, _ := testutil.SmxCmd(bin, home, "agent", "exec", name, "--", "sh", "-c", "nc -w 3 192.0.2.10 5432 </dev/null").CombinedOutput()
	t.Logf("refused command: %s", out)
	refused := `tr.refused[data-kind="net.refused"]`
	ruleRe := regexp.MustCompile(regexp.QuoteMeta(prof) + `:5:7 network\.deny\[0\] cidr 192\.0\.2\.0/24`)
	waitText("refusal appears with its rule", refused, ruleRe)
	if s := text(refused); !strings.Contains(s, "192.0.2.10:5432") {
		t.Errorf("refusal row %q does not name the destination", s)
	}
	waitText("exec with its exit code", `tr[data-kind="exec.end"]`, regexp.MustCompile(`exit \d+ after`))
	run("refused only", chromedp.SetValue(chromedp.CSS("#outcome"), "refused"),
		eval(`document.getElementById("outcome").dispatchEvent(new Event("change"))`))
	if ok, err := chromedp.Run(ctx, chromedp.Evaluate[bool](`[...document.querySelectorAll("#timeline tbody tr")].every(tr => tr.hidden === !tr.classList.contains("refused"))`)); err != nil || !ok {
		t.Error("the refused-only filter shows allowed records or hides refusals")
	}
	// New records are verified as they come.
	run("all verified", chromedp.Func(func(ctx context.Context, t *chromedp.Target) error {
		_, err := chromedp.Poll[chromedp.Void](`document.querySelectorAll("#timeline tbody tr").length > 0 && !document.querySelector("#timeline tr.unverified")`,
			chromedp.WithPollingTimeout(time.Minute))(ctx, t)
		return err
	}))
	shot("2-timeline.png")

	// One click explains the refusal against the sandbox's frozen profile.
	run("explain", chromedp.Click(chromedp.CSS(refused+" a.explain")), chromedp.WaitVisible(chromedp.CSS("#explain-rule")))
	if s := text("#explain-result"); !strings.HasPrefix(s, "deny tcp:192.0.2.10:5432") || !ruleRe.MatchString(s) {
		t.Errorf("explain shows %q, want deny tcp:192.0.2.10:5432 by %s", s, ruleRe)
	}
	if s := text("#profile-yaml .hit"); !strings.Contains(s, "ui.yaml:5:7 network.deny[0]") {
		t.Errorf("the rule marked in the frozen profile is %q, want the deny rule's", s)
	}
	if s := text("#profile-yaml"); !strings.Contains(s, "cidr: 192.0.2.0/24") {
		t.Errorf("the frozen profile shown lacks the deny rule:\n%s", s)
	}
	// The form: an allowed request by the dev profile's registry rule.
	run("explain form", chromedp.SetValue(chromedp.CSS("#explain-kind"), "url"),
		eval(`document.getElementById("explain-kind").dispatchEvent(new Event("change"))`),
		chromedp.SendKeys(chromedp.CSS("#explain-url"), "https://registry.npmjs.org/left-pad"),
		chromedp.Click(chromedp.CSS(`#explain button[type=submit]`)))
	waitText("allowed by a rule", "#explain-result", regexp.MustCompile(`^allow tcp:registry\.npmjs\.org:443`))
	shot("3-profile.png")

	// The sandboxes page counts the refusal; its Stop button stops it.
	run("sandboxes again", chromedp.Navigate(base+"/#/sandboxes"), chromedp.WaitVisible(chromedp.CSS(row)))
	waitText("refusal badge", row+` a[aria-label$="refusals"]`, regexp.MustCompile(`^[1-9]`))
	shot("1-sandboxes.png")
	run("dark", scheme("dark"))
	shot("1-sandboxes-dark.png")
	run("light", scheme("light"))
	// The buttons work from the keyboard: Pause by Enter, Resume by space.
	run("pause", chromedp.Focus(chromedp.CSS(row+` button[aria-label="Pause `+name+`"]`)), chromedp.KeyEvent("\r"))
	waitText("paused", row+" td.state", regexp.MustCompile(`^paused`))
	if st := status(t, bin, home, name); st != "paused" {
		t.Fatalf("after Pause in the page the CLI says %s", st)
	}
	run("resume", chromedp.Focus(chromedp.CSS(row+` button[aria-label="Resume `+name+`"]`)), chromedp.KeyEvent(" "))
	waitText("resumed", row+" td.state", regexp.MustCompile(`^running`))
	run("stop", chromedp.Click(chromedp.CSS(row+` button[aria-label="Stop `+name+`"]`)))
	waitText("stopped", row+" td.state", regexp.MustCompile(`^stopped`))
	if st := status(t, bin, home, name); st != "stopped" {
		t.Fatalf("after Stop in the page the CLI says %s", st)
	}

	run("questions", chromedp.Navigate(base+"/#/questions"), chromedp.WaitVisible(chromedp.CSS("#questions p")))
	shot("4-questions.png")

	// Change one record of the log: the page says verification fails
	// there, and marks the record.
	seq := tamper(t, filepath.Join(home, "logs", name, "records.jsonl"), "192.0.2.10", "192.0.2.99")
	run("tampered timeline", chromedp.Navigate(base+"/#/sandboxes"), chromedp.Navigate(base+"/#/sandbox/"+name),
		chromedp.WaitVisible(chromedp.CSS("#timeline")))
	waitText("verification fails", "#verify", regexp.MustCompile(fmt.Sprintf(`^Verification FAILED at record %d`, seq)))
	run("tampered row", chromedp.WaitVisible(chromedp.CSS(fmt.Sprintf(`tr.tampered[data-seq="%d"]`, seq))))
	if ok, err := chromedp.Run(ctx, chromedp.Evaluate[bool](fmt.Sprintf(
		`[...document.querySelectorAll("#timeline tbody tr")].every(tr => tr.classList.contains("untrusted") === (+tr.dataset.seq > %d))`, seq))); err != nil || !ok {
		t.Errorf("the records after the tampered one are not all marked untrusted (or others are): %v", err)
	}
	shot("5-timeline-tampered.png")

	// Remove asks for the name first; the row goes, the log stays.
	run("remove", chromedp.Navigate(base+"/#/sandboxes"), chromedp.WaitVisible(chromedp.CSS(row)),
		chromedp.Click(chromedp.CSS(row+` button[aria-label="Remove `+name+`"]`)),
		chromedp.WaitVisible(chromedp.CSS("#ask-input")), chromedp.SendKeys(chromedp.CSS("#ask-input"), name),
		chromedp.Click(chromedp.CSS("#ask-ok")), chromedp.WaitNotPresent(chromedp.CSS(row)))
	if out, err := testutil.SmxCmd(bin, home, "agent", "inspect", name).CombinedOutput(); err == nil {
		t.Errorf("after Remove in the page the sandbox is still there:\n%s", out)
	}
	if _, err := os.Stat(filepath.Join(home, "logs", name, "records.jsonl")); err != nil {
		t.Errorf("Remove took the log too: %v", err)
	}
}

type step = chromedp.Action[chromedp.Void]

// browser is a headless Chromium tab and the test's ways to drive it.
type browser struct {
	t     *testing.T
	ctx   context.Context
	shots string
}

func newBrowser(t *testing.T, exe, shots string) *browser {
	t.Helper()
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(exe),
		// As root (CI runs the suite as root) Chromium will not start its
		// own sandbox, which needs an unprivileged user; it only ever
		// loads pages from this machine's loopback here.
		chromedp.NoSandbox,
		// No network beyond loopback: every name fails to resolve but two
		// test names, which resolve to 127.0.0.1 as a rebinding attacker's
		// would.
		chromedp.Flag("host-resolver-rules", "MAP rebind.test 127.0.0.1, MAP evil.test 127.0.0.1, MAP * ~NOTFOUND, EXCLUDE 127.0.0.1"),
		chromedp.WindowSize(1360, 900),
	)
	actx, cancelA := chromedp.NewExecAllocator(context.Background(), opts...)
	t.Cleanup(cancelA)
	ctx, cancelB := chromedp.NewContext(actx, chromedp.WithLogf(t.Logf))
	t.Cleanup(cancelB)
	// The first call starts the browser, which lives as long as its
	// context: ctx, not one step's.
	if err := chromedp.Do(ctx, chromedp.Navigate("about:blank")); err != nil {
		t.Fatalf("start chromium: %v", err)
	}
	return &browser{t: t, ctx: ctx, shots: shots}
}

// page is the start of the page's text, for failure messages.
func (b *browser) page() string {
	text, _ := chromedp.Run(b.ctx, chromedp.Evaluate[string](`document.body ? document.body.innerText.slice(0, 3000) : ""`))
	return text
}

func (b *browser) run(what string, actions ...step) {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, 4*time.Minute)
	defer cancel()
	if err := chromedp.Do(ctx, actions...); err != nil {
		b.t.Fatalf("%s: %v\npage:\n%s", what, err, b.page())
	}
}

func (b *browser) get(what string, a chromedp.Action[string]) string {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, time.Minute)
	defer cancel()
	v, err := chromedp.Run(ctx, a)
	if err != nil {
		b.t.Fatalf("%s: %v\npage:\n%s", what, err, b.page())
	}
	return v
}

// text is the text of the first element sel selects.
func (b *browser) text(sel string) string {
	b.t.Helper()
	return b.get("read "+sel, chromedp.Evaluate[string](fmt.Sprintf(`(() => { const e = document.querySelector(%q); return e ? e.textContent : "<no "+%q+">"; })()`, sel, sel)))
}

func (b *browser) eval(js string) step {
	return chromedp.Func(func(ctx context.Context, t *chromedp.Target) error {
		_, err := chromedp.Evaluate[bool]("("+js+", true)")(ctx, t)
		return err
	})
}

// shot saves a screenshot of the whole page as file in the artefacts.
func (b *browser) shot(file string) {
	b.t.Helper()
	png, err := chromedp.Run(b.ctx, chromedp.FullScreenshot(100))
	if err != nil {
		b.t.Fatalf("screenshot %s: %v", file, err)
	}
	if err := os.WriteFile(filepath.Join(b.shots, file), png, 0o644); err != nil {
		b.t.Fatal(err)
	}
}

// scheme emulates prefers-color-scheme v (dark or light).
func (b *browser) scheme(v string) step {
	return chromedp.Func(func(ctx context.Context, t *chromedp.Target) error {
		_, err := cdp.Call(ctx, t, emulation.SetEmulatedMedia, emulation.SetEmulatedMediaParams{
			Features: []*emulation.MediaFeature{{Name: "prefers-color-scheme", Value: v}}})
		return err
	})
}

// waitText waits until sel's text matches re (the page updates live).
func (b *browser) waitText(what, sel string, re *regexp.Regexp) {
	b.t.Helper()
	b.run(what, chromedp.Func(func(ctx context.Context, t *chromedp.Target) error {
		_, err := chromedp.Poll[chromedp.Void](fmt.Sprintf(`(() => { const e = document.querySelector(%q); return !!e && %s.test(e.textContent); })()`,
			sel, jsRegexp(re)), chromedp.WithPollingInterval(200*time.Millisecond), chromedp.WithPollingTimeout(3*time.Minute))(ctx, t)
		return err
	}))
}

// status is the sandbox's status as the CLI reports it.
func status(t *testing.T, bin, home, name string) string {
	t.Helper()
	var in struct {
		Status string `json:"status"`
		State  struct {
			Status string `json:"status"`
		} `json:"state"`
	}
	out := smx(t, bin, home, "agent", "inspect", "--json", name)
	if err := json.Unmarshal([]byte(out), &in); err != nil {
		t.Fatalf("smx agent inspect --json %s: %v\n%s", name, err, out)
	}
	if in.Status != "" {
		return in.Status
	}
	return in.State.Status
}

// tamper rewrites old to new in the first record of log that holds old
// and returns that record's sequence number.
func tamper(t *testing.T, log, old, new string) int64 {
	t.Helper()
	b, err := os.ReadFile(log)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.SplitAfter(string(b), "\n")
	for i, l := range lines {
		if !strings.Contains(l, old) {
			continue
		}
		var r struct {
			Seq int64 `json:"seq"`
		}
		if err := json.Unmarshal([]byte(l), &r); err != nil {
			t.Fatal(err)
		}
		lines[i] = strings.Replace(l, old, new, 1)
		if err := os.WriteFile(log, []byte(strings.Join(lines, "")), 0o600); err != nil {
			t.Fatal(err)
		}
		return r.Seq
	}
	t.Fatalf("no record in %s holds %q", log, old)
	return 0
}

// jsRegexp writes re as a JavaScript regular expression literal.
func jsRegexp(re *regexp.Regexp) string {
	return "/" + strings.ReplaceAll(re.String(), "/", `\/`) + "/"
}
