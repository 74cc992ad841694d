package api

import (
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	wire "github.com/smx-dev/smx/api"
	"github.com/smx-dev/smx/internal/errdefs"
)

// MaxBody bounds a JSON request body; a larger one is refused with 413.
const MaxBody = 1 << 20

// Server is the HTTP API over a Backend.
type Server struct {
	Backend Backend
	Log     *slog.Logger
	// Token, when set, must come with every request as
	// "Authorization: Bearer TOKEN" (required on TCP listeners).
	Token string
	// Version is reported by GET /v1/info; StateDir too.
	Version  string
	StateDir string
	// Message, when set, words an error for the caller (the CLI's one
	// sentence without internal steps); default: Message.
	Message func(error) string

	once   sync.Once
	mux    *http.ServeMux
	routes []Route
}

// Route is one method and path pattern the server answers (the path in
// OpenAPI's template syntax, which Go's ServeMux shares).
type Route struct{ Method, Path string }

// Routes lists every route the server answers, for the OpenAPI check.
func (s *Server) Routes() []Route {
	s.init()
	return s.routes
}

func (s *Server) handle(method, path string, h func(w http.ResponseWriter, r *http.Request) error) {
	s.routes = append(s.routes, Route{method, path})
	s.mux.HandleFunc(method+" "+path, func(w http.ResponseWriter, r *http.Request) {
		if err := h(w, r); err != nil {
			s.writeError(w, r, err)
		}
	})
}

func (s *Server) init() { s.once.Do(s.build) }

func (s *Server) build() {
	if s.Log == nil {
		s.Log = slog.New(slog.DiscardHandler)
	}
	s.mux = http.NewServeMux()
	s.handle("GET", "/v1/info", s.info)
	s.handle("GET", "/v1/openapi.yaml", func(w http.ResponseWriter, r *http.Request) error {
		w.Header().Set("Content-Type", "application/yaml")
		_, err := w.Write(wire.OpenAPI)
		return err
	})
	s.handle("GET", "/v1/images", func(w http.ResponseWriter, r *http.Request) error {
		l, err := s.Backend.Images(r.Context())
		return reply(w, http.StatusOK, nonNil(l), err)
	})
	s.handle("POST", "/v1/images", func(w http.ResponseWriter, r *http.Request) error {
		var req wire.ImageRequest
		if err := readJSON(w, r, &req); err != nil {
			return err
		}
		im, err := s.Backend.BuildImage(r.Context(), req)
		return reply(w, http.StatusCreated, im, err)
	})
	s.handle("GET", "/v1/images/{name}", func(w http.ResponseWriter, r *http.Request) error {
		im, err := s.Backend.InspectImage(r.Context(), r.PathValue("name"))
		return reply(w, http.StatusOK, im, err)
	})
	s.handle("DELETE", "/v1/images/{name}", func(w http.ResponseWriter, r *http.Request) error {
		if err := s.Backend.RemoveImage(r.Context(), r.PathValue("name")); err != nil {
			return err
		}
		w.WriteHeader(http.StatusNoContent)
		return nil
	})
	s.handle("GET", "/v1/sandboxes", func(w http.ResponseWriter, r *http.Request) error {
		l, err := s.Backend.List(r.Context())
		return reply(w, http.StatusOK, nonNil(l), err)
	})
	s.handle("POST", "/v1/sandboxes", func(w http.ResponseWriter, r *http.Request) error {
		var req wire.CreateRequest
		if err := readJSON(w, r, &req); err != nil {
			return err
		}
		sb, err := s.Backend.Create(r.Context(), req)
		return reply(w, http.StatusCreated, sb, err)
	})
	s.handle("GET", "/v1/sandboxes/{name}", func(w http.ResponseWriter, r *http.Request) error {
		sb, err := s.Backend.Inspect(r.Context(), r.PathValue("name"))
		return reply(w, http.StatusOK, sb, err)
	})
	s.handle("DELETE", "/v1/sandboxes/{name}", func(w http.ResponseWriter, r *http.Request) error {
		force, err := boolQuery(r, "force")
		if err != nil {
			return err
		}
		if err := s.Backend.Remove(r.Context(), r.PathValue("name"), force); err != nil {
			return err
		}
		w.WriteHeader(http.StatusNoContent)
		return nil
	})
	s.handle("POST", "/v1/sandboxes/{name}/start", func(w http.ResponseWriter, r *http.Request) error {
		cold, err := boolQuery(r, "cold")
		if err != nil {
			return err
		}
		sb, err := s.Backend.Start(r.Context(), r.PathValue("name"), cold)
		return reply(w, http.StatusOK, sb, err)
	})
	s.handle("POST", "/v1/sandboxes/{name}/stop", func(w http.ResponseWriter, r *http.Request) error {
		timeout := 30 * time.Second
		if v := r.URL.Query().Get("timeout"); v != "" {
			d, err := time.ParseDuration(v)
			if err != nil || d < 0 {
				return fmt.Errorf("timeout %q: want a duration such as 10s: %w", v, errdefs.ErrInvalid)
			}
			timeout = d
		}
		sb, err := s.Backend.Stop(r.Context(), r.PathValue("name"), timeout)
		return reply(w, http.StatusOK, sb, err)
	})
	for _, verb := range []string{"pause", "resume", "suspend"} {
		s.handle("POST", "/v1/sandboxes/{name}/"+verb, func(w http.ResponseWriter, r *http.Request) error {
			fn := map[string]func(context.Context, string) (*wire.Sandbox, error){
				"pause": s.Backend.Pause, "resume": s.Backend.Resume, "suspend": s.Backend.Suspend}[verb]
			sb, err := fn(r.Context(), r.PathValue("name"))
			return reply(w, http.StatusOK, sb, err)
		})
	}
	s.handle("POST", "/v1/sandboxes/{name}/exec", s.execBuffered)
	s.handle("GET", "/v1/sandboxes/{name}/exec", s.execStream)
	s.handle("PUT", "/v1/sandboxes/{name}/files", func(w http.ResponseWriter, r *http.Request) error {
		dir := r.URL.Query().Get("path")
		if !strings.HasPrefix(dir, "/") {
			return fmt.Errorf("path %q: want an absolute guest directory: %w", dir, errdefs.ErrInvalid)
		}
		n, err := s.Backend.CopyIn(r.Context(), r.PathValue("name"), dir, r.Body)
		return reply(w, http.StatusOK, wire.CopyResult{Bytes: n}, err)
	})
	s.handle("GET", "/v1/sandboxes/{name}/files", s.copyOut)
	s.handle("POST", "/v1/sandboxes/{name}/snapshots", func(w http.ResponseWriter, r *http.Request) error {
		var req wire.SnapshotRequest
		if err := readJSON(w, r, &req); err != nil {
			return err
		}
		sn, err := s.Backend.Snapshot(r.Context(), r.PathValue("name"), req)
		return reply(w, http.StatusCreated, sn, err)
	})
	s.handle("PUT", "/v1/sandboxes/{name}/policy", func(w http.ResponseWriter, r *http.Request) error {
		var req wire.PolicyRequest
		if err := readJSON(w, r, &req); err != nil {
			return err
		}
		if req.Profile == "" {
			return fmt.Errorf("profile is empty: name a built-in, a profile in the state dir, or a file: %w", errdefs.ErrInvalid)
		}
		res, err := s.Backend.SetPolicy(r.Context(), r.PathValue("name"), req.Profile)
		return reply(w, http.StatusOK, res, err)
	})
	s.handle("GET", "/v1/creds", func(w http.ResponseWriter, r *http.Request) error {
		l, err := s.Backend.Credentials(r.Context())
		return reply(w, http.StatusOK, nonNil(l), err)
	})
	s.handle("PUT", "/v1/creds/{name}", func(w http.ResponseWriter, r *http.Request) error {
		var req wire.CredentialRequest
		if err := readJSON(w, r, &req); err != nil {
			return err
		}
		c, err := s.Backend.SetCredential(r.Context(), r.PathValue("name"), []byte(req.Value))
		return reply(w, http.StatusOK, c, err)
	})
	s.handle("DELETE", "/v1/creds/{name}", func(w http.ResponseWriter, r *http.Request) error {
		if err := s.Backend.RemoveCredential(r.Context(), r.PathValue("name")); err != nil {
			return err
		}
		w.WriteHeader(http.StatusNoContent)
		return nil
	})
	s.handle("POST", "/v1/creds/login", func(w http.ResponseWriter, r *http.Request) error {
		var req wire.LoginRequest
		if err := readJSON(w, r, &req); err != nil {
			return err
		}
		res, err := s.Backend.Login(r.Context(), req)
		return reply(w, http.StatusOK, res, err)
	})
	s.handle("GET", "/v1/ssh-ca", func(w http.ResponseWriter, r *http.Request) error {
		ca, err := s.Backend.SSHUserCA(r.Context())
		return reply(w, http.StatusOK, ca, err)
	})
	s.handle("POST", "/v1/ssh-ca/rotate", func(w http.ResponseWriter, r *http.Request) error {
		ca, err := s.Backend.RotateSSHUserCA(r.Context())
		return reply(w, http.StatusOK, ca, err)
	})
	s.handle("GET", "/v1/kernels", func(w http.ResponseWriter, r *http.Request) error {
		l, err := s.Backend.Kernels(r.Context())
		return reply(w, http.StatusOK, nonNil(l), err)
	})
	s.handle("POST", "/v1/kernels", func(w http.ResponseWriter, r *http.Request) error {
		var req wire.KernelBuildRequest
		if err := readJSON(w, r, &req); err != nil {
			return err
		}
		k, err := s.Backend.BuildKernel(r.Context(), req)
		return reply(w, http.StatusCreated, k, err)
	})
	s.handle("DELETE", "/v1/kernels/{version}", func(w http.ResponseWriter, r *http.Request) error {
		if err := s.Backend.RemoveKernel(r.Context(), r.PathValue("version")); err != nil {
			return err
		}
		w.WriteHeader(http.StatusNoContent)
		return nil
	})
	s.handle("GET", "/v1/doctor", func(w http.ResponseWriter, r *http.Request) error {
		rep, err := s.Backend.Doctor(r.Context())
		return reply(w, http.StatusOK, rep, err)
	})
	s.handle("GET", "/v1/templates", func(w http.ResponseWriter, r *http.Request) error {
		l, err := s.Backend.Templates(r.Context())
		return reply(w, http.StatusOK, nonNil(l), err)
	})
	s.handle("DELETE", "/v1/templates/{name}", func(w http.ResponseWriter, r *http.Request) error {
		if err := s.Backend.RemoveTemplate(r.Context(), r.PathValue("name")); err != nil {
			return err
		}
		w.WriteHeader(http.StatusNoContent)
		return nil
	})
	s.handle("POST", "/v1/templates/{name}/push", func(w http.ResponseWriter, r *http.Request) error {
		var req wire.PushRequest
		if err := readJSON(w, r, &req); err != nil {
			return err
		}
		res, err := s.Backend.PushTemplate(r.Context(), r.PathValue("name"), req)
		return reply(w, http.StatusOK, res, err)
	})
	s.handle("POST", "/v1/templates/pull", func(w http.ResponseWriter, r *http.Request) error {
		var req wire.PullRequest
		if err := readJSON(w, r, &req); err != nil {
			return err
		}
		res, err := s.Backend.PullTemplate(r.Context(), req)
		return reply(w, http.StatusOK, res, err)
	})
	s.handle("POST", "/v1/snapshots/{name}/push", func(w http.ResponseWriter, r *http.Request) error {
		var req wire.PushRequest
		if err := readJSON(w, r, &req); err != nil {
			return err
		}
		res, err := s.Backend.PushSnapshot(r.Context(), r.PathValue("name"), req)
		return reply(w, http.StatusOK, res, err)
	})
	s.handle("POST", "/v1/snapshots/pull", func(w http.ResponseWriter, r *http.Request) error {
		var req wire.PullRequest
		if err := readJSON(w, r, &req); err != nil {
			return err
		}
		res, err := s.Backend.PullSnapshot(r.Context(), req)
		return reply(w, http.StatusOK, res, err)
	})
	s.handle("GET", "/v1/logs", func(w http.ResponseWriter, r *http.Request) error {
		l, err := s.Backend.LogNames(r.Context())
		return reply(w, http.StatusOK, nonNil(l), err)
	})
	s.handle("POST", "/v1/logs/prune", func(w http.ResponseWriter, r *http.Request) error {
		var req wire.LogPruneRequest
		if err := readJSON(w, r, &req); err != nil {
			return err
		}
		res, err := s.Backend.PruneLogs(r.Context(), req)
		return reply(w, http.StatusOK, res, err)
	})
	s.handle("GET", "/v1/sandboxes/{name}/ports", func(w http.ResponseWriter, r *http.Request) error {
		l, err := s.Backend.Ports(r.Context(), r.PathValue("name"))
		return reply(w, http.StatusOK, l, err)
	})
	s.handle("POST", "/v1/sandboxes/{name}/ports", func(w http.ResponseWriter, r *http.Request) error {
		var req wire.PortRequest
		if err := readJSON(w, r, &req); err != nil {
			return err
		}
		l, err := s.Backend.AddPort(r.Context(), r.PathValue("name"), req)
		return reply(w, http.StatusOK, l, err)
	})
	s.handle("DELETE", "/v1/sandboxes/{name}/ports", func(w http.ResponseWriter, r *http.Request) error {
		port := r.URL.Query().Get("port")
		if port == "" {
			return fmt.Errorf("port is empty: name the published port as [HOSTIP:]HOSTPORT: %w", errdefs.ErrInvalid)
		}
		l, err := s.Backend.RemovePort(r.Context(), r.PathValue("name"), port)
		return reply(w, http.StatusOK, l, err)
	})
	s.handle("POST", "/v1/sandboxes/{name}/mounts", func(w http.ResponseWriter, r *http.Request) error {
		var req wire.MountRequest
		if err := readJSON(w, r, &req); err != nil {
			return err
		}
		l, err := s.Backend.AddMount(r.Context(), r.PathValue("name"), req)
		return reply(w, http.StatusOK, l, err)
	})
	s.handle("DELETE", "/v1/sandboxes/{name}/mounts", func(w http.ResponseWriter, r *http.Request) error {
		guest := r.URL.Query().Get("guest")
		if guest == "" {
			return fmt.Errorf("guest is empty: name the mount by its guest path: %w", errdefs.ErrInvalid)
		}
		l, err := s.Backend.RemoveMount(r.Context(), r.PathValue("name"), guest)
		return reply(w, http.StatusOK, l, err)
	})
	s.handle("GET", "/v1/sandboxes/{name}/logs", s.logs)
	s.handle("GET", "/v1/sandboxes/{name}/logs/verify", func(w http.ResponseWriter, r *http.Request) error {
		rep, err := s.Backend.VerifyLog(r.Context(), r.PathValue("name"))
		return reply(w, http.StatusOK, rep, err)
	})
	s.handle("GET", "/v1/sandboxes/{name}/profile", func(w http.ResponseWriter, r *http.Request) error {
		p, err := s.Backend.SandboxProfile(r.Context(), r.PathValue("name"))
		return reply(w, http.StatusOK, p, err)
	})
	s.handle("POST", "/v1/sandboxes/{name}/explain", func(w http.ResponseWriter, r *http.Request) error {
		var req wire.ExplainRequest
		if err := readJSON(w, r, &req); err != nil {
			return err
		}
		ex, err := s.Backend.ExplainSandbox(r.Context(), r.PathValue("name"), req.Request)
		return reply(w, http.StatusOK, ex, err)
	})
	s.handle("POST", "/v1/agents", s.runAgent)
	s.handle("GET", "/v1/agents/{name}", func(w http.ResponseWriter, r *http.Request) error {
		a, err := s.Backend.Agent(r.Context(), r.PathValue("name"))
		return reply(w, http.StatusOK, a, err)
	})
	s.handle("GET", "/v1/snapshots", func(w http.ResponseWriter, r *http.Request) error {
		l, err := s.Backend.Snapshots(r.Context())
		return reply(w, http.StatusOK, nonNil(l), err)
	})
	s.handle("GET", "/v1/snapshots/{name}", func(w http.ResponseWriter, r *http.Request) error {
		verify, err := boolQuery(r, "verify")
		if err != nil {
			return err
		}
		sn, err := s.Backend.GetSnapshot(r.Context(), r.PathValue("name"), verify)
		return reply(w, http.StatusOK, sn, err)
	})
	s.handle("DELETE", "/v1/snapshots/{name}", func(w http.ResponseWriter, r *http.Request) error {
		if err := s.Backend.RemoveSnapshot(r.Context(), r.PathValue("name")); err != nil {
			return err
		}
		w.WriteHeader(http.StatusNoContent)
		return nil
	})
	s.handle("POST", "/v1/snapshots/{name}/fork", func(w http.ResponseWriter, r *http.Request) error {
		var req wire.ForkRequest
		if err := readJSON(w, r, &req); err != nil {
			return err
		}
		sb, err := s.Backend.Fork(r.Context(), r.PathValue("name"), req)
		return reply(w, http.StatusCreated, sb, err)
	})
	s.handle("GET", "/v1/profiles", func(w http.ResponseWriter, r *http.Request) error {
		l, err := s.Backend.Profiles(r.Context())
		return reply(w, http.StatusOK, nonNil(l), err)
	})
	s.handle("GET", "/v1/profiles/{name}", func(w http.ResponseWriter, r *http.Request) error {
		p, err := s.Backend.ShowProfile(r.Context(), r.PathValue("name"))
		return reply(w, http.StatusOK, p, err)
	})
	s.handle("POST", "/v1/profiles/check", func(w http.ResponseWriter, r *http.Request) error {
		var req wire.CheckRequest
		if err := readJSON(w, r, &req); err != nil {
			return err
		}
		res, err := s.Backend.CheckProfile(r.Context(), req)
		return reply(w, http.StatusOK, res, err)
	})
	s.handle("POST", "/v1/profiles/{name}/explain", func(w http.ResponseWriter, r *http.Request) error {
		var req wire.ExplainRequest
		if err := readJSON(w, r, &req); err != nil {
			return err
		}
		ex, err := s.Backend.Explain(r.Context(), r.PathValue("name"), req.Request)
		return reply(w, http.StatusOK, ex, err)
	})
	s.handle("GET", "/v1/approvals", func(w http.ResponseWriter, r *http.Request) error {
		list, err := s.Backend.Approvals(r.Context(), r.URL.Query().Get("sandbox"))
		return reply(w, http.StatusOK, wire.Approvals{Approvals: list}, err)
	})
	s.handle("POST", "/v1/approvals/{id}", func(w http.ResponseWriter, r *http.Request) error {
		var req wire.ApprovalDecision
		if err := readJSON(w, r, &req); err != nil {
			return err
		}
		by := "api"
		if r.Header.Get("X-Smx-Console") != "" {
			by = "console"
		}
		// The answer outlives a client that hangs up: the rule may be
		// half written otherwise.
		a, err := s.Backend.Answer(context.WithoutCancel(r.Context()), r.PathValue("id"), req.Decision, by)
		return reply(w, http.StatusOK, a, err)
	})
	s.handle("GET", "/v1/events", s.events)
}

// ServeHTTP logs the request under --debug, then serves it.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.init()
	if !s.Log.Enabled(r.Context(), slog.LevelDebug) {
		s.serve(w, r)
		return
	}
	lw := &loggedWriter{ResponseWriter: w, status: http.StatusOK}
	start := time.Now()
	s.serve(lw, r)
	s.Log.Debug("api request", "method", r.Method, "path", r.URL.Path, "query", r.URL.RawQuery,
		"status", lw.status, "bytes", lw.bytes, "duration", time.Since(start))
}

// serve checks the token, then routes; an unknown route is a JSON 404.
func (s *Server) serve(w http.ResponseWriter, r *http.Request) {
	if s.Token != "" {
		got, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		if !ok || subtle.ConstantTimeCompare([]byte(got), []byte(s.Token)) != 1 {
			w.Header().Set("WWW-Authenticate", `Bearer realm="smx"`)
			writeJSON(w, http.StatusUnauthorized, wire.Error{Class: wire.ClassDenied,
				Message: "missing or wrong bearer token: send Authorization: Bearer TOKEN (the --token-file of `smx serve`)"})
			return
		}
	}
	h, pattern := s.mux.Handler(r)
	if pattern == "" {
		// ServeMux answers 404/405 in plain text; the API answers JSON.
		status, msg := http.StatusNotFound, "no such route: "+r.Method+" "+r.URL.Path+": see GET /v1/openapi.yaml"
		rec := &statusRecorder{header: http.Header{}}
		h.ServeHTTP(rec, r)
		if rec.status == http.StatusMethodNotAllowed {
			status, msg = http.StatusMethodNotAllowed, r.Method+" is not allowed on "+r.URL.Path
			w.Header().Set("Allow", rec.header.Get("Allow"))
		}
		class := wire.ClassNotFound
		if status == http.StatusMethodNotAllowed {
			class = wire.ClassInvalid
		}
		writeJSON(w, status, wire.Error{Class: class, Message: msg})
		return
	}
	// ServeMux sets the path values (Handler does not).
	s.mux.ServeHTTP(w, r)
}

// loggedWriter records a response's status and size for --debug; Unwrap
// keeps flushing and the WebSocket upgrade working through it.
type loggedWriter struct {
	http.ResponseWriter
	status int
	bytes  int64
	wrote  bool
}

func (l *loggedWriter) WriteHeader(code int) {
	if !l.wrote {
		l.status, l.wrote = code, true
	}
	l.ResponseWriter.WriteHeader(code)
}

func (l *loggedWriter) Write(p []byte) (int, error) {
	l.wrote = true
	n, err := l.ResponseWriter.Write(p)
	l.bytes += int64(n)
	return n, err
}

func (l *loggedWriter) Unwrap() http.ResponseWriter { return l.ResponseWriter }

type statusRecorder struct {
	header http.Header
	status int
}

func (s *statusRecorder) Header() http.Header         { return s.header }
func (s *statusRecorder) Write(p []byte) (int, error) { return len(p), nil }
func (s *statusRecorder) WriteHeader(code int)        { s.status = code }

func (s *Server) info(w http.ResponseWriter, r *http.Request) error {
	return reply(w, http.StatusOK, wire.Info{API: wire.Version, Version: s.Version, State: s.StateDir}, nil)
}

// Serve answers on l until ctx ends, then shuts down (streams in progress,
// exec included, are cut, which ends their guest processes).
func (s *Server) Serve(ctx context.Context, l net.Listener) error {
	s.init()
	return Serve(ctx, l, s)
}

// Serve answers on l with h until ctx ends, then shuts down as
// Server.Serve does; the console serves the API through it.
func Serve(ctx context.Context, l net.Listener, h http.Handler) error {
	hs := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second,
		BaseContext: func(net.Listener) context.Context { return ctx }}
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
		defer cancel()
		hs.Shutdown(sctx)
		hs.Close()
	}()
	err := hs.Serve(l)
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return err
}

// ClassOf names err's errdefs class.
func ClassOf(err error) string {
	var mbe *http.MaxBytesError
	switch {
	case errors.As(err, &mbe):
		return wire.ClassTooLarge
	case errors.Is(err, errdefs.ErrNotFound):
		return wire.ClassNotFound
	case errors.Is(err, errdefs.ErrExists):
		return wire.ClassExists
	case errors.Is(err, errdefs.ErrInvalid):
		return wire.ClassInvalid
	case errors.Is(err, errdefs.ErrInUse):
		return wire.ClassInUse
	case errors.Is(err, errdefs.ErrUnavailable):
		return wire.ClassUnavailable
	case errors.Is(err, errdefs.ErrDenied):
		return wire.ClassDenied
	case errors.Is(err, errdefs.ErrFailed):
		return wire.ClassFailed
	}
	return wire.ClassInternal
}

// StatusOf is the HTTP status of an error class.
func StatusOf(class string) int {
	switch class {
	case wire.ClassNotFound:
		return http.StatusNotFound
	case wire.ClassExists, wire.ClassInUse:
		return http.StatusConflict
	case wire.ClassInvalid:
		return http.StatusBadRequest
	case wire.ClassTooLarge:
		return http.StatusRequestEntityTooLarge
	case wire.ClassUnavailable:
		return http.StatusServiceUnavailable
	case wire.ClassDenied:
		return http.StatusForbidden
	case wire.ClassFailed:
		return http.StatusPreconditionFailed
	}
	return http.StatusInternalServerError
}

// errorBody is err as the API reports it: its class and the one line a
// user acts on.
func (s *Server) errorBody(err error) wire.Error {
	msg := Message(err)
	if s.Message != nil {
		msg = s.Message(err)
	}
	e := wire.Error{Class: ClassOf(err), Message: msg}
	var se *StartError
	if errors.As(err, &se) {
		e.Class, e.ExitCode = wire.ClassFailed, se.ExitCode
	}
	return e
}

func (s *Server) writeError(w http.ResponseWriter, r *http.Request, err error) {
	if errors.Is(err, context.Canceled) && r.Context().Err() != nil {
		return // the client went away; nobody reads the answer
	}
	body := s.errorBody(err)
	s.Log.Debug("api error", "method", r.Method, "path", r.URL.Path, "class", body.Class, "err", err)
	writeJSON(w, StatusOf(body.Class), body)
}

// Message drops the errdefs class suffix from err's message; the rest
// (which names what to do next) is for the caller.
func Message(err error) string {
	msg := err.Error()
	for _, c := range []error{errdefs.ErrNotFound, errdefs.ErrExists, errdefs.ErrInvalid, errdefs.ErrInUse,
		errdefs.ErrUnavailable, errdefs.ErrDenied, errdefs.ErrFailed} {
		msg = strings.TrimSuffix(msg, ": "+c.Error())
	}
	return msg
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(v)
}

// reply writes v with status, or returns err for the caller's error path.
func reply(w http.ResponseWriter, status int, v any, err error) error {
	if err != nil {
		return err
	}
	writeJSON(w, status, v)
	return nil
}

func nonNil[T any](l []T) []T {
	if l == nil {
		return []T{}
	}
	return l
}

// readJSON decodes one JSON object of at most MaxBody bytes, refusing
// unknown fields and trailing data; an empty body is the zero value.
func readJSON(w http.ResponseWriter, r *http.Request, v any) error {
	body := http.MaxBytesReader(w, r.Body, MaxBody)
	b, err := io.ReadAll(body)
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return fmt.Errorf("request body over %d bytes: %w", MaxBody, err)
		}
		return fmt.Errorf("read request body: %w: %w", err, errdefs.ErrInvalid)
	}
	if len(strings.TrimSpace(string(b))) == 0 {
		return nil
	}
	dec := json.NewDecoder(strings.NewReader(string(b)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("bad JSON body: %v: %w", err, errdefs.ErrInvalid)
	}
	if dec.More() {
		return fmt.Errorf("bad JSON body: data after the object: %w", errdefs.ErrInvalid)
	}
	return nil
}

func boolQuery(r *http.Request, key string) (bool, error) {
	v := r.URL.Query().Get(key)
	if v == "" {
		return false, nil
	}
	b, err := strconv.ParseBool(v)
	if err != nil {
		return false, fmt.Errorf("query %s=%q: want true or false: %w", key, v, errdefs.ErrInvalid)
	}
	return b, nil
}
