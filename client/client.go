// Package client is the Go client of smx's local HTTP API (`smx serve`).
//
//	c := client.New("")                      // $SMX_HOME/smx.sock
//	sb, err := c.Create(ctx, client.CreateRequest{Name: "dev", Start: true})
//	st, err := c.Exec(ctx, "dev", client.ExecRequest{Args: []string{"uname", "-a"}},
//		client.ExecIO{Stdout: os.Stdout, Stderr: os.Stderr})
//
// Errors from the server are *APIError values; errors.Is(err,
// client.ErrNotFound) and the other class sentinels test their class.
// A Client is safe for concurrent use.
package client

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/smx-dev/smx/api"
)

// The wire types, under this package's name.
type (
	Info            = api.Info
	Image           = api.Image
	ImageRequest    = api.ImageRequest
	Sandbox         = api.Sandbox
	CreateRequest   = api.CreateRequest
	PortRequest     = api.PortRequest
	PortList        = api.PortList
	MountRequest    = api.MountRequest
	MountList       = api.MountList
	PortBinding     = api.PortBinding
	ExecRequest     = api.ExecRequest
	ExecResult      = api.ExecResult
	Snapshot        = api.Snapshot
	SnapshotRequest = api.SnapshotRequest
	ForkRequest     = api.ForkRequest
	Profile         = api.Profile
	CheckResult     = api.CheckResult
	Explanation     = api.Explanation
	PolicyResult    = api.PolicyResult
	Record          = api.Record
	VerifyReport    = api.VerifyReport
	Event           = api.Event
	Approval        = api.Approval
	Credential      = api.Credential
	LoginRequest    = api.LoginRequest
	LoginResult     = api.LoginResult
	SSHCA           = api.SSHCA
	Kernel          = api.Kernel
	DoctorReport    = api.DoctorReport
	PushRequest     = api.PushRequest
	PushedLayer     = api.PushedLayer
	PushResult      = api.PushResult
	PullRequest     = api.PullRequest
	PullResult      = api.PullResult
)

// Class sentinels: errors.Is(err, ErrNotFound) holds for an *APIError of
// that class.
var (
	ErrNotFound    = errors.New("not found")
	ErrExists      = errors.New("already exists")
	ErrInvalid     = errors.New("invalid argument")
	ErrInUse       = errors.New("in use")
	ErrUnavailable = errors.New("unavailable")
	ErrDenied      = errors.New("denied")
	ErrFailed      = errors.New("failed precondition")
)

var classErrors = map[string]error{
	api.ClassNotFound: ErrNotFound, api.ClassExists: ErrExists, api.ClassInvalid: ErrInvalid,
	api.ClassTooLarge: ErrInvalid, api.ClassInUse: ErrInUse, api.ClassUnavailable: ErrUnavailable,
	api.ClassDenied: ErrDenied, api.ClassFailed: ErrFailed,
}

// APIError is a refusal or failure the server answered.
type APIError struct {
	Status   int    // HTTP status
	Class    string // api.Class*: not_found, invalid, ...
	Message  string
	ExitCode int // an exec whose command could not start: 127 or 126
}

func (e *APIError) Error() string { return e.Message }

// Is matches the class sentinels.
func (e *APIError) Is(target error) bool { return classErrors[e.Class] == target }

// Client talks to one `smx serve`.
type Client struct {
	base  string
	token string
	hc    *http.Client
	dial  func(ctx context.Context) (net.Conn, error)
}

// DefaultSocket is where `smx serve` listens by default: $SMX_HOME/smx.sock,
// with SMX_HOME defaulting as smx's does ($XDG_STATE_HOME/smx, or
// /var/lib/smx for root).
func DefaultSocket() string {
	home := os.Getenv("SMX_HOME")
	switch {
	case home != "":
	case os.Geteuid() == 0:
		home = "/var/lib/smx"
	case os.Getenv("XDG_STATE_HOME") != "":
		home = filepath.Join(os.Getenv("XDG_STATE_HOME"), "smx")
	default:
		h, _ := os.UserHomeDir()
		home = filepath.Join(h, ".local", "state", "smx")
	}
	return filepath.Join(home, "smx.sock")
}

// New returns a client of the unix socket at path ("" for DefaultSocket).
func New(path string) *Client {
	if path == "" {
		path = DefaultSocket()
	}
	dial := func(ctx context.Context) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", path)
	}
	return newClient("http://smx", "", dial)
}

// NewTCP returns a client of a TCP listener (`smx serve --listen
// tcp:ADDR --token-file F`), sending token as a bearer token.
func NewTCP(addr, token string) *Client {
	dial := func(ctx context.Context) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "tcp", addr)
	}
	return newClient("http://"+addr, token, dial)
}

func newClient(base, token string, dial func(context.Context) (net.Conn, error)) *Client {
	tr := &http.Transport{
		DialContext:         func(ctx context.Context, _, _ string) (net.Conn, error) { return dial(ctx) },
		MaxIdleConnsPerHost: 64,
		IdleConnTimeout:     90 * time.Second,
	}
	return &Client{base: base, token: token, dial: dial, hc: &http.Client{Transport: tr}}
}

func (c *Client) request(ctx context.Context, method, path string, q url.Values, body io.Reader, ctype string) (*http.Response, error) {
	u := c.base + path
	if len(q) > 0 {
		u += "?" + q.Encode()
	}
	req, err := http.NewRequestWithContext(ctx, method, u, body)
	if err != nil {
		return nil, err
	}
	if ctype != "" {
		req.Header.Set("Content-Type", ctype)
	}
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return nil, fmt.Errorf("smx api: %s %s: %w", method, path, err)
	}
	if resp.StatusCode >= 300 {
		defer resp.Body.Close()
		return nil, decodeError(resp)
	}
	return resp, nil
}

func decodeError(resp *http.Response) error {
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	var body api.Error
	if json.Unmarshal(b, &body) != nil || body.Message == "" {
		body = api.Error{Class: api.ClassInternal, Message: fmt.Sprintf("smx api: %s: %s", resp.Status, bytes.TrimSpace(b))}
	}
	return &APIError{Status: resp.StatusCode, Class: body.Class, Message: body.Message, ExitCode: body.ExitCode}
}

// do sends in as JSON (when not nil) and decodes the answer into out
// (when not nil).
func (c *Client) do(ctx context.Context, method, path string, q url.Values, in, out any) error {
	var body io.Reader
	ctype := ""
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return err
		}
		body, ctype = bytes.NewReader(b), "application/json"
	}
	resp, err := c.request(ctx, method, path, q, body, ctype)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if out == nil {
		io.Copy(io.Discard, resp.Body)
		return nil
	}
	if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
		return fmt.Errorf("smx api: %s %s: decode answer: %w", method, path, err)
	}
	return nil
}

func sb(name string) string { return "/v1/sandboxes/" + url.PathEscape(name) }

// Info says which API and smx version answer.
func (c *Client) Info(ctx context.Context) (*Info, error) {
	var v Info
	return &v, c.do(ctx, "GET", "/v1/info", nil, nil, &v)
}

// Images lists guest images.
func (c *Client) Images(ctx context.Context) ([]Image, error) {
	var v []Image
	return v, c.do(ctx, "GET", "/v1/images", nil, nil, &v)
}

// BuildImage builds (req.From) or imports (req.Ref) an image.
func (c *Client) BuildImage(ctx context.Context, req api.ImageRequest) (*Image, error) {
	var v Image
	return &v, c.do(ctx, "POST", "/v1/images", nil, req, &v)
}

// InspectImage returns one image.
func (c *Client) InspectImage(ctx context.Context, name string) (*Image, error) {
	var v Image
	return &v, c.do(ctx, "GET", "/v1/images/"+url.PathEscape(name), nil, nil, &v)
}

// RemoveImage removes an image no sandbox or snapshot uses.
func (c *Client) RemoveImage(ctx context.Context, name string) error {
	return c.do(ctx, "DELETE", "/v1/images/"+url.PathEscape(name), nil, nil, nil)
}

// Credentials lists the host-side secrets by name (never their values).
func (c *Client) Credentials(ctx context.Context) ([]Credential, error) {
	var v []Credential
	return v, c.do(ctx, "GET", "/v1/creds", nil, nil, &v)
}

// SetCredential stores a secret under name, replacing any value of that
// name; the answer describes it without its value.
func (c *Client) SetCredential(ctx context.Context, name string, value []byte) (*Credential, error) {
	var v Credential
	return &v, c.do(ctx, "PUT", "/v1/creds/"+url.PathEscape(name), nil, api.CredentialRequest{Value: string(value)}, &v)
}

// RemoveCredential deletes a secret.
func (c *Client) RemoveCredential(ctx context.Context, name string) error {
	return c.do(ctx, "DELETE", "/v1/creds/"+url.PathEscape(name), nil, nil, nil)
}

// Login stores a preset's model API key (req.Key), or imports the server's
// user's own sign-in of the agent (req.Import).
func (c *Client) Login(ctx context.Context, req LoginRequest) (*LoginResult, error) {
	var v LoginResult
	return &v, c.do(ctx, "POST", "/v1/creds/login", nil, req, &v)
}

// SSHUserCA returns the SSH user CA (created on first use): its public
// key and the lines a target host installs to trust it.
func (c *Client) SSHUserCA(ctx context.Context) (*SSHCA, error) {
	var v SSHCA
	return &v, c.do(ctx, "GET", "/v1/ssh-ca", nil, nil, &v)
}

// RotateSSHUserCA replaces the SSH user CA's key.
func (c *Client) RotateSSHUserCA(ctx context.Context) (*SSHCA, error) {
	var v SSHCA
	return &v, c.do(ctx, "POST", "/v1/ssh-ca/rotate", nil, nil, &v)
}

// Kernels lists the cached guest kernels, newest (the default) first.
func (c *Client) Kernels(ctx context.Context) ([]Kernel, error) {
	var v []Kernel
	return v, c.do(ctx, "GET", "/v1/kernels", nil, nil, &v)
}

// BuildKernel builds smx's own guest kernel on the server's host
// (minutes; cached).
func (c *Client) BuildKernel(ctx context.Context, req api.KernelBuildRequest) (*Kernel, error) {
	var v Kernel
	return &v, c.do(ctx, "POST", "/v1/kernels", nil, req, &v)
}

// RemoveKernel removes a cached kernel no sandbox or snapshot is pinned to.
func (c *Client) RemoveKernel(ctx context.Context, version string) error {
	return c.do(ctx, "DELETE", "/v1/kernels/"+url.PathEscape(version), nil, nil, nil)
}

// Doctor checks the server's host.
func (c *Client) Doctor(ctx context.Context) (*DoctorReport, error) {
	var v DoctorReport
	return &v, c.do(ctx, "GET", "/v1/doctor", nil, nil, &v)
}

// Templates lists the boot templates.
func (c *Client) Templates(ctx context.Context) ([]Snapshot, error) {
	var v []Snapshot
	return v, c.do(ctx, "GET", "/v1/templates", nil, nil, &v)
}

// RemoveTemplate removes a boot template no sandbox or snapshot is backed by.
func (c *Client) RemoveTemplate(ctx context.Context, name string) error {
	return c.do(ctx, "DELETE", "/v1/templates/"+url.PathEscape(name), nil, nil, nil)
}

// PushTemplate sends boot template name to a registry, signed by the
// server's log key; its gateway CAs' private keys stay on the server.
func (c *Client) PushTemplate(ctx context.Context, name string, req PushRequest) (*PushResult, error) {
	var v PushResult
	return &v, c.do(ctx, "POST", "/v1/templates/"+url.PathEscape(name)+"/push", nil, req, &v)
}

// PullTemplate fetches a signed boot template; one the server has
// already is not an error (Present).
func (c *Client) PullTemplate(ctx context.Context, req PullRequest) (*PullResult, error) {
	var v PullResult
	return &v, c.do(ctx, "POST", "/v1/templates/pull", nil, req, &v)
}

// PushSnapshot sends snapshot name to a registry, signed by the server's
// log key.
func (c *Client) PushSnapshot(ctx context.Context, name string, req PushRequest) (*PushResult, error) {
	var v PushResult
	return &v, c.do(ctx, "POST", "/v1/snapshots/"+url.PathEscape(name)+"/push", nil, req, &v)
}

// PullSnapshot fetches a signed snapshot; Fork then starts it.
func (c *Client) PullSnapshot(ctx context.Context, req PullRequest) (*PullResult, error) {
	var v PullResult
	return &v, c.do(ctx, "POST", "/v1/snapshots/pull", nil, req, &v)
}

// LogNames lists every sandbox log, removed sandboxes' included.
func (c *Client) LogNames(ctx context.Context) ([]string, error) {
	var v []string
	return v, c.do(ctx, "GET", "/v1/logs", nil, nil, &v)
}

// PruneLogs deletes the logs of removed sandboxes (names, or all) and
// returns those pruned.
func (c *Client) PruneLogs(ctx context.Context, names []string, all bool) ([]string, error) {
	var v api.LogPruneResult
	err := c.do(ctx, "POST", "/v1/logs/prune", nil, api.LogPruneRequest{Names: names, All: all}, &v)
	return v.Pruned, err
}

// List lists sandboxes.
func (c *Client) List(ctx context.Context) ([]Sandbox, error) {
	var v []Sandbox
	return v, c.do(ctx, "GET", "/v1/sandboxes", nil, nil, &v)
}

// Inspect returns one sandbox, with its QEMU command line.
func (c *Client) Inspect(ctx context.Context, name string) (*Sandbox, error) {
	var v Sandbox
	return &v, c.do(ctx, "GET", sb(name), nil, nil, &v)
}

// Create creates a sandbox (and boots it with req.Start).
func (c *Client) Create(ctx context.Context, req CreateRequest) (*Sandbox, error) {
	var v Sandbox
	return &v, c.do(ctx, "POST", "/v1/sandboxes", nil, req, &v)
}

func (c *Client) verb(ctx context.Context, name, verb string, q url.Values) (*Sandbox, error) {
	var v Sandbox
	return &v, c.do(ctx, "POST", sb(name)+"/"+verb, q, nil, &v)
}

// Start boots a sandbox.
func (c *Client) Start(ctx context.Context, name string) (*Sandbox, error) {
	return c.verb(ctx, name, "start", nil)
}

// Stop powers a sandbox off within timeout (0: the server's default).
func (c *Client) Stop(ctx context.Context, name string, timeout time.Duration) (*Sandbox, error) {
	var q url.Values
	if timeout > 0 {
		q = url.Values{"timeout": {timeout.String()}}
	}
	return c.verb(ctx, name, "stop", q)
}

// Pause stops a sandbox's vCPUs.
func (c *Client) Pause(ctx context.Context, name string) (*Sandbox, error) {
	return c.verb(ctx, name, "pause", nil)
}

// Resume continues a paused sandbox or restores a suspended one.
func (c *Client) Resume(ctx context.Context, name string) (*Sandbox, error) {
	return c.verb(ctx, name, "resume", nil)
}

// Suspend saves a sandbox's state to disk and frees its memory.
func (c *Client) Suspend(ctx context.Context, name string) (*Sandbox, error) {
	return c.verb(ctx, name, "suspend", nil)
}

// Remove deletes a sandbox; force stops it first when it runs.
func (c *Client) Remove(ctx context.Context, name string, force bool) error {
	return c.do(ctx, "DELETE", sb(name), url.Values{"force": {strconv.FormatBool(force)}}, nil, nil)
}

// Run runs a command to its end and returns its collected output.
func (c *Client) Run(ctx context.Context, name string, req ExecRequest) (*ExecResult, error) {
	var v ExecResult
	return &v, c.do(ctx, "POST", sb(name)+"/exec", nil, req, &v)
}

// CopyIn extracts a tar stream into directory dir of the guest.
func (c *Client) CopyIn(ctx context.Context, name, dir string, tar io.Reader) (int64, error) {
	resp, err := c.request(ctx, "PUT", sb(name)+"/files", url.Values{"path": {dir}}, tar, "application/x-tar")
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	var v api.CopyResult
	err = json.NewDecoder(resp.Body).Decode(&v)
	return v.Bytes, err
}

// CopyOut returns a tar stream of path in the guest; the caller closes it.
func (c *Client) CopyOut(ctx context.Context, name, path string) (io.ReadCloser, error) {
	resp, err := c.request(ctx, "GET", sb(name)+"/files", url.Values{"path": {path}}, nil, "")
	if err != nil {
		return nil, err
	}
	return resp.Body, nil
}

// Snapshot saves a running sandbox's memory, devices and disk.
func (c *Client) Snapshot(ctx context.Context, name string, req SnapshotRequest) (*Snapshot, error) {
	var v Snapshot
	return &v, c.do(ctx, "POST", sb(name)+"/snapshots", nil, req, &v)
}

// Snapshots lists snapshots.
func (c *Client) Snapshots(ctx context.Context) ([]Snapshot, error) {
	var v []Snapshot
	return v, c.do(ctx, "GET", "/v1/snapshots", nil, nil, &v)
}

// GetSnapshot returns a snapshot; verify checks its digests first.
func (c *Client) GetSnapshot(ctx context.Context, name string, verify bool) (*Snapshot, error) {
	var v Snapshot
	return &v, c.do(ctx, "GET", "/v1/snapshots/"+url.PathEscape(name), url.Values{"verify": {strconv.FormatBool(verify)}}, nil, &v)
}

// RemoveSnapshot deletes a snapshot no sandbox depends on.
func (c *Client) RemoveSnapshot(ctx context.Context, name string) error {
	return c.do(ctx, "DELETE", "/v1/snapshots/"+url.PathEscape(name), nil, nil, nil)
}

// Fork starts a new sandbox from a snapshot.
func (c *Client) Fork(ctx context.Context, snapshot string, req ForkRequest) (*Sandbox, error) {
	var v Sandbox
	return &v, c.do(ctx, "POST", "/v1/snapshots/"+url.PathEscape(snapshot)+"/fork", nil, req, &v)
}

// Profiles lists security profiles.
func (c *Client) Profiles(ctx context.Context) ([]Profile, error) {
	var v []Profile
	return v, c.do(ctx, "GET", "/v1/profiles", nil, nil, &v)
}

// ShowProfile returns a profile as resolved, with its YAML.
func (c *Client) ShowProfile(ctx context.Context, ref string) (*Profile, error) {
	var v Profile
	return &v, c.do(ctx, "GET", "/v1/profiles/"+url.PathEscape(ref), nil, nil, &v)
}

// CheckProfile validates a profile's YAML.
func (c *Client) CheckProfile(ctx context.Context, yaml string) (*CheckResult, error) {
	var v CheckResult
	return &v, c.do(ctx, "POST", "/v1/profiles/check", nil, api.CheckRequest{YAML: yaml}, &v)
}

// Explain says whether profile ref allows request, by which rule.
func (c *Client) Explain(ctx context.Context, ref, request string) (*Explanation, error) {
	var v Explanation
	return &v, c.do(ctx, "POST", "/v1/profiles/"+url.PathEscape(ref)+"/explain", nil, api.ExplainRequest{Request: request}, &v)
}

// SandboxProfile returns the profile frozen into sandbox name, the one its
// gateways enforce.
func (c *Client) SandboxProfile(ctx context.Context, name string) (*Profile, error) {
	var v Profile
	return &v, c.do(ctx, "GET", sb(name)+"/profile", nil, nil, &v)
}

// ExplainSandbox decides request against sandbox name's frozen profile;
// the rule cites the file and line the user wrote it at.
func (c *Client) ExplainSandbox(ctx context.Context, name, request string) (*Explanation, error) {
	var v Explanation
	return &v, c.do(ctx, "POST", sb(name)+"/explain", nil, api.ExplainRequest{Request: request}, &v)
}

// Approvals lists the requests that wait for the host user's answer
// (rules that say ask), oldest first; sandbox "" means every sandbox.
func (c *Client) Approvals(ctx context.Context, sandbox string) ([]Approval, error) {
	var q url.Values
	if sandbox != "" {
		q = url.Values{"sandbox": {sandbox}}
	}
	var v api.Approvals
	if err := c.do(ctx, "GET", "/v1/approvals", q, nil, &v); err != nil {
		return nil, err
	}
	return v.Approvals, nil
}

// Answer answers a held request: api.DecideDeny, DecideOnce,
// DecideSandbox or DecideAlways (which writes the rule into the
// sandbox's profile file; the result says which rule and file).
func (c *Client) Answer(ctx context.Context, id, decision string) (*Approval, error) {
	var v Approval
	return &v, c.do(ctx, "POST", "/v1/approvals/"+url.PathEscape(id), nil, api.ApprovalDecision{Decision: decision}, &v)
}

// SetPolicy switches a sandbox to profile ref.
func (c *Client) SetPolicy(ctx context.Context, name, ref string) (*PolicyResult, error) {
	var v PolicyResult
	return &v, c.do(ctx, "PUT", sb(name)+"/policy", nil, api.PolicyRequest{Profile: ref}, &v)
}

// Ports lists a sandbox's published ports.
func (c *Client) Ports(ctx context.Context, name string) (*PortList, error) {
	var v PortList
	return &v, c.do(ctx, "GET", sb(name)+"/ports", nil, nil, &v)
}

// AddPort publishes a guest port on the host ([HOSTIP:]HOSTPORT:GUESTPORT).
func (c *Client) AddPort(ctx context.Context, name string, req PortRequest) (*PortList, error) {
	var v PortList
	return &v, c.do(ctx, "POST", sb(name)+"/ports", nil, req, &v)
}

// RemovePort withdraws a published port, named [HOSTIP:]HOSTPORT.
func (c *Client) RemovePort(ctx context.Context, name, port string) (*PortList, error) {
	var v PortList
	return &v, c.do(ctx, "DELETE", sb(name)+"/ports", url.Values{"port": {port}}, nil, &v)
}

// AddMount mounts a host folder in a running sandbox (HOST:GUEST[:ro], as -v).
func (c *Client) AddMount(ctx context.Context, name string, req MountRequest) (*MountList, error) {
	var v MountList
	return &v, c.do(ctx, "POST", sb(name)+"/mounts", nil, req, &v)
}

// RemoveMount unmounts the mount at guest path guest of a running sandbox;
// files the guest still holds open there fail from then on.
func (c *Client) RemoveMount(ctx context.Context, name, guest string) (*MountList, error) {
	var v MountList
	return &v, c.do(ctx, "DELETE", sb(name)+"/mounts", url.Values{"guest": {guest}}, nil, &v)
}

// LogOptions select log records.
type LogOptions struct {
	Follow   bool
	Refusals bool
	Since    time.Time
}

// Logs calls fn for each selected record of a sandbox's log; with Follow
// it goes on until ctx ends (then it returns nil).
func (c *Client) Logs(ctx context.Context, name string, o LogOptions, fn func(Record) error) error {
	q := url.Values{}
	if o.Follow {
		q.Set("follow", "true")
	}
	if o.Refusals {
		q.Set("refusals", "true")
	}
	if !o.Since.IsZero() {
		q.Set("since", o.Since.Format(time.RFC3339Nano))
	}
	return c.lines(ctx, sb(name)+"/logs", q, func(b []byte) error {
		var r Record
		if err := json.Unmarshal(b, &r); err != nil {
			return err
		}
		return fn(r)
	})
}

// VerifyLog checks a sandbox's log: hashes, chain, tree and signatures.
func (c *Client) VerifyLog(ctx context.Context, name string) (*VerifyReport, error) {
	var v VerifyReport
	return &v, c.do(ctx, "GET", sb(name)+"/logs/verify", nil, nil, &v)
}

// Events calls fn for each event (of the named sandboxes, or all) until
// ctx ends (then it returns nil) or fn fails.
func (c *Client) Events(ctx context.Context, sandboxes []string, fn func(Event) error) error {
	return c.lines(ctx, "/v1/events", url.Values{"sandbox": sandboxes}, func(b []byte) error {
		var ev Event
		if err := json.Unmarshal(b, &ev); err != nil {
			return err
		}
		return fn(ev)
	})
}

func (c *Client) lines(ctx context.Context, path string, q url.Values, fn func([]byte) error) error {
	resp, err := c.request(ctx, "GET", path, q, nil, "")
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 4<<20)
	for sc.Scan() {
		if err := fn(sc.Bytes()); err != nil {
			return err
		}
	}
	if err := sc.Err(); err != nil && ctx.Err() == nil {
		return fmt.Errorf("smx api: %s: %w", path, err)
	}
	return nil
}

// WithTransport returns a copy of c whose HTTP requests (all but the exec
// WebSocket) go through wrap's round tripper: for logging, tracing or
// checking answers.
func (c *Client) WithTransport(wrap func(http.RoundTripper) http.RoundTripper) *Client {
	c2 := *c
	c2.hc = &http.Client{Transport: wrap(c.hc.Transport)}
	return &c2
}
