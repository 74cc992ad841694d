package cli

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/smx-dev/smx/internal/api"
	"github.com/smx-dev/smx/internal/errdefs"
	"github.com/smx-dev/smx/internal/service"
)

// Version is what `smx serve` reports at GET /v1/info.
var Version = "dev"

func newServeCmd(e *env) *cobra.Command {
	var listen []string
	var tokenFile string
	var ui bool
	cmd := &cobra.Command{
		Use:   "serve [--listen unix:PATH | --listen tcp:ADDR --token-file F]",
		Short: "Serve the local HTTP API (JSON over a unix socket; see api/openapi.yaml)",
		Long: "Serve smx's HTTP API until interrupted. By default it listens on the unix socket\n" +
			"$SMX_HOME/smx.sock, which only those who can enter the state directory can reach.\n" +
			"--listen replaces that default and may be repeated. A TCP listener (--listen\n" +
			"tcp:127.0.0.1:7070) needs --token-file: every request must then carry\n" +
			"\"Authorization: Bearer TOKEN\". Exec streams over a WebSocket; see api/openapi.yaml.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := e.state.Ensure(); err != nil {
				return err
			}
			var token string
			if tokenFile != "" {
				b, err := os.ReadFile(tokenFile)
				if err != nil {
					return fmt.Errorf("--token-file: %w", err)
				}
				if token = strings.TrimSpace(string(b)); len(token) < 16 {
					return fmt.Errorf("--token-file %s: the token must be at least 16 characters: %w", tokenFile, errdefs.ErrInvalid)
				}
			}
			if len(listen) == 0 {
				listen = []string{"unix:" + filepath.Join(e.state.Root, "smx.sock")}
			}
			ctx, stop := signal.NotifyContext(e.ctx, os.Interrupt, syscall.SIGTERM)
			defer stop()
			var lns []net.Listener
			defer func() {
				for _, l := range lns {
					l.Close()
				}
			}()
			for _, l := range listen {
				ln, err := e.listenAPI(l, token)
				if err != nil {
					return err
				}
				lns = append(lns, ln)
				fmt.Fprintf(e.stderr, "smx: API listening on %s\n", l)
			}
			srv := &api.Server{Backend: api.ServiceBackend{S: e.svc()}, Log: e.log, Token: token, Version: Version, StateDir: e.state.Root,
				Message: func(err error) string { return userMessage(err.Error()) }}
			serves := make([]func(context.Context) error, 0, len(lns)+1)
			for _, ln := range lns {
				serves = append(serves, func(ctx context.Context) error { return srv.Serve(ctx, ln) })
			}
			if ui {
				url, serve, _, err := e.console("127.0.0.1:0")
				if err != nil {
					return err
				}
				serves = append(serves, serve)
				fmt.Fprintf(e.stderr, "smx: console at %s (the token works once)\n", url)
			}
			errc := make(chan error, len(serves))
			for _, serve := range serves {
				go func() { errc <- serve(ctx) }()
			}
			var first error
			for range serves {
				if err := <-errc; err != nil && first == nil {
					first = err
					stop()
				}
			}
			return first
		},
	}
	cmd.Flags().StringArrayVar(&listen, "listen", nil, "unix:PATH or tcp:HOST:PORT (repeatable; default unix:$SMX_HOME/smx.sock)")
	cmd.Flags().BoolVar(&ui, "ui", false, "also serve the web console on 127.0.0.1 (a free port; its login URL is printed, as `smx ui` does)")
	cmd.Flags().StringVar(&tokenFile, "token-file", "", "file holding the bearer token every request must carry (required with tcp:)")
	return cmd
}

// listenAPI opens one API listener. A unix socket gets the state
// directory's permissions (less execute bits) and is replaced only when no
// other `smx serve` holds it; TCP needs a token.
func (e *env) listenAPI(spec, token string) (net.Listener, error) {
	kind, addr, ok := strings.Cut(spec, ":")
	switch {
	case !ok || addr == "":
	case kind == "tcp":
		if token == "" {
			return nil, fmt.Errorf("--listen %s: a TCP listener needs --token-file (anyone on the network could drive sandboxes otherwise): %w", spec, errdefs.ErrInvalid)
		}
		return net.Listen("tcp", addr)
	case kind == "unix":
		fi, err := os.Stat(e.state.Root)
		if err != nil {
			return nil, err
		}
		lock, err := service.TryLock(addr + ".lock")
		if err != nil && !errors.Is(err, service.ErrLocked) {
			return nil, err
		}
		if err != nil {
			return nil, fmt.Errorf("%s is served by another `smx serve` (stop it first, or --listen elsewhere): %w", addr, errdefs.ErrInUse)
		}
		os.Remove(addr)
		// Created private, then opened to the state directory's mode:
		// never reachable by more than that, not even for a moment.
		old := syscall.Umask(0o177)
		ln, err := net.Listen("unix", addr)
		syscall.Umask(old)
		if err != nil {
			lock.Unlock()
			return nil, fmt.Errorf("listen %s: %w", addr, err)
		}
		if err := os.Chmod(addr, fi.Mode().Perm()&0o666); err != nil {
			ln.Close()
			lock.Unlock()
			return nil, err
		}
		return &lockedListener{Listener: ln, lock: lock}, nil
	}
	return nil, fmt.Errorf("--listen %q: use unix:PATH or tcp:HOST:PORT: %w", spec, errdefs.ErrInvalid)
}

type lockedListener struct {
	net.Listener
	lock *service.FileLock
}

func (l *lockedListener) Close() error {
	err := l.Listener.Close()
	l.lock.Unlock()
	return err
}
