// Package audit is the tamper-evident log of what happens in a sandbox: runs,
// execs, policy refusals, allowed flows and pushes (summarised), credential
// uses, snapshots, profile changes. It is read with `smx agent logs` and
// outlives the sandbox until `smx logs prune`.
//
// # Storage
//
// One directory per sandbox, DIR = Dir(STATE/logs, sandbox), outside the
// sandbox directory:
//
//	records.jsonl  one record per line, append only
//	checkpoints    one signed checkpoint per line, append only ({"note": "..."})
//	lock           flock held by the one writer (Log) while it is open
//
// A record line is, byte for byte,
//
//	{"seq":N,"time":"RFC3339Nano UTC","sandbox":S,"kind":K,"fields":{...},"prev":"B64","hash":"B64"}
//
// seq counts from 0; record 0 is log.create and carries the log's random id.
// hash is tlog.RecordHash("smx-audit-record/v1\n" + the line up to and
// including the prev field + "}"), i.e. SHA-256 over a domain-separated
// encoding of the record without its hash, computed over the stored bytes
// (no re-encoding is needed to check it). prev is the hash of record N-1
// (zero for record 0). The record hashes are also the leaves of a tlog
// (RFC 6962) Merkle tree, so a checkpoint commits to every record before it.
//
// A checkpoint is a golang.org/x/mod/sumdb/note signed with the host's
// ed25519 key (LoadOrCreateKey, STATE/audit/key) over
//
//	smx-log/<sandbox>/<log id>
//	<tree size>
//	<base64 tree hash>
//	<time>
//
// The writer signs one after every run.end record, at least every minute
// while records arrive, on Checkpoint, and on Close, which first appends a
// log.close record: a cleanly closed log is covered entirely by its last
// checkpoint, which is how Verify tells "the last checkpoint was replaced by
// an older one" from "the writer is still running".
//
// # Durability
//
// Append returns only after the record's line, newline included, is written
// and fdatasync'ed. Concurrent appends are group committed: one writer
// goroutine takes every request queued while the previous fsync ran, writes
// them with one write and one fdatasync, then acknowledges them all. A lone
// appender pays one fsync per record; N concurrent appenders share one, so
// throughput grows with concurrency at the same promise. A crash can leave
// an unterminated last line, which was never acknowledged; Open cuts it
// (and says so in its log.open record). Any other damage makes Open fail:
// appending to a broken chain would be worthless.
//
// # What it proves, and what not
//
// Verify detects an edited, deleted, inserted or reordered record, a
// truncated tail that a checkpoint covered, an older checkpoint put in
// place of a newer one, and a checkpoint signed by another key or taken from
// another log. Records written since the last checkpoint are not yet signed:
// cutting them off is undetectable until the next checkpoint (at most a
// minute, or the end of the current run). Whoever can read the private key
// can rewrite the whole log and re-sign it; the key is kept 0600 in the
// state directory, and its public half is pinned outside it when it is
// created (TrustedKeysFile, ~/.config/smx/trusted-log-keys), so verifying
// against the pin detects a swapped key. The guest never sees any of these
// files.
//
// A writer never signs what it did not write. A record after a log.close
// that is not a log.open fails Verify (and Open). Records after the last
// checkpoint of a writer that stopped without closing the log are kept on
// Open, but marked by a log.unverified record before the new writer signs
// anything, and Verify lists them as unverified: nobody can tell a crashed
// writer's last records from a forger's.
//
// # Contents
//
// Fields are small JSON values chosen by the caller. Callers pass names, never
// values, of secrets: cred.use says which credential went where, not what it
// is. The log does not inspect fields, so this is the caller's contract.
//
// # Concurrency
//
// A Log is safe for concurrent use and is the only writer of its directory
// (across processes, by flock; a second Open fails with errdefs.ErrInUse).
// Scan, Read, Follow and Verify take no lock and may run while a writer
// appends; they ignore a torn last line.
package audit
