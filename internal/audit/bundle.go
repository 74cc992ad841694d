package audit

import (
	"archive/tar"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/smx-dev/smx/internal/errdefs"
)

// A bundle is one sandbox's log as a tar stream, for an auditor on another
// machine: records.jsonl, checkpoints, and key.pub (the verifier key the
// checkpoints are signed with). Who trusts key.pub is the reader's
// decision: VerifyBundles takes the trusted keys separately.
var bundleFiles = []string{"records.jsonl", "checkpoints", "key.pub"}

// maxBundleFile bounds each file read from a bundle.
const maxBundleFile = 1 << 30

// ExportBundle writes the log in dir and the public key vkey as a bundle.
func ExportBundle(w io.Writer, dir, vkey string) error {
	tw := tar.NewWriter(w)
	for _, name := range bundleFiles {
		var b []byte
		var err error
		if name == "key.pub" {
			b = []byte(vkey + "\n")
		} else if b, err = os.ReadFile(filepath.Join(dir, name)); err != nil && !(name == "checkpoints" && errors.Is(err, os.ErrNotExist)) {
			return fmt.Errorf("audit: export: %w", err)
		}
		if err := tw.WriteHeader(&tar.Header{Name: name, Mode: 0o644, Size: int64(len(b)), Typeflag: tar.TypeReg}); err != nil {
			return fmt.Errorf("audit: export: %w", err)
		}
		if _, err := tw.Write(b); err != nil {
			return fmt.Errorf("audit: export: %w", err)
		}
	}
	return tw.Close()
}

// BundleReport is what VerifyBundles found in one bundle.
type BundleReport struct {
	File    string        `json:"file"`
	Key     string        `json:"key"`
	Trusted bool          `json:"trusted"`
	Report  *VerifyReport `json:"report"`
	// Links are the records of this log that continue another log (a
	// sandbox restored from a snapshot taken on another host).
	Links []LinkReport `json:"links,omitempty"`
}

// LinkReport is one link from a record of a log to a record of another.
type LinkReport struct {
	Seq       int64  `json:"seq"` // the linking record
	ToSandbox string `json:"to_sandbox"`
	ToLogID   string `json:"to_log_id"`
	ToSeq     int64  `json:"to_seq"`
	ToHash    string `json:"to_hash"`
	Verified  bool   `json:"verified"`
	Problem   string `json:"problem,omitempty"`
}

// VerifyBundles verifies each bundle's log with the key it carries, says
// whether that key is one of trusted (verifier key texts), and checks
// every link between the logs: the linked record must be in a bundle
// given, verified, covered by a signed checkpoint and have the hash the
// link names. The error is non-nil when any of that fails.
func VerifyBundles(files []string, trusted []string) ([]BundleReport, error) {
	isTrusted := map[string]bool{}
	for _, k := range trusted {
		isTrusted[strings.TrimSpace(k)] = true
	}
	var reps []BundleReport
	type located struct {
		bundle  int
		hash    string
		covered bool
	}
	records := map[string]located{} // log id + "/" + seq
	var problems []string
	for i, f := range files {
		dir, err := os.MkdirTemp("", "smx-bundle-")
		if err != nil {
			return nil, err
		}
		defer os.RemoveAll(dir)
		key, err := unpackBundle(f, dir)
		if err != nil {
			return nil, err
		}
		v, err := ParseVerifier(key)
		if err != nil {
			return nil, fmt.Errorf("audit: %s: %w", f, err)
		}
		rep, err := Verify(dir, v)
		if err != nil {
			return nil, fmt.Errorf("audit: %s: %w", f, err)
		}
		br := BundleReport{File: f, Key: key, Trusted: isTrusted[key], Report: rep}
		if !rep.OK() {
			problems = append(problems, fmt.Sprintf("%s: %s", f, rep.Problems[0]))
		}
		if !br.Trusted {
			problems = append(problems, fmt.Sprintf("%s: signed by %s, which is not a trusted key: add it to the trusted-log-keys file or pass --key", f, key))
		}
		var covered int64
		if rep.Latest != nil {
			covered = rep.Latest.Size
		}
		err = Scan(dir, Filter{}, func(r Record) error {
			h := b64(r.Hash)
			unverified := false
			for _, s := range rep.Unverified {
				if r.Seq >= s.From && r.Seq <= s.To {
					unverified = true
				}
			}
			records[rep.LogID+"/"+fmt.Sprint(r.Seq)] = located{bundle: i, hash: h, covered: r.Seq < covered && !unverified && rep.OK() && br.Trusted}
			if id, ok := r.Fields["origin_log_id"].(string); ok {
				lr := LinkReport{Seq: r.Seq, ToLogID: id, ToSeq: -1}
				switch n := r.Fields["origin_log_seq"].(type) {
				case json.Number:
					lr.ToSeq, _ = n.Int64()
				case float64:
					lr.ToSeq = int64(n)
				}
				lr.ToSandbox, _ = r.Fields["origin_log_sandbox"].(string)
				lr.ToHash, _ = r.Fields["origin_log_hash"].(string)
				br.Links = append(br.Links, lr)
			}
			return nil
		})
		if err != nil {
			return nil, err
		}
		reps = append(reps, br)
	}
	for i := range reps {
		for j := range reps[i].Links {
			l := &reps[i].Links[j]
			at, ok := records[l.ToLogID+"/"+fmt.Sprint(l.ToSeq)]
			switch {
			case !ok:
				l.Problem = fmt.Sprintf("the log it continues (%s, id %s) is not among the bundles given: export it on the host it came from", l.ToSandbox, l.ToLogID)
			case at.hash != l.ToHash:
				l.Problem = fmt.Sprintf("record %d of %s has hash %s, the link names %s", l.ToSeq, l.ToSandbox, at.hash, l.ToHash)
			case !at.covered:
				l.Problem = fmt.Sprintf("record %d of %s is not covered by a verified checkpoint of a trusted key", l.ToSeq, l.ToSandbox)
			default:
				l.Verified = true
			}
			if l.Problem != "" {
				problems = append(problems, fmt.Sprintf("%s: record %d: %s", reps[i].File, l.Seq, l.Problem))
			}
		}
	}
	if len(problems) > 0 {
		return reps, fmt.Errorf("audit: %s: %w", strings.Join(problems, "; "), errdefs.ErrFailed)
	}
	return reps, nil
}

// unpackBundle writes a bundle's files into dir and returns its key.
func unpackBundle(file, dir string) (string, error) {
	f, err := os.Open(file)
	if err != nil {
		return "", fmt.Errorf("audit: %w", err)
	}
	defer f.Close()
	tr := tar.NewReader(f)
	var key string
	seen := map[string]bool{}
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return "", fmt.Errorf("audit: %s is not a log bundle: %v: %w", file, err, errdefs.ErrInvalid)
		}
		ok := false
		for _, n := range bundleFiles {
			ok = ok || h.Name == n
		}
		if !ok || h.Typeflag != tar.TypeReg || seen[h.Name] || h.Size > maxBundleFile {
			return "", fmt.Errorf("audit: %s: unexpected entry %q in a log bundle: %w", file, h.Name, errdefs.ErrInvalid)
		}
		seen[h.Name] = true
		var buf bytes.Buffer
		if _, err := io.Copy(&buf, io.LimitReader(tr, maxBundleFile)); err != nil {
			return "", fmt.Errorf("audit: %s: %w", file, err)
		}
		if h.Name == "key.pub" {
			key = strings.TrimSpace(buf.String())
			continue
		}
		if err := os.WriteFile(filepath.Join(dir, h.Name), buf.Bytes(), 0o600); err != nil {
			return "", err
		}
	}
	if !seen["records.jsonl"] || key == "" {
		return "", fmt.Errorf("audit: %s: a log bundle needs records.jsonl and key.pub: %w", file, errdefs.ErrInvalid)
	}
	return key, nil
}
