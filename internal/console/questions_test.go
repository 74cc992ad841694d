package console_test

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	wire "github.com/smx-dev/smx/api"
	"github.com/smx-dev/smx/internal/testutil"
)

// TestConsoleQuestions answers a sandbox's questions in the page: a guest
// request a rule says ask about waits, shows on the Questions page and the
// Sandboxes page's badge, and completes in the guest once allowed; always
// writes the rule the page then shows into the profile file.
//
// It runs once the API serves approvals (the spec names the routes).
func TestConsoleQuestions(t *testing.T) {
	if !strings.Contains(string(wire.OpenAPI), "/v1/approvals") {
		t.Skip("this smx serves no approvals yet (GET /v1/approvals is not in api/openapi.yaml)")
	}
	exe := chromium(t)
	testBin = testutil.Binaries(t)
	bin := testBin
	home := testutil.SmxHome(t, bin)
	up := testutil.NewNetHost(t)
	ip := up.PublicIPs[0].String()
	name := fmt.Sprintf("uiq-%d", os.Getpid()%100000)
	t.Cleanup(func() { testutil.SmxCmd(bin, home, "agent", "rm", "-f", name).Run() })
	prof := filepath.Join(t.TempDir(), "ask.yaml")
	if err := os.WriteFile(prof, []byte(fmt.Sprintf("extends: dev\nnetwork:\n  mode: default-deny\n  ask:\n    - cidr: %s/32\n      ports: [80]\nask:\n  timeout: 3m\n", ip)), 0o644); err != nil {
		t.Fatal(err)
	}
	smx(t, bin, home, "agent", "create", name, "--profile", prof)
	smx(t, bin, home, "agent", "start", name)
	login := runUI(t, bin, home)
	base := strings.TrimSuffix(login[:strings.Index(login, "/login")], "/")
	b := newBrowser(t, exe, artefacts(t))
	b.run("log in", chromedp.Navigate(login), chromedp.WaitVisible(chromedp.CSS("#sandboxes")))

	// fetch runs wget in the guest in the background; its result comes
	// on the channel once the gateway lets the request through (or not).
	fetch := func() <-chan string {
		done := make(chan string, 1)
		go func() {
			out, err := testutil.SmxCmd(bin, home, "agent", "exec", name, "--", "wget", "-q", "-O", "-", "-T", "170", "http://"+ip+"/").CombinedOutput()
			done <- fmt.Sprintf("%s(err %v)", out, err)
		}()
		return done
	}
	want := regexp.MustCompile(regexp.QuoteMeta(ip))
	question := `#questions .question`

	// Allow once: the guest's request completes.
	done := fetch()
	b.run("sandboxes", chromedp.Navigate(base+"/#/sandboxes"))
	b.waitText("question badge", fmt.Sprintf(`tr[data-name=%q] a[aria-label$="pending questions"]`, name), regexp.MustCompile(`^1$`))
	b.shot("6-sandboxes-question.png")
	b.run("questions", chromedp.Navigate(base+"/#/questions"))
	b.waitText("question shows", question+" .what", want)
	b.shot("7-questions.png")
	b.run("allow once", chromedp.Click(chromedp.CSS(question+` button[data-decision="once"]`)))
	select {
	case out := <-done:
		if !strings.Contains(out, "hello from netns") {
			t.Fatalf("after allow once the guest's request gave %q", out)
		}
	case <-time.After(3 * time.Minute):
		t.Fatal("the guest's request did not complete within 3 minutes of allow once")
	}
	b.waitText("answered", "#last-answer", regexp.MustCompile(`^Answered once`))

	// Always: the page says where the rule goes, then shows it written.
	done = fetch()
	b.waitText("second question", question+" .what", want)
	b.run("always", chromedp.Click(chromedp.CSS(question+` button[data-decision="always"]`)))
	b.waitText("always names the file", question+" .confirm", regexp.MustCompile(regexp.QuoteMeta(prof)))
	b.shot("8-questions-always.png")
	b.run("confirm always", chromedp.Click(chromedp.CSS(question+` button[data-decision="always-confirm"]`)))
	b.waitText("rule written shown", "#rule-written", want)
	written := b.text("#rule-written")
	select {
	case out := <-done:
		if !strings.Contains(out, "hello from netns") {
			t.Fatalf("after always the guest's request gave %q", out)
		}
	case <-time.After(3 * time.Minute):
		t.Fatal("the guest's request did not complete within 3 minutes of always")
	}
	data, err := os.ReadFile(prof)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(data), strings.TrimSpace(strings.Split(written, "\n")[0])) {
		t.Errorf("the page says it wrote %q, but %s holds:\n%s", written, prof, data)
	}
	b.shot("9-questions-answered.png")
}
