package gitgw

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"sync"

	"github.com/smx-dev/smx/internal/audit"
	"github.com/smx-dev/smx/internal/policy"
)

// settle applies the one rule that is about the protocol, not the
// profile: a ref can be refused alone only when the client asked for
// report-status; otherwise one refusal refuses the whole push. It returns
// the commands to send upstream and how many were refused.
func settle(req *PushRequest, ds []RefDecision) (allowed []Command, refused int) {
	for _, d := range ds {
		if d.Allow {
			allowed = append(allowed, d.Command)
		} else {
			refused++
		}
	}
	if refused > 0 && !req.Has("report-status") && !req.Has("report-status-v2") {
		for i := range ds {
			if ds[i].Allow {
				ds[i].Allow, ds[i].Rule, ds[i].Reason = false, RuleNoReport, "smx: the client asked for no report-status, so no ref can be refused alone"
			}
		}
		return nil, len(ds)
	}
	return allowed, refused
}

// mergeReport is the report the client gets: the gateway's refusals and
// upstream's word on the rest. upErr (no report from upstream) turns every
// allowed command into a refusal.
func mergeReport(ds []RefDecision, rep Report, upErr error) (Report, map[string]RefStatus) {
	if upErr != nil {
		rep = Report{Unpack: "ok"}
		for i := range ds {
			if ds[i].Allow {
				ds[i].Allow = false
				ds[i].Reason = "smx: the forge did not confirm the update: " + oneLine(upErr.Error())
				ds[i].Rule = "gitgw: upstream error"
			}
		}
	}
	final := Report{Unpack: rep.Unpack}
	byRef := map[string]RefStatus{}
	for _, st := range rep.Refs {
		byRef[st.Ref] = st
	}
	for _, d := range ds {
		if !d.Allow {
			final.Refs = append(final.Refs, RefStatus{Ref: d.Ref, Reason: d.Reason})
			continue
		}
		st, ok := byRef[d.Ref]
		if !ok {
			st = RefStatus{Ref: d.Ref, Reason: "smx: the forge did not report this ref"}
		}
		final.Refs = append(final.Refs, st)
	}
	return final, byRef
}

// logPush writes the git.push record of a decided push and a git.refused
// record for every refused ref.
func logPush(log func(string, map[string]any), fields map[string]any, repo string, req *PushRequest, ds []RefDecision, byRef map[string]RefStatus, packBytes int64, status int, cred string, refused int) {
	fields["op"], fields["pack_bytes"] = "push", packBytes
	if status != 0 {
		fields["status"] = status
	}
	if req.Has("atomic") {
		fields["atomic"] = true
	}
	if len(req.Options) > 0 {
		fields["push_options"] = req.Options
	}
	fields["refs"] = refFields(ds, byRef)
	if refused == len(ds) {
		fields["rule"] = ds[0].Rule
	} else {
		delete(fields, "rule")
	}
	log(audit.KindGitPush, fields)
	for _, d := range ds {
		if d.Allow {
			continue
		}
		f := map[string]any{"repo": repo, "op": "push", "ref": d.Ref, "old": d.Old, "new": d.New, "access": d.Access,
			"rule": d.Rule, "reason": d.Reason}
		if d.Access == "push-option" {
			f["push_options"] = req.Options
		}
		if cred != "" {
			f["credential"] = cred
		}
		for _, k := range []string{"transport", "host", "user"} {
			if v, ok := fields[k]; ok {
				f[k] = v
			}
		}
		log(audit.KindGitRefused, f)
	}
}

// StreamPush runs one receive-pack session carried over a byte stream, as
// Git over SSH carries it (an exec channel running git-receive-pack on
// the forge), through the same decisions as a push over HTTPS: the
// forge's advertisement goes to the client as it is, the client's
// commands are decided by DecidePush (fast-forward on the host-side
// mirror), only the allowed ones (and the pack) go upstream, and the
// client gets the merged report-status with "ng REF smx: ..." lines.
type StreamPush struct {
	Profile *policy.Profile
	Repo    string   // the normalised identity (policy.NormalizeRepo)
	Mirrors *Mirrors // nil: fast-forward cannot be checked, such updates are refused
	Fetch   Fetcher  // updates the mirror over the same transport
	Log     func(kind string, fields map[string]any)
	// Fields go into every record (e.g. transport, host, user, credential).
	Fields map[string]any
	// Ask puts ref updates a rule says ask about to the host user; nil
	// refuses them.
	Ask AskFunc
}

// Run serves the session: client reads what the guest sends and
// clientOut writes to it; upIn and upOut are the forge's receive-pack's
// standard input and output. Run closes upIn when it is done sending.
func (sp *StreamPush) Run(ctx context.Context, client io.Reader, clientOut io.Writer, upIn io.WriteCloser, upOut io.Reader) error {
	defer upIn.Close()
	// The advertisement: pkt-lines up to the first flush, as they are.
	pr := &PktReader{R: upOut}
	for {
		t, line, err := pr.ReadPkt()
		if err != nil {
			if err == io.EOF {
				return nil // the forge ended the session (no such repository, ...)
			}
			return err
		}
		var b []byte
		switch t {
		case PktData:
			b = AppendPkt(nil, line)
		case PktFlush:
			b = Flush
		case PktDelim:
			b = []byte("0001")
		case PktEnd:
			b = []byte("0002")
		}
		if _, err := clientOut.Write(b); err != nil {
			return err
		}
		if t == PktFlush {
			break
		}
		if t == PktData && bytes.HasPrefix(line, []byte("ERR ")) {
			_, err := io.Copy(clientOut, upOut)
			return err
		}
	}
	cr := bufio.NewReaderSize(client, 64<<10)
	if b, err := cr.Peek(4); err != nil || string(b) == "0000" {
		// Nothing to push ("Everything up-to-date"): the client sends a
		// flush, or hangs up.
		if err == nil {
			cr.Discard(4)
			upIn.Write(Flush)
		}
		upIn.Close()
		_, err := io.Copy(clientOut, upOut)
		return err
	}
	fields := map[string]any{"repo": sp.Repo, "service": "git-receive-pack"}
	for k, v := range sp.Fields {
		fields[k] = v
	}
	cred, _ := sp.Fields["credential"].(string)
	req, err := ParsePushRequest(cr)
	if err != nil {
		fields["op"], fields["rule"], fields["reason"] = "push", RuleMalformed, err.Error()
		sp.Log(audit.KindGitRefused, fields)
		return fmt.Errorf("smx: refused: %v", err)
	}
	var spool *os.File
	var packBytes int64
	if hasUpdate(req.Commands) {
		dir := ""
		if sp.Mirrors != nil && os.MkdirAll(sp.Mirrors.Dir, 0o700) == nil {
			dir = sp.Mirrors.Dir
		}
		spool, err = os.CreateTemp(dir, ".push-*.pack")
		if err != nil {
			return fmt.Errorf("smx: gateway: %v", err)
		}
		defer os.Remove(spool.Name())
		defer spool.Close()
		// The client closes its side after the pack (pack-objects owned it).
		packBytes, err = io.Copy(spool, io.LimitReader(cr, maxPack+1))
		if err != nil {
			return fmt.Errorf("smx: reading the pack: %v", err)
		}
		if packBytes > maxPack {
			fields["op"], fields["rule"], fields["reason"] = "push", RuleMalformed, "pack over 2 GiB"
			sp.Log(audit.KindGitRefused, fields)
			return errors.New("smx: refused: the pushed pack is over 2 GiB")
		}
	}
	var quarantine *Quarantine
	decisions := DecideAndAsk(ctx, sp.Profile, sp.Repo, req, func(ctx context.Context) (Ancestry, error) {
		if sp.Mirrors == nil || sp.Fetch == nil {
			return nil, errors.New("the gateway keeps no mirror")
		}
		var pack io.Reader
		if packBytes > 0 {
			pack = io.NewSectionReader(spool, 0, packBytes)
		}
		q, err := sp.Mirrors.Open(ctx, sp.Repo, sp.Fetch, pack)
		quarantine = q
		return q, err
	}, sp.Ask)
	if quarantine != nil {
		quarantine.Close()
	}
	sideband := req.Has("side-band-64k")
	allowed, refused := settle(req, decisions)
	var rep Report
	var upErr error
	if len(allowed) == 0 {
		rep.Unpack = "ok"
		upIn.Write(Flush) // no commands: the forge's receive-pack ends
		upIn.Close()
	} else {
		var body io.Reader = bytes.NewReader(req.Encode(allowed))
		if hasUpdate(allowed) {
			body = io.MultiReader(body, io.NewSectionReader(spool, 0, packBytes))
		}
		errc := make(chan error, 1)
		go func() {
			_, err := io.Copy(upIn, body)
			upIn.Close()
			errc <- err
		}()
		if !req.Has("report-status") && !req.Has("report-status-v2") {
			// Everything was allowed and no report is wanted: the forge's
			// answer (progress only) goes to the client as it is.
			_, err := io.Copy(clientOut, upOut)
			<-errc
			sp.logRecords(fields, req, decisions, nil, packBytes, refused, cred)
			return err
		}
		var data []byte
		if sideband {
			data, upErr = Demux(upOut, func(b []byte) {
				clientOut.Write(Sideband(2, b))
			})
		} else {
			data, upErr = io.ReadAll(io.LimitReader(upOut, 64<<20))
		}
		if upErr == nil {
			rep, upErr = ParseReport(bytes.NewReader(data))
		}
		if err := <-errc; err != nil && upErr == nil {
			upErr = err
		}
	}
	final, byRef := mergeReport(decisions, rep, upErr)
	enc := final.Encode()
	if sideband {
		enc = append(Sideband(1, enc), Flush...)
	}
	_, werr := clientOut.Write(enc)
	sp.logRecords(fields, req, decisions, byRef, packBytes, refused, cred)
	io.Copy(io.Discard, upOut)
	return werr
}

func (sp *StreamPush) logRecords(fields map[string]any, req *PushRequest, ds []RefDecision, byRef map[string]RefStatus, packBytes int64, refused int, cred string) {
	logPush(sp.Log, fields, sp.Repo, req, ds, byRef, packBytes, 0, cred, refused)
}

// StreamFetcher is a Fetcher over a stream transport: open starts the
// forge's git-upload-pack for the repository (over SSH: an exec channel
// on the gateway's own upstream connection) and returns its standard
// input and output; done is called when the fetch is over. Host git
// fetches from it with protocol v0, its "ssh" command being two cats
// joined to the pipes the gateway copies to and from the stream.
func StreamFetcher(open func(ctx context.Context) (stdin io.WriteCloser, stdout io.Reader, done func(), err error)) Fetcher {
	return func(ctx context.Context, git, gitDir string) error {
		upIn, upOut, done, err := open(ctx)
		if err != nil {
			return err
		}
		defer done()
		toGitR, toGitW, err := os.Pipe()
		if err != nil {
			return err
		}
		fromGitR, fromGitW, err := os.Pipe()
		if err != nil {
			toGitR.Close()
			toGitW.Close()
			return err
		}
		var wg sync.WaitGroup
		wg.Add(2)
		go func() { defer wg.Done(); io.Copy(toGitW, upOut); toGitW.Close() }()
		go func() { defer wg.Done(); io.Copy(upIn, fromGitR); upIn.Close(); fromGitR.Close() }()
		var errb bytes.Buffer
		cmd := exec.CommandContext(ctx, git, "-c", "protocol.version=0", "-c", "ssh.variant=simple",
			"-c", "gc.auto=0", "-c", "maintenance.auto=false",
			"fetch", "--quiet", "--no-tags", "--force", "--no-write-fetch-head",
			"smx-upstream:repo", "+refs/heads/*:refs/heads/*", "+refs/tags/*:refs/tags/*")
		// fd 3 reads the forge's output, fd 4 writes its input; the
		// trailing # drops the host and command git appends.
		cmd.Env = append(gitEnv(), "GIT_DIR="+gitDir, "GIT_SSH_COMMAND=cat <&3 & exec cat >&4 #")
		cmd.ExtraFiles = []*os.File{toGitR, fromGitW}
		cmd.Stderr = &errb
		err = cmd.Run()
		toGitR.Close()
		fromGitW.Close()
		if err != nil {
			done() // ends the stream so the copies return
			wg.Wait()
			return fmt.Errorf("git fetch: %v: %s", err, lastLine(errb.String()))
		}
		wg.Wait()
		return nil
	}
}

// Mirrors returns the gateway's mirrors, for the SSH gateway to share (one
// lock per repository whichever transport pushes).
func (g *Gateway) Mirrors() *Mirrors { return g.cfg.Mirrors }

// fetchFields fills a git.fetch record from what the client asked for
// and the bytes it got.
func fetchFields(fields map[string]any, info fetchInfo, v2 bool, n int64) {
	fields["op"] = "fetch"
	if info.haves == 0 {
		fields["op"] = "clone"
	}
	fields["protocol"] = "v0"
	if v2 {
		fields["protocol"] = "v2"
	}
	fields["wants"], fields["haves"], fields["bytes"] = info.wants, info.haves, n
	if len(info.ids) > 0 {
		fields["want_ids"] = info.ids
	}
	if len(info.refs) > 0 {
		fields["refs"] = info.refs
	}
	if info.depth != "" {
		fields["depth"] = info.depth
	}
}

// FetchRecord fills fields for the git.fetch record of an upload-pack
// session carried over a stream (Git over SSH): head is the start of what
// the client sent (its wants and haves), n the bytes it got. It reports
// false when the client wanted no objects (ls-remote, already up to date),
// which is not logged as a fetch.
func FetchRecord(fields map[string]any, head []byte, n int64) bool {
	info := parseFetch(head, false)
	if info.wants == 0 {
		return false
	}
	fetchFields(fields, info, bytes.Contains(head, []byte("command=fetch")), n)
	return true
}
