package api

import (
	"context"
	"fmt"
	"io"
	"path/filepath"
	"time"

	wire "github.com/smx-dev/smx/api"
	"github.com/smx-dev/smx/internal/approval"
	"github.com/smx-dev/smx/internal/audit"
	"github.com/smx-dev/smx/internal/errdefs"
	"github.com/smx-dev/smx/internal/image"
	"github.com/smx-dev/smx/internal/ocisnap"
	"github.com/smx-dev/smx/internal/sandbox"
	"github.com/smx-dev/smx/internal/service"
	"github.com/smx-dev/smx/internal/snapshot"
	"github.com/smx-dev/smx/internal/tarfs"
)

// ServiceBackend is the Backend of the host service layer: each method is
// one call of service.Service, its result turned into wire types.
type ServiceBackend struct{ S *service.Service }

var _ Backend = ServiceBackend{}

func (b ServiceBackend) wireInfo(in sandbox.Info, uptime, refusals int64, withQEMU bool) *wire.Sandbox {
	var mounts []string
	for _, m := range in.Spec.Mounts {
		mounts = append(mounts, m.String())
	}
	s := &wire.Sandbox{
		Name: in.Spec.Name, Status: string(in.State.Status), Image: in.Spec.Image,
		Profile: in.Spec.Profile, ProfileHash: in.Spec.ProfileHash, CPUs: in.Spec.CPUs,
		MemoryMiB: in.Spec.MemoryMiB, DiskBytes: in.Spec.DiskBytes, Env: in.Spec.Env, Mounts: mounts,
		Snapshot: in.Spec.Snapshot, Kernel: in.Spec.Kernel, Created: in.Spec.Created,
		Started: in.State.Started, Stopped: in.State.Stopped, Accel: in.State.Accel, BootMS: in.State.BootMS,
		RestoredFrom: in.State.RestoredFrom, StopReason: in.State.StopReason, Error: in.State.Error, ConsoleTail: in.State.ConsoleTail,
		SupervisorPID: in.State.SupervisorPID, QEMUPID: in.State.QEMUPID,
		UptimeSeconds: uptime, Refusals: refusals, Template: in.Spec.Template,
	}
	if r, err := b.S.AgentRecord(in.Spec.Name); err == nil {
		s.Preset, s.Workspace, s.AgentExitCode = r.Preset, r.Workspace, r.ExitCode
	}
	if wt := in.Spec.Worktree; wt != nil {
		s.Worktree = &wire.Worktree{Repo: wt.Repo, Path: wt.Path, Branch: wt.Branch}
	}
	for _, c := range in.Spec.Caches {
		s.Caches = append(s.Caches, c.String())
	}
	if in.Spec.Timeout > 0 {
		s.Timeout = in.Spec.Timeout.String()
	}
	if in.Spec.IdleStop > 0 {
		s.IdleStop = in.Spec.IdleStop.String()
	}
	for _, u := range service.UsageOf(in) {
		cu := wire.CredentialUsage{Credential: u.Credential, Requests: u.Requests, InputTokens: u.Input, OutputTokens: u.Output,
			CacheReadTokens: u.CacheRead, CacheWriteTokens: u.CacheWrite, Day: u.Day, DayRequests: u.DayRequests, DayTokens: u.DayTokens}
		if b := u.Budget; b != nil {
			cu.Budget = &wire.Budget{Tokens: b.Tokens, Requests: b.Requests, Per: b.Per}
		}
		s.Usage = append(s.Usage, cu)
	}
	if withQEMU {
		s.QEMUArgs = in.State.QEMUArgs
	}
	return s
}

// WireSandbox is a service summary of a sandbox in its wire form (without
// the QEMU command line, which only Inspect gives), with its QEMU's host
// CPU time and memory while it is live.
func (b ServiceBackend) WireSandbox(sb *service.Sandbox) *wire.Sandbox {
	w := b.wireInfo(sb.Info, sb.UptimeSeconds, sb.Refusals, false)
	w.CPUSeconds, w.RSSBytes = sb.CPUSeconds, sb.RSSBytes
	return w
}

func (b ServiceBackend) Images(ctx context.Context) ([]wire.Image, error) {
	list, err := b.S.ListImages(ctx)
	var out []wire.Image
	for _, im := range list {
		out = append(out, wire.Image{Name: im.Name, Source: im.Source, Digest: im.Digest, Created: im.Created, Size: im.Size, DiskBytes: im.DiskBytes})
	}
	return out, err
}

// WireImage is an image in its wire form.
func WireImage(im *image.Image) *wire.Image {
	return &wire.Image{Name: im.Name, Source: im.Source, Digest: im.Digest, Created: im.Created, Size: im.Size, DiskBytes: im.DiskBytes}
}

func (b ServiceBackend) BuildImage(ctx context.Context, req wire.ImageRequest) (*wire.Image, error) {
	var im *image.Image
	var err error
	switch {
	case req.Ref != "" && (req.From != "" || len(req.Packages) > 0):
		return nil, fmt.Errorf("give either ref (an import) or from (a build), not both: %w", errdefs.ErrInvalid)
	case req.Ref != "":
		im, err = b.S.ImportImage(ctx, service.ImageImportRequest{Name: req.Name, Ref: req.Ref})
	default:
		im, err = b.S.BuildImage(ctx, service.ImageBuildRequest{Name: req.Name, From: req.From, Packages: req.Packages})
	}
	if err != nil {
		return nil, err
	}
	return WireImage(im), nil
}

func (b ServiceBackend) InspectImage(ctx context.Context, name string) (*wire.Image, error) {
	im, err := b.S.InspectImage(ctx, name)
	if err != nil {
		return nil, err
	}
	return WireImage(im), nil
}

func (b ServiceBackend) RemoveImage(ctx context.Context, name string) error {
	return b.S.RemoveImage(context.WithoutCancel(ctx), name)
}

func (b ServiceBackend) List(ctx context.Context) ([]wire.Sandbox, error) {
	list, err := b.S.List(ctx)
	var out []wire.Sandbox
	for i := range list {
		out = append(out, *b.WireSandbox(&list[i]))
	}
	return out, err
}

func (b ServiceBackend) Inspect(ctx context.Context, name string) (*wire.Sandbox, error) {
	in, err := b.S.Inspect(ctx, name)
	if err != nil {
		return nil, err
	}
	n, _ := audit.CountRefusals(audit.Dir(b.S.State().Logs(), name), in.Spec.LogIdentity())
	w := b.wireInfo(*in, int64(service.Uptime(*in)/time.Second), n, true)
	w.CPUSeconds, w.RSSBytes = service.HostUsage(*in)
	return w, nil
}

func (b ServiceBackend) get(ctx context.Context, name string) (*wire.Sandbox, error) {
	sb, err := b.Inspect(ctx, name)
	if sb != nil {
		sb.QEMUArgs = nil
	}
	return sb, err
}

func (b ServiceBackend) Create(ctx context.Context, req wire.CreateRequest) (*wire.Sandbox, error) {
	sb, err := b.S.Create(ctx, service.CreateRequest{Name: req.Name, Image: req.Image, Profile: req.Profile, CPUs: req.CPUs,
		Memory: req.Memory, Disk: req.Disk, Accel: req.Accel, Env: req.Env, Mounts: req.Mounts, Caches: req.Caches,
		Ports: req.Ports, PublishExternal: req.PublishExternal, Timeout: req.Timeout, IdleStop: req.IdleStop})
	if err != nil {
		return nil, err
	}
	if req.Start {
		return b.Start(ctx, sb.Spec.Name, req.Cold)
	}
	return b.WireSandbox(sb), nil
}

// Start, Stop, Remove, Suspend, Snapshot and Fork outlive the request:
// a client that goes away mid-boot or mid-save does not undo what it
// asked for.
func (b ServiceBackend) Start(ctx context.Context, name string, cold bool) (*wire.Sandbox, error) {
	sb, err := b.S.Start(context.WithoutCancel(ctx), service.StartRequest{Name: name, Cold: cold})
	if err != nil {
		return nil, err
	}
	return b.WireSandbox(sb), nil
}

func (b ServiceBackend) Stop(ctx context.Context, name string, timeout time.Duration) (*wire.Sandbox, error) {
	sb, err := b.S.Stop(context.WithoutCancel(ctx), service.StopRequest{Name: name, Timeout: timeout})
	if err != nil {
		return nil, err
	}
	return b.WireSandbox(sb), nil
}

func (b ServiceBackend) Remove(ctx context.Context, name string, force bool) error {
	return b.S.Remove(context.WithoutCancel(ctx), service.RemoveRequest{Name: name, Force: force})
}

func (b ServiceBackend) Pause(ctx context.Context, name string) (*wire.Sandbox, error) {
	if _, err := b.S.Pause(ctx, name); err != nil {
		return nil, err
	}
	return b.get(ctx, name)
}

func (b ServiceBackend) Resume(ctx context.Context, name string) (*wire.Sandbox, error) {
	if _, err := b.S.Resume(context.WithoutCancel(ctx), name); err != nil {
		return nil, err
	}
	return b.get(ctx, name)
}

func (b ServiceBackend) Suspend(ctx context.Context, name string) (*wire.Sandbox, error) {
	if _, err := b.S.Suspend(context.WithoutCancel(ctx), name, nil); err != nil {
		return nil, err
	}
	return b.get(ctx, name)
}

func (b ServiceBackend) Exec(ctx context.Context, name string, req wire.ExecRequest, sio ExecIO) (ExitStatus, error) {
	sreq := service.ExecRequest{Name: name, Args: req.Args, Env: req.Env, Dir: req.Dir, User: req.User, TTY: req.TTY}
	if req.TTY && req.Rows > 0 && req.Cols > 0 {
		sreq.Size = &service.WindowSize{Rows: req.Rows, Cols: req.Cols}
	}
	cio := service.ExecIO{Stdin: sio.Stdin, Stdout: sio.Stdout, Stderr: sio.Stderr, Signal: sio.Signal, Started: sio.Started}
	if sio.Resize != nil {
		resize := make(chan service.WindowSize, 1)
		cio.Resize = resize
		done := make(chan struct{})
		defer close(done)
		go func() {
			for {
				select {
				case sz := <-sio.Resize:
					select {
					case resize <- service.WindowSize{Rows: sz.Rows, Cols: sz.Cols}:
					case <-done:
						return
					}
				case <-done:
					return
				}
			}
		}()
	}
	st, err := b.S.Exec(ctx, sreq, cio)
	if code, ok := service.CommandExitCode(err); ok {
		return ExitStatus{}, &StartError{ExitCode: code, Message: err.Error()}
	}
	if err != nil {
		return ExitStatus{}, err
	}
	return ExitStatus{Code: st.Code, Signal: st.Signal}, nil
}

func (b ServiceBackend) CopyIn(ctx context.Context, name, dir string, tar io.Reader) (int64, error) {
	return b.S.CopyIn(ctx, name, dir, tar)
}

func (b ServiceBackend) CopyFromGuest(ctx context.Context, name, src, dst string) (int64, error) {
	return b.S.CopyFromGuest(ctx, name, src, dst, tarfs.Limits{})
}

func (b ServiceBackend) CopyOut(ctx context.Context, name, path string, w io.Writer) error {
	return b.S.CopyOut(ctx, name, path, w)
}

// WireSnapshot is a snapshot in its wire form.
func WireSnapshot(sn *snapshot.Snapshot) *wire.Snapshot {
	return &wire.Snapshot{InitramfsHash: sn.InitramfsHash, Accel: sn.Accel, Machine: sn.Machine, CPU: sn.CPU, CPUFlags: sn.CPUFlags, Template: sn.Template,
		Env: sn.Env, Mounts: sn.Mounts, Ports: sn.Ports, Timeout: sn.Timeout, IdleStop: sn.IdleStop, SharedRAMBytes: sn.SharedRAMBytes, Name: sn.Name, Source: sn.Source, Parent: sn.Parent, Created: sn.Created,
		Image: sn.Image, ImageDigest: sn.ImageDigest, Profile: sn.Profile, ProfileHash: sn.ProfileHash,
		CPUs: sn.CPUs, MemoryMiB: sn.MemoryMiB, DiskBytes: sn.DiskBytes, Kernel: sn.Kernel, QEMUVersion: sn.QEMUVersion,
		MemoryStateBytes: sn.MemoryStateBytes, DiskFileBytes: sn.DiskFileBytes, MemoryDigest: sn.MemoryDigest,
		DiskDigest: sn.DiskDigest, SaveMS: sn.SaveMS}
}

func (b ServiceBackend) Snapshot(ctx context.Context, name string, req wire.SnapshotRequest) (*wire.Snapshot, error) {
	sn, err := b.S.CreateSnapshot(context.WithoutCancel(ctx), service.SnapshotRequest{Sandbox: name, Name: req.Name, Stop: req.Stop})
	if err != nil {
		return nil, err
	}
	return WireSnapshot(sn), nil
}

func (b ServiceBackend) Snapshots(ctx context.Context) ([]wire.Snapshot, error) {
	list, err := b.S.ListSnapshots(ctx)
	var out []wire.Snapshot
	for i := range list {
		out = append(out, *WireSnapshot(&list[i]))
	}
	return out, err
}

func (b ServiceBackend) GetSnapshot(ctx context.Context, name string, verify bool) (*wire.Snapshot, error) {
	sn, err := b.S.InspectSnapshot(ctx, name, verify)
	if err != nil {
		return nil, err
	}
	w := WireSnapshot(sn)
	w.Verified = verify
	return w, nil
}

func (b ServiceBackend) RemoveSnapshot(ctx context.Context, name string) error {
	_, err := b.S.RemoveSnapshots(ctx, []string{name})
	return err
}

func (b ServiceBackend) Fork(ctx context.Context, snap string, req wire.ForkRequest) (*wire.Sandbox, error) {
	if req.Name == "" {
		return nil, fmt.Errorf("a fork needs a name for the new sandbox: %w", errdefs.ErrInvalid)
	}
	sb, err := b.S.Restore(context.WithoutCancel(ctx), service.RestoreRequest{Snapshot: snap, Name: req.Name, Profile: req.Profile,
		Ports: req.Ports, KeepPorts: req.KeepPorts, PublishExternal: req.PublishExternal, Timeout: req.Timeout, IdleStop: req.IdleStop})
	if err != nil {
		return nil, err
	}
	return b.WireSandbox(sb), nil
}

func (b ServiceBackend) Profiles(ctx context.Context) ([]wire.Profile, error) {
	list, err := b.S.ListProfiles(ctx)
	var out []wire.Profile
	for _, p := range list {
		out = append(out, wire.Profile{Name: p.Name, Source: p.Source, Hash: p.Hash, NetworkMode: p.Mode, Error: p.Error})
	}
	return out, err
}

func (b ServiceBackend) ShowProfile(ctx context.Context, ref string) (*wire.Profile, error) {
	p, err := b.S.ShowProfile(ctx, ref)
	if err != nil {
		return nil, err
	}
	return &wire.Profile{Name: p.Name, Source: p.Source, Hash: p.Hash, YAML: p.YAML}, nil
}

// CheckProfile validates YAML sent over the API, with the problems and
// warnings `smx profile check` prints.
func (b ServiceBackend) CheckProfile(ctx context.Context, req wire.CheckRequest) (*wire.CheckResult, error) {
	file := req.File
	if file == "" {
		file = "profile.yaml"
	}
	c := service.CheckProfileYAML(file, []byte(req.YAML))
	return &wire.CheckResult{OK: c.OK, Hash: c.Hash, Problems: c.Problems, Warnings: c.Warnings}, nil
}

func (b ServiceBackend) Explain(ctx context.Context, ref, request string) (*wire.Explanation, error) {
	ex, err := b.S.ExplainProfile(ctx, service.ExplainRequest{Profile: ref, Request: request})
	if err != nil {
		return nil, err
	}
	return b.WireExplanation(ex), nil
}

// WireExplanation is a profile's decision in its wire form.
func (b ServiceBackend) WireExplanation(ex *service.Explanation) *wire.Explanation {
	return &wire.Explanation{Profile: ex.Profile, Request: ex.Request, Allow: ex.Allow, Ask: ex.Ask, Rule: ex.Rule, Reason: ex.Reason, Details: ex.Details}
}

func (b ServiceBackend) SandboxProfile(ctx context.Context, name string) (*wire.Profile, error) {
	p, err := b.S.SandboxProfile(ctx, name)
	if err != nil {
		return nil, err
	}
	return &wire.Profile{Name: p.Name, Source: p.Source, Hash: p.Hash, YAML: p.YAML}, nil
}

func (b ServiceBackend) ExplainSandbox(ctx context.Context, name, request string) (*wire.Explanation, error) {
	ex, err := b.S.ExplainProfile(ctx, service.ExplainRequest{Sandbox: name, Request: request})
	if err != nil {
		return nil, err
	}
	return &wire.Explanation{Profile: ex.Profile, Request: ex.Request, Allow: ex.Allow, Rule: ex.Rule, Reason: ex.Reason}, nil
}

func (b ServiceBackend) SetPolicy(ctx context.Context, name, ref string) (*wire.PolicyResult, error) {
	r, err := b.S.SetPolicy(context.WithoutCancel(ctx), service.PolicyRequest{Name: name, Profile: ref})
	if err != nil {
		return nil, err
	}
	return &wire.PolicyResult{Sandbox: r.Name, Profile: r.Profile, Hash: r.Hash, Applied: r.Applied, ClosedFlows: r.ClosedFlows}, nil
}

func (b ServiceBackend) Logs(ctx context.Context, name string, q LogQuery, fn func(wire.Record) error) error {
	if err := sandbox.ValidName(name); err != nil {
		return err
	}
	f := audit.Filter{Refusals: q.Refusals, Since: q.Since}
	next := int64(0)
	err := b.S.Logs(ctx, service.LogsRequest{Name: name, Filter: f}, func(r audit.Record) error {
		next = r.Seq + 1
		return fn(WireRecord(r))
	})
	if err != nil || !q.Follow {
		return err
	}
	if q.Ready != nil {
		q.Ready()
	}
	f.From = next
	return b.S.Logs(ctx, service.LogsRequest{Name: name, Filter: f, Follow: true}, func(r audit.Record) error { return fn(WireRecord(r)) })
}

func (b ServiceBackend) VerifyLog(ctx context.Context, name string) (*wire.VerifyReport, error) {
	if err := sandbox.ValidName(name); err != nil {
		return nil, err
	}
	res, err := b.S.VerifyLog(ctx, service.VerifyRequest{Name: name})
	if err != nil {
		return nil, err
	}
	return WireVerifyReport(name, res), nil
}

// WireVerifyReport is sandbox name's log verification in its wire form;
// a warning (the key the log was checked with) comes first in its notes.
func WireVerifyReport(name string, res *service.VerifyResult) *wire.VerifyReport {
	rep := res.Report
	notes := rep.Notes
	if res.Warning != "" {
		notes = append([]string{res.Warning}, notes...)
	}
	return &wire.VerifyReport{Sandbox: name, LogID: rep.LogID, OK: rep.OK(), Records: rep.Records,
		Checkpoints: rep.Checkpoints, Closed: rep.Closed, Uncovered: rep.Uncovered, FirstBad: rep.FirstBad,
		Problems: rep.Problems, Notes: notes, Summary: rep.String(), Key: res.Key}
}

func (b ServiceBackend) Events(ctx context.Context, q EventQuery, fn func(wire.Event) error) error {
	return WatchEvents(ctx, b.S.State(), q, fn)
}

func (b ServiceBackend) wireAgent(a *service.Agent) *wire.Agent {
	r := a.Agent
	return &wire.Agent{Sandbox: *b.WireSandbox(&a.Sandbox), Preset: r.Preset, Workspace: r.Workspace, User: r.User,
		Workdir: r.Workdir, Command: r.Command, Remove: r.Remove, ExitCode: r.ExitCode, Exited: r.Exited}
}

func (b ServiceBackend) RunAgent(ctx context.Context, req wire.AgentRequest, progress func(wire.AgentEvent)) (*wire.Agent, error) {
	if req.Workspace != "" && !filepath.IsAbs(req.Workspace) {
		return nil, fmt.Errorf("workspace %q: give an absolute path on the server's host: %w", req.Workspace, errdefs.ErrInvalid)
	}
	a, err := b.S.RunAgent(ctx, service.AgentRequest{Preset: req.Preset, Workspace: req.Workspace, Args: req.Args,
		Name: req.Name, Profile: req.Profile, CPUs: req.CPUs, Memory: req.Memory, Disk: req.Disk, Accel: req.Accel,
		Mounts: req.Mounts, Caches: req.Caches, Ports: req.Ports, PublishExternal: req.PublishExternal, Timeout: req.Timeout, IdleStop: req.IdleStop,
		Cold: req.Cold, Term: req.Term, Remove: req.Remove, ImportConfig: req.ImportConfig, Docker: req.Docker},
		func(p service.AgentProgress) {
			if progress != nil {
				progress(wire.AgentEvent{Type: "progress", Stage: p.Stage, Message: p.Message})
			}
		})
	if err != nil {
		return nil, err
	}
	return b.wireAgent(a), nil
}

func (b ServiceBackend) Agent(ctx context.Context, name string) (*wire.Agent, error) {
	a, err := b.S.Agent(ctx, name)
	if err != nil {
		return nil, err
	}
	return b.wireAgent(a), nil
}

func (b ServiceBackend) Ports(ctx context.Context, name string) (*wire.PortList, error) {
	return WirePorts(b.S.Ports(ctx, name))
}

func (b ServiceBackend) AddPort(ctx context.Context, name string, req wire.PortRequest) (*wire.PortList, error) {
	return WirePorts(b.S.AddPort(context.WithoutCancel(ctx), service.PortRequest{Name: name, Port: req.Port, PublishExternal: req.PublishExternal}))
}

func (b ServiceBackend) RemovePort(ctx context.Context, name, port string) (*wire.PortList, error) {
	return WirePorts(b.S.RemovePort(context.WithoutCancel(ctx), service.PortRequest{Name: name, Port: port}))
}

func (b ServiceBackend) AddMount(ctx context.Context, name string, req wire.MountRequest) (*wire.MountList, error) {
	return WireMounts(b.S.AddMount(context.WithoutCancel(ctx), service.MountRequest{Name: name, Mount: req.Mount}))
}

func (b ServiceBackend) RemoveMount(ctx context.Context, name, guest string) (*wire.MountList, error) {
	return WireMounts(b.S.RemoveMount(context.WithoutCancel(ctx), service.MountRequest{Name: name, Guest: guest}))
}

// WireMounts is a sandbox's mounts in their wire form (or err).
func WireMounts(l *service.MountList, err error) (*wire.MountList, error) {
	if err != nil {
		return nil, err
	}
	return &wire.MountList{Sandbox: l.Name, Mounts: append([]string{}, l.Mounts...)}, nil
}

// WirePorts is a sandbox's published ports in their wire form (or err).
func WirePorts(l *service.PortList, err error) (*wire.PortList, error) {
	if err != nil {
		return nil, err
	}
	out := &wire.PortList{Sandbox: l.Name, Running: l.Running, Ports: []wire.PortBinding{}}
	for _, p := range l.Ports {
		out.Ports = append(out.Ports, wire.PortBinding{HostIP: p.HostIP.String(), HostPort: int(p.HostPort),
			GuestPort: int(p.GuestPort), Bound: int(p.Bound), External: p.External})
	}
	return out, nil
}

func wireApproval(a approval.Approval) wire.Approval {
	return wire.Approval{ID: a.ID, Sandbox: a.Sandbox, Channel: a.Channel, What: a.What, Rule: a.Rule, Source: a.Source,
		Created: a.Created, Expires: a.Expires, State: a.State, Decision: a.Decision, By: a.By,
		RuleWritten: a.RuleWritten, ProfileFile: a.ProfileFile}
}

func (b ServiceBackend) Approvals(ctx context.Context, sandbox string) ([]wire.Approval, error) {
	list, err := b.S.ListApprovals(ctx, sandbox)
	if err != nil {
		return nil, err
	}
	out := make([]wire.Approval, 0, len(list))
	for _, a := range list {
		out = append(out, wireApproval(a))
	}
	return out, nil
}

func (b ServiceBackend) Answer(ctx context.Context, id, decision, by string) (*wire.Approval, error) {
	a, err := b.S.AnswerApproval(ctx, service.AnswerRequest{ID: id, Decision: decision, By: by})
	if err != nil {
		return nil, err
	}
	w := wireApproval(*a)
	return &w, nil
}
func wireCredential(c service.Credential) wire.Credential {
	return wire.Credential{Name: c.Name, Bytes: c.Bytes, SHA256Prefix: c.SHA256, Updated: c.Updated, Presets: c.Presets, SignIn: c.SignIn}
}

func (b ServiceBackend) Credentials(ctx context.Context) ([]wire.Credential, error) {
	list, err := b.S.ListCredentials(ctx)
	out := []wire.Credential{}
	for _, c := range list {
		out = append(out, wireCredential(c))
	}
	return out, err
}

func (b ServiceBackend) SetCredential(ctx context.Context, name string, value []byte) (*wire.Credential, error) {
	c, err := b.S.SetCredential(ctx, name, value)
	if err != nil {
		return nil, err
	}
	w := wireCredential(*c)
	return &w, nil
}

func (b ServiceBackend) RemoveCredential(ctx context.Context, name string) error {
	return b.S.RemoveCredential(ctx, name)
}

func (b ServiceBackend) Login(ctx context.Context, req wire.LoginRequest) (*wire.LoginResult, error) {
	var r *service.LoginResult
	var err error
	switch {
	case req.Import && req.Key != "":
		return nil, fmt.Errorf("give either key or import, not both: %w", errdefs.ErrInvalid)
	case req.Import:
		r, err = b.S.ImportSignIn(ctx, req.Preset, req.File)
	case req.File != "":
		return nil, fmt.Errorf("file applies to import only: %w", errdefs.ErrInvalid)
	default:
		r, err = b.S.SetPresetKey(ctx, req.Preset, []byte(req.Key))
	}
	if err != nil {
		return nil, err
	}
	return &wire.LoginResult{Preset: r.Preset, Secret: r.Secret, Bytes: r.Bytes, Header: r.Header, File: r.File, What: r.What, Expires: r.Expires}, nil
}

func wireSSHCA(ca *service.SSHCA, err error) (*wire.SSHCA, error) {
	if err != nil {
		return nil, err
	}
	return &wire.SSHCA{PublicKey: ca.PublicKey, Fingerprint: ca.Fingerprint, TrustedUserCAKeys: ca.TrustedUserCAKeys,
		AuthorizedKeys: ca.AuthorizedKeys, Replaced: ca.Replaced}, nil
}

func (b ServiceBackend) SSHUserCA(ctx context.Context) (*wire.SSHCA, error) {
	return wireSSHCA(b.S.SSHUserCA(ctx))
}

func (b ServiceBackend) RotateSSHUserCA(ctx context.Context) (*wire.SSHCA, error) {
	return wireSSHCA(b.S.RotateSSHUserCA(context.WithoutCancel(ctx)))
}

// WireKernel is a cached kernel in its wire form.
func WireKernel(k service.KernelInfo) wire.Kernel {
	return wire.Kernel{Version: k.Version, Default: k.Default, Own: k.Own, Sandboxes: k.Sandboxes, Snapshots: k.Snapshots}
}

func (b ServiceBackend) Kernels(ctx context.Context) ([]wire.Kernel, error) {
	rows, err := b.S.ListKernels(ctx)
	out := []wire.Kernel{}
	for _, k := range rows {
		out = append(out, WireKernel(k))
	}
	return out, err
}

func (b ServiceBackend) BuildKernel(ctx context.Context, req wire.KernelBuildRequest) (*wire.Kernel, error) {
	k, err := b.S.BuildKernel(ctx, service.KernelBuildRequest{Jobs: req.Jobs, Nice: req.Nice, WorkDir: req.WorkDir})
	if err != nil {
		return nil, err
	}
	w := WireKernel(*k)
	return &w, nil
}

func (b ServiceBackend) RemoveKernel(ctx context.Context, version string) error {
	return b.S.RemoveKernel(context.WithoutCancel(ctx), version)
}

// WireDoctor is a host check in its wire form.
func WireDoctor(r *service.DoctorReport) *wire.DoctorReport {
	out := &wire.DoctorReport{Requirements: []wire.Requirement{}, Accel: r.Accel, AccelReason: r.AccelReason,
		StateDir: r.StateDir, DiskFree: r.DiskFree, OK: r.OK}
	for _, q := range r.Requirements {
		out.Requirements = append(out.Requirements, wire.Requirement{Name: q.Name, Found: q.Found, Detail: q.Detail, Fix: q.Fix, Optional: q.Optional})
	}
	return out
}

func (b ServiceBackend) Doctor(ctx context.Context) (*wire.DoctorReport, error) {
	return WireDoctor(b.S.Doctor(ctx)), nil
}

func (b ServiceBackend) Templates(ctx context.Context) ([]wire.Snapshot, error) {
	list, err := b.S.ListTemplates(ctx)
	out := []wire.Snapshot{}
	for i := range list {
		out = append(out, *WireSnapshot(&list[i]))
	}
	return out, err
}

func (b ServiceBackend) RemoveTemplate(ctx context.Context, name string) error {
	return b.S.RemoveTemplate(context.WithoutCancel(ctx), name)
}

// The pushes and pulls run to their end once asked (a registry transfer
// cut half way leaves nothing, but costs the whole transfer again).
func (b ServiceBackend) PushTemplate(ctx context.Context, name string, req wire.PushRequest) (*wire.PushResult, error) {
	r, err := b.S.PushTemplate(context.WithoutCancel(ctx), service.PushTemplateRequest{Template: name, Ref: req.Ref, Compress: req.Compress, WithKernel: req.WithKernel})
	return wirePush(r), err
}

func (b ServiceBackend) PushSnapshot(ctx context.Context, name string, req wire.PushRequest) (*wire.PushResult, error) {
	r, err := b.S.PushSnapshot(context.WithoutCancel(ctx), service.PushSnapshotRequest{Snapshot: name, Ref: req.Ref, Compress: req.Compress, WithKernel: req.WithKernel})
	return wirePush(r), err
}

func (b ServiceBackend) PullTemplate(ctx context.Context, req wire.PullRequest) (*wire.PullResult, error) {
	r, err := b.S.PullTemplate(context.WithoutCancel(ctx), service.PullTemplateRequest{Ref: req.Ref, Name: req.Name, Keys: req.Keys})
	return wirePull(r), err
}

func (b ServiceBackend) PullSnapshot(ctx context.Context, req wire.PullRequest) (*wire.PullResult, error) {
	r, err := b.S.PullSnapshot(context.WithoutCancel(ctx), service.PullSnapshotRequest{Ref: req.Ref, Name: req.Name, Keys: req.Keys})
	return wirePull(r), err
}

func wirePush(r *ocisnap.PushResult) *wire.PushResult {
	if r == nil {
		return nil
	}
	out := &wire.PushResult{Kind: r.Kind, Snapshot: r.Snapshot, Ref: r.Ref, Digest: r.Digest, Signer: r.Signer, Layers: []wire.PushedLayer{},
		BytesTotal: r.BytesTotal, BytesSent: r.BytesSent, MemoryBytes: r.MemoryBytes, MemoryStored: r.MemoryStored,
		CompressMS: r.CompressMS, DurationMS: r.DurationMS}
	for _, l := range r.Layers {
		out.Layers = append(out.Layers, wire.PushedLayer{Role: l.Role, MediaType: l.MediaType, Digest: l.Digest, Size: l.Size,
			DiffID: l.DiffID, DiffSize: l.DiffSize, Sent: l.Sent})
	}
	return out
}

func wirePull(r *ocisnap.PullResult) *wire.PullResult {
	if r == nil {
		return nil
	}
	return &wire.PullResult{Kind: r.Kind, Snapshot: r.Snapshot, Ref: r.Ref, Digest: r.Digest, Signer: r.Signer, Bytes: r.Bytes,
		DurationMS: r.DurationMS, Present: r.Present, Image: r.Image, ImageDigest: r.ImageDigest, ImageOnHost: r.ImageOnHost}
}

func (b ServiceBackend) LogNames(ctx context.Context) ([]string, error) {
	l, err := b.S.ListLogs(ctx)
	if l == nil {
		l = []string{}
	}
	return l, err
}

// PruneLogs answers the logs pruned, or, when one could not be, the
// error (those before it are pruned all the same).
func (b ServiceBackend) PruneLogs(ctx context.Context, req wire.LogPruneRequest) (*wire.LogPruneResult, error) {
	done, err := b.S.PruneLogs(context.WithoutCancel(ctx), req.Names, req.All)
	if err != nil {
		return nil, err
	}
	if done == nil {
		done = []string{}
	}
	return &wire.LogPruneResult{Pruned: done}, nil
}
