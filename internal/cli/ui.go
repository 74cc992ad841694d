package cli

import (
	"bufio"
	"context"
	"fmt"
	"html"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/smx-dev/smx/internal/api"
	"github.com/smx-dev/smx/internal/console"
	"github.com/smx-dev/smx/internal/errdefs"
	"github.com/smx-dev/smx/internal/service"
)

func newUICmd(e *env) *cobra.Command {
	var listen string
	var noOpen bool
	cmd := &cobra.Command{
		Use:   "ui [--listen HOST:PORT] [--no-open]",
		Short: "Serve the web console on 127.0.0.1 and open it in a browser",
		Long: "Serve smx's web console until interrupted: sandboxes, each one's verified log as a\n" +
			"timeline, its profile with explain, and the questions waiting for you. It listens on\n" +
			"127.0.0.1 on a free port and prints a login URL whose token works once; the browser\n" +
			"then holds a session cookie. Requests naming another host, or sent by another site's\n" +
			"page, are refused. --listen picks another address (which anyone who can reach it\n" +
			"could then try); a browser opens when one can (--no-open: print the URL only).",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := e.state.Ensure(); err != nil {
				return err
			}
			ctx, stop := signal.NotifyContext(e.ctx, os.Interrupt, syscall.SIGTERM)
			defer stop()
			url, serve, next, err := e.console(listen)
			if err != nil {
				return err
			}
			fmt.Fprintln(e.stdout, url)
			if _, tty := terminalFd(e.stdin); tty {
				fmt.Fprintln(e.stderr, "smx: console listening; open the URL above (its token works once; Enter prints a new one), ctrl-c to stop")
				go func() {
					// Another browser needs a login of its own.
					sc := bufio.NewScanner(e.stdin)
					for sc.Scan() {
						fmt.Fprintln(e.stdout, next())
					}
				}()
			} else {
				fmt.Fprintln(e.stderr, "smx: console listening; open the URL above (its token works once), ctrl-c to stop")
			}
			if !noOpen {
				openBrowser(e, url)
			}
			return serve(ctx)
		},
	}
	cmd.Flags().StringVar(&listen, "listen", "127.0.0.1:0", "address to listen on (port 0: a free one)")
	cmd.Flags().BoolVar(&noOpen, "no-open", false, "do not open a browser; print the URL only")
	return cmd
}

// console opens the console's listener at addr and returns its login URL,
// the function that serves it until ctx ends, and one that makes a new
// login URL. The console's API is the same server `smx serve` runs,
// behind the console's session instead of a bearer token.
func (e *env) console(addr string) (string, func(context.Context) error, func() string, error) {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return "", nil, nil, fmt.Errorf("--listen %q: want HOST:PORT, e.g. 127.0.0.1:0: %w", addr, errdefs.ErrInvalid)
	}
	if ip, err := netip.ParseAddr(host); err != nil || ip.IsUnspecified() {
		// The Host check needs the one address the browser uses.
		return "", nil, nil, fmt.Errorf("--listen %q: give an IP address of this machine, not a name or 0.0.0.0: %w", addr, errdefs.ErrInvalid)
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return "", nil, nil, err
	}
	srv := &api.Server{Backend: api.ServiceBackend{S: e.svc()}, Log: e.log, Version: Version, StateDir: e.state.Root,
		Message: func(err error) string { return userMessage(err.Error()) }}
	c, token, err := console.New(srv, ln.Addr())
	if err != nil {
		ln.Close()
		return "", nil, nil, err
	}
	serve := func(ctx context.Context) error {
		defer ln.Close()
		return api.Serve(ctx, ln, c)
	}
	next := func() string { return console.URL(ln.Addr(), c.NewToken()) }
	return console.URL(ln.Addr(), token), serve, next, nil
}

// openBrowser starts the desktop's browser on url when there is a
// desktop to show it on; otherwise the printed URL is the way in.
func openBrowser(e *env, url string) {
	if os.Getenv("DISPLAY") == "" && os.Getenv("WAYLAND_DISPLAY") == "" {
		return
	}
	p, err := exec.LookPath("xdg-open")
	if err != nil {
		return
	}
	// The browser gets a private file that redirects to the URL, not
	// the URL itself: a command line is visible to every local user.
	page := filepath.Join(e.state.Root, "ui-open.html")
	body := `<!doctype html><meta http-equiv="refresh" content="0;url=` + html.EscapeString(url) + `">`
	if err := service.WriteFileAtomic(page, []byte(body), 0o600); err != nil {
		fmt.Fprintf(e.stderr, "smx: could not open a browser (%v); open the URL yourself\n", err)
		return
	}
	cmd := exec.Command(p, page)
	cmd.Stdout, cmd.Stderr = nil, nil
	if err := cmd.Start(); err != nil {
		fmt.Fprintf(e.stderr, "smx: could not open a browser (%v); open the URL yourself\n", strings.TrimSpace(err.Error()))
		return
	}
	go cmd.Wait()
}
