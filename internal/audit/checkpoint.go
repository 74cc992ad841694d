package audit

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"

	"golang.org/x/mod/sumdb/note"
	"golang.org/x/mod/sumdb/tlog"
)

// Checkpoint is a signed statement "the log ORIGIN had SIZE records whose
// tree hash was ROOT at TIME". Its note text is
//
//	smx-log/<sandbox>/<log id>
//	<size>
//	<base64 tree hash>
//	<time, RFC 3339 UTC>
//
// followed by the note signature. The origin names the sandbox and the log's
// random id (committed in record 0), so a checkpoint of another log, even one
// of the same sandbox name, never verifies against this one.
type Checkpoint struct {
	Origin string
	Size   int64
	Root   tlog.Hash
	Time   time.Time
	Note   string // the signed note, as stored
}

const originPrefix = "smx-log/"

func origin(sandbox, logID string) string { return originPrefix + sandbox + "/" + logID }

func checkpointBody(c Checkpoint) string {
	return fmt.Sprintf("%s\n%d\n%s\n%s\n", c.Origin, c.Size, b64(c.Root), c.Time.UTC().Format(time.RFC3339Nano))
}

func signCheckpoint(c Checkpoint, signer note.Signer) (Checkpoint, error) {
	msg, err := note.Sign(&note.Note{Text: checkpointBody(c)}, signer)
	if err != nil {
		return c, err
	}
	c.Note = string(msg)
	return c, nil
}

func parseCheckpointBody(text string) (Checkpoint, error) {
	lines := strings.Split(text, "\n")
	if len(lines) != 5 || lines[4] != "" || !strings.HasPrefix(lines[0], originPrefix) {
		return Checkpoint{}, fmt.Errorf("malformed checkpoint text")
	}
	c := Checkpoint{Origin: lines[0]}
	var err error
	if c.Size, err = strconv.ParseInt(lines[1], 10, 64); err != nil || c.Size < 0 {
		return Checkpoint{}, fmt.Errorf("malformed checkpoint size %q", lines[1])
	}
	if !decodeHash(&c.Root, []byte(lines[2])) {
		return Checkpoint{}, fmt.Errorf("malformed checkpoint hash %q", lines[2])
	}
	if c.Time, err = time.Parse(time.RFC3339Nano, lines[3]); err != nil {
		return Checkpoint{}, fmt.Errorf("malformed checkpoint time %q", lines[3])
	}
	return c, nil
}

// checkpointLine is one line of the checkpoints file: the note as a JSON
// string, so a torn append is as easy to find as in records.jsonl.
type checkpointLine struct {
	Note string `json:"note"`
}

func encodeCheckpointLine(c Checkpoint) []byte {
	b, _ := json.Marshal(checkpointLine{Note: c.Note})
	return append(b, '\n')
}

// openCheckpoint decodes a checkpoints line and checks its signature with
// verifier (nil: parse only, used by the writer on Open, which trusts its own
// file as much as it trusts its key).
func openCheckpoint(line []byte, verifier note.Verifier) (Checkpoint, error) {
	var cl checkpointLine
	if err := json.Unmarshal(line, &cl); err != nil {
		return Checkpoint{}, fmt.Errorf("malformed checkpoint line")
	}
	var text string
	if verifier == nil {
		i := strings.Index(cl.Note, "\n\n")
		if i < 0 {
			return Checkpoint{}, fmt.Errorf("malformed checkpoint note")
		}
		text = cl.Note[:i+1]
	} else {
		n, err := note.Open([]byte(cl.Note), note.VerifierList(verifier))
		if err != nil {
			if e, ok := err.(*note.UnverifiedNoteError); ok {
				var by []string
				for _, s := range e.Note.UnverifiedSigs {
					by = append(by, fmt.Sprintf("%s+%08x", s.Name, s.Hash))
				}
				return Checkpoint{}, fmt.Errorf("not signed by key %s+%08x (signed by %s): re-signed, or the wrong public key",
					verifier.Name(), verifier.KeyHash(), strings.Join(by, ", "))
			}
			if _, ok := err.(*note.InvalidSignatureError); ok {
				return Checkpoint{}, fmt.Errorf("bad signature: the checkpoint text was changed after signing")
			}
			return Checkpoint{}, fmt.Errorf("unreadable note: %v", err)
		}
		text = n.Text
	}
	c, err := parseCheckpointBody(text)
	if err != nil {
		return Checkpoint{}, err
	}
	c.Note = cl.Note
	return c, nil
}
