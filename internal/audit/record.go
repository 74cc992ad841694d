package audit

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"

	"golang.org/x/mod/sumdb/tlog"
)

// Record kinds. Kinds name what happened, not who noticed; a kind ending in
// ".refused" is a policy refusal and always logged.
const (
	KindRunStart        = "run.start"
	KindRunEnd          = "run.end" // also triggers a checkpoint
	KindExecStart       = "exec.start"
	KindExecEnd         = "exec.end"
	KindNetRefused      = "net.refused"
	KindNetFlow         = "net.flow"       // allowed connections, summarised
	KindNetUnresolved   = "net.unresolved" // an allowed name the host could not resolve
	KindFileRefused     = "file.refused"
	KindFileWrite       = "file.write" // the first write-class operation the file gateway allowed on a guest path, per start: op, path, rule, mount (capped; then one with overflow)
	KindGitPush         = "git.push"
	KindGitRefused      = "git.refused"
	KindGitFetch        = "git.fetch" // a clone or fetch through the Git gateway: repo, wants, bytes, rule, credential name
	KindSSHRefused      = "ssh.refused"
	KindCredUse         = "cred.use"     // the secret's name and where it went, never its value
	KindCredRefresh     = "cred.refresh" // the host refreshed a sign-in: secret, expires_at, trigger, error; never a token
	KindCredUsage       = "cred.usage"   // what one brokered model request cost, as the answer said: credential, provider, model, tokens, and the running totals
	KindSnapshotCreate  = "snapshot.create"
	KindSnapshotRestore = "snapshot.restore"
	KindProfileChange   = "profile.change"
	KindSandboxCreate   = "sandbox.create"
	KindSandboxStart    = "sandbox.start"
	KindSandboxStop     = "sandbox.stop"
	KindSandboxCrash    = "sandbox.crash"
	KindSandboxTimeout  = "sandbox.timeout" // --timeout reached: limit, then the sandbox.stop
	KindSandboxIdle     = "sandbox.idle"    // --idle-stop reached: limit, idle_since, then the sandbox.stop
	KindSandboxBlocked  = "sandbox.blocked" // QEMU stopped the guest on a host I/O error (disk full)
	KindSandboxRemove   = "sandbox.remove"
	KindCopyRefused     = "copy.refused" // a copy out of the guest the host refused (internal/tarfs): path, rule, reason
	// What the host took into a read-only package cache from what the
	// guest wrote over it, when the sandbox stopped (internal/cache):
	// cache, promoted, bytes, present, refusals, refused (entries whose
	// bytes did not match their address), error.
	KindCachePromote = "cache.promote"
	// Questions put to the host user by a rule that says ask
	// (internal/approval): id, channel, what, rule, source; an answer adds
	// by (who, through which interface) and, when granted, scope.
	KindApprovalRequested = "approval.requested"
	KindApprovalGranted   = "approval.granted"
	KindApprovalDenied    = "approval.denied"  // refused: the user's deny, or over ask.max
	KindApprovalTimeout   = "approval.timeout" // refused: no answer within ask.timeout
	// Published ports (-p): each connection the supervisor accepted on a
	// host port and carried to the guest (peer, host, guest_port, error
	// when the guest did not answer), and each port published or
	// withdrawn while the sandbox ran.
	KindPortAccept    = "port.accept"
	KindPortPublish   = "port.publish"
	KindPortUnpublish = "port.unpublish"
	// Mounts added to and removed from a running sandbox (`smx agent
	// mount add|rm`): host, guest, ro, rule.
	KindMountAdd    = "mount.add"
	KindMountRemove = "mount.remove"

	// Written by the log itself.
	KindLogCreate = "log.create" // seq 0: fields log_id
	KindLogOpen   = "log.open"   // a writer reopened the log: fields clean (previous writer closed it), repaired_bytes
	KindLogClose  = "log.close"  // the writer closed the log; a checkpoint covering it follows
	// KindLogUnverified follows a log.open when the reopened log had
	// records no checkpoint covered (its writer stopped without closing
	// it): fields from, to (seqs, inclusive). The new writer keeps them but
	// cannot vouch for them, so its checkpoints cover them only as
	// "unverified"; Verify reports them as such.
	KindLogUnverified = "log.unverified"
)

// Record kinds of the SSH gateway (internal/sshgw), besides KindSSHRefused.
const (
	KindSSHSession = "ssh.session" // one SSH session channel, when it ends: host, user, command, bytes, exit status
	KindSSHForward = "ssh.forward" // one forwarded channel a rule allowed (-L/-R/-A/-X), when it ends
)

// Record kinds of the SSH server editors reach a sandbox through
// (`smx agent ssh-proxy`, internal/sshserve). They are inbound, so not
// the gateway's ssh.* kinds that `profile learn` turns into rules.
const (
	KindSSHLogin         = "ssh.login"          // an editor signed in: user, key (fingerprint), client; its commands follow as exec records
	KindSSHLoginRefused  = "ssh.login.refused"  // a key other than the sandbox's: user, client, rule, reason
	KindSSHTunnel        = "ssh.tunnel"         // a forward to a guest loopback port, when it ends: host, port, bytes_in, bytes_out (or error)
	KindSSHTunnelRefused = "ssh.tunnel.refused" // a forward to anything but the guest's loopback
)

// Record is one entry of the log, as stored.
type Record struct {
	Seq     int64          `json:"seq"`
	Time    time.Time      `json:"time"`
	Sandbox string         `json:"sandbox"`
	Kind    string         `json:"kind"`
	Fields  map[string]any `json:"fields"`
	Prev    tlog.Hash      `json:"-"` // hash of record Seq-1; zero for seq 0
	Hash    tlog.Hash      `json:"-"` // this record's hash, also its leaf in the Merkle tree
}

// Refusal reports whether r records something policy refused: its kind ends
// in ".refused" or it carries fields["refused"] == true.
func (r Record) Refusal() bool {
	if strings.HasSuffix(r.Kind, ".refused") {
		return true
	}
	b, _ := r.Fields["refused"].(bool)
	return b
}

// MarshalJSON writes the record as stored, hashes in base64.
func (r Record) MarshalJSON() ([]byte, error) {
	type plain Record
	return json.Marshal(struct {
		plain
		Prev string `json:"prev"`
		Hash string `json:"hash"`
	}{plain(r), b64(r.Prev), b64(r.Hash)})
}

// The stored line of a record is exactly
//
//	{"seq":N,"time":T,"sandbox":S,"kind":K,"fields":{...},"prev":"B64"  ,"hash":"B64"}\n
//	|<------------------------ body -------------------------------->|  |<- hashTail ->|
//
// and its hash is tlog.RecordHash(recordDomain + body + "}"): the hash covers
// the bytes on disk, so verification never depends on re-encoding a record
// the same way twice.
const (
	recordDomain = "smx-audit-record/v1\n"
	hashB64Len   = 44                                // base64 of 32 bytes
	hashTailLen  = len(`,"hash":"`) + hashB64Len + 2 // ...,"hash":"B64"}
	prevTailLen  = len(`,"prev":"`) + hashB64Len + 1 // ...,"prev":"B64"
)

func b64(h tlog.Hash) string { return base64.StdEncoding.EncodeToString(h[:]) }

// encodeRecord appends the stored line for r (without its hash known yet) to
// buf and returns the line with hash filled in. fields is the JSON object of
// r.Fields, already encoded by the caller.
func encodeRecord(buf []byte, r *Record, fields []byte, hb *[]byte) []byte {
	start := len(buf)
	buf = append(buf, `{"seq":`...)
	buf = strconv.AppendInt(buf, r.Seq, 10)
	buf = append(buf, `,"time":"`...)
	buf = r.Time.UTC().AppendFormat(buf, time.RFC3339Nano)
	buf = append(buf, `","sandbox":`...)
	buf = strconv.AppendQuote(buf, r.Sandbox) // names are validated ASCII, so this is JSON too
	buf = append(buf, `,"kind":`...)
	buf = strconv.AppendQuote(buf, r.Kind)
	buf = append(buf, `,"fields":`...)
	buf = append(buf, fields...)
	buf = append(buf, `,"prev":"`...)
	buf = base64.StdEncoding.AppendEncode(buf, r.Prev[:])
	buf = append(buf, '"')
	r.Hash = bodyHash(buf[start:], hb)
	buf = append(buf, `,"hash":"`...)
	buf = base64.StdEncoding.AppendEncode(buf, r.Hash[:])
	buf = append(buf, "\"}\n"...)
	return buf
}

// bodyHash is the record hash of a stored body (the line up to and including
// the prev field). hb is scratch space reused across calls.
func bodyHash(body []byte, hb *[]byte) tlog.Hash {
	b := append((*hb)[:0], recordDomain...)
	b = append(b, body...)
	b = append(b, '}')
	*hb = b
	return tlog.RecordHash(b)
}

// encodeFields returns the canonical JSON object for fields (keys sorted, as
// encoding/json does for maps). A nil map encodes as {}.
func encodeFields(fields map[string]any) ([]byte, error) {
	if len(fields) == 0 {
		return []byte("{}"), nil
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(fields); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n")), nil
}

// parsedLine is a stored line split into what verification needs.
type parsedLine struct {
	seq  int64
	prev tlog.Hash
	hash tlog.Hash // stored hash
	calc tlog.Hash // recomputed hash
	kind string
	err  string // why the line is malformed, "" if it is not
}

// storedLine is the JSON shape of a line; Fields stays raw until a reader
// wants it.
type storedLine struct {
	Seq     *int64          `json:"seq"`
	Time    time.Time       `json:"time"`
	Sandbox string          `json:"sandbox"`
	Kind    string          `json:"kind"`
	Fields  json.RawMessage `json:"fields"`
	Prev    string          `json:"prev"`
	Hash    string          `json:"hash"`
}

// checkLine parses and hashes one stored line (without its newline). It is
// the hot loop of Verify and of Open, so it reads the fixed layout directly
// and leaves full JSON decoding to readers.
func checkLine(line []byte, hb *[]byte) parsedLine {
	var p parsedLine
	n := len(line)
	if n < len(`{"seq":0`)+prevTailLen+hashTailLen || !bytes.HasPrefix(line, []byte(`{"seq":`)) ||
		!bytes.HasPrefix(line[n-hashTailLen:], []byte(`,"hash":"`)) || !bytes.HasSuffix(line, []byte(`"}`)) ||
		!bytes.HasPrefix(line[n-hashTailLen-prevTailLen:], []byte(`,"prev":"`)) {
		p.err = "malformed record"
		return p
	}
	if !json.Valid(line) {
		p.err = "malformed record: not JSON"
		return p
	}
	rest := line[len(`{"seq":`):]
	i := bytes.IndexByte(rest, ',')
	seq, err := strconv.ParseInt(string(rest[:max(i, 0)]), 10, 64)
	if i < 0 || err != nil || seq < 0 {
		p.err = "malformed record: bad seq"
		return p
	}
	p.seq = seq
	if k := bytes.Index(line, []byte(`,"kind":"`)); k >= 0 {
		ks := line[k+len(`,"kind":"`):]
		if e := bytes.IndexByte(ks, '"'); e >= 0 {
			p.kind = string(ks[:e])
		}
	}
	prevB64 := line[n-hashTailLen-hashB64Len-1 : n-hashTailLen-1]
	hashB64 := line[n-2-hashB64Len : n-2]
	if !decodeHash(&p.prev, prevB64) || !decodeHash(&p.hash, hashB64) {
		p.err = "malformed record: bad hash encoding"
		return p
	}
	p.calc = bodyHash(line[:n-hashTailLen], hb)
	return p
}

func decodeHash(h *tlog.Hash, b64 []byte) bool {
	var tmp [33]byte
	n, err := base64.StdEncoding.Decode(tmp[:], b64)
	if err != nil || n != len(h) {
		return false
	}
	copy(h[:], tmp[:n])
	return true
}

// decodeRecord fully decodes a stored line for readers. It does not check
// the hash; Verify does.
func decodeRecord(line []byte) (Record, error) {
	var s storedLine
	dec := json.NewDecoder(bytes.NewReader(line))
	dec.UseNumber()
	if err := dec.Decode(&s); err != nil {
		return Record{}, err
	}
	if s.Seq == nil {
		return Record{}, fmt.Errorf("no seq")
	}
	r := Record{Seq: *s.Seq, Time: s.Time, Sandbox: s.Sandbox, Kind: s.Kind}
	if len(s.Fields) > 0 {
		fd := json.NewDecoder(bytes.NewReader(s.Fields))
		fd.UseNumber()
		if err := fd.Decode(&r.Fields); err != nil {
			return Record{}, fmt.Errorf("fields: %v", err)
		}
	}
	if !decodeHash(&r.Prev, []byte(s.Prev)) || !decodeHash(&r.Hash, []byte(s.Hash)) {
		return Record{}, fmt.Errorf("bad hash encoding")
	}
	return r, nil
}
