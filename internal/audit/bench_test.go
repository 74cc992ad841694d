package audit

import (
	"bufio"
	"context"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"golang.org/x/mod/sumdb/tlog"
)

// A net.flow summary, a typical record (about 250 bytes on disk).
var benchFields = map[string]any{
	"dst": "140.82.112.3:443", "host": "github.com", "proto": "tcp",
	"bytes_out": 18234, "bytes_in": 1203311, "rule": "allow github.com (profile dev)",
}

// BenchmarkAppendBatched measures acknowledged (fdatasync'ed) appends from
// many concurrent appenders, which group commit folds into shared fsyncs.
func BenchmarkAppendBatched(b *testing.B) {
	k := testKey(b)
	l, err := Open(b.TempDir(), "bench", k.Signer())
	if err != nil {
		b.Fatal(err)
	}
	defer l.Close()
	syncs0 := l.syncs.Load()
	b.SetParallelism(128) // 128 appenders per GOMAXPROCS: supervisor-like fan-in
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if _, err := l.Append(context.Background(), KindNetFlow, benchFields); err != nil {
				b.Error(err)
				return
			}
		}
	})
	b.StopTimer()
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "records/s")
	b.ReportMetric(float64(b.N)/float64(l.syncs.Load()-syncs0), "records/fsync")
}

// BenchmarkAppendSync is one appender, one fsync per record: the floor.
func BenchmarkAppendSync(b *testing.B) {
	k := testKey(b)
	l, err := OpenWith(b.TempDir(), "bench", Options{Signer: k.Signer(), SyncEach: true})
	if err != nil {
		b.Fatal(err)
	}
	defer l.Close()
	b.ResetTimer()
	for range b.N {
		if _, err := l.Append(context.Background(), KindNetFlow, benchFields); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "records/s")
}

var (
	bigLogOnce sync.Once
	bigLogDir  string
	bigLogKey  *Key
)

// buildBigLog writes a valid closed log of n records straight to disk (no
// fsync, no writer goroutine) with a checkpoint every 100k records.
func buildBigLog(b *testing.B, n int) (string, *Key) {
	bigLogOnce.Do(func() {
		dir, err := os.MkdirTemp("", "audit-bench-*")
		if err != nil {
			b.Fatal(err)
		}
		bigLogDir = dir
		k, err := LoadOrCreateKey(filepath.Join(dir, "key"))
		if err != nil {
			b.Fatal(err)
		}
		bigLogKey = k
		rf, _ := os.Create(filepath.Join(dir, recordsFile))
		cf, _ := os.Create(filepath.Join(dir, checkpointsFile))
		w := bufio.NewWriterSize(rf, 1<<20)
		enc, _ := encodeFields(benchFields)
		var (
			f        frontier
			prev     tlog.Hash
			buf, hb  []byte
			tm       = time.Now().UTC()
			orig     = origin("bench", "0123456789abcdef")
			checkpnt = func() {
				c, err := signCheckpoint(Checkpoint{Origin: orig, Size: f.n, Root: f.root(), Time: tm}, k.Signer())
				if err != nil {
					b.Fatal(err)
				}
				cf.Write(encodeCheckpointLine(c))
			}
		)
		for i := range n {
			r := Record{Seq: int64(i), Time: tm, Sandbox: "bench", Kind: KindNetFlow, Prev: prev}
			e := enc
			switch i {
			case 0:
				r.Kind, e = KindLogCreate, []byte(`{"log_id":"0123456789abcdef"}`)
			case n - 1:
				r.Kind, e = KindLogClose, []byte(`{}`)
			}
			buf = encodeRecord(buf[:0], &r, e, &hb)
			w.Write(buf)
			f.push(r.Hash)
			prev = r.Hash
			if (i+1)%100000 == 0 || i == n-1 {
				checkpnt()
			}
		}
		w.Flush()
		rf.Close()
		cf.Close()
	})
	return bigLogDir, bigLogKey
}

func TestMain(m *testing.M) {
	code := m.Run()
	if bigLogDir != "" {
		os.RemoveAll(bigLogDir)
	}
	os.Exit(code)
}

// BenchmarkVerify1M verifies a log of one million records (each op is one
// full verification; the file is in the page cache after the first).
func BenchmarkVerify1M(b *testing.B) {
	const n = 1_000_000
	dir, k := buildBigLog(b, n)
	st, _ := os.Stat(filepath.Join(dir, recordsFile))
	b.SetBytes(st.Size())
	b.ResetTimer()
	for range b.N {
		rep, err := Verify(dir, k.Verifier())
		if err != nil {
			b.Fatal(err)
		}
		if !rep.OK() || rep.Records != n {
			b.Fatalf("%s", rep)
		}
	}
	b.StopTimer()
	b.ReportMetric(float64(n)*float64(b.N)/b.Elapsed().Seconds(), "records/s")
}

// BenchmarkCountRefusals1M is what `smx agent ls` pays per sandbox for its
// refusal count on a log of one million records, against reading the log
// with Scan.
func BenchmarkCountRefusals1M(b *testing.B) {
	const n = 1_000_000
	dir, _ := buildBigLog(b, n)
	b.Run("CountRefusals", func(b *testing.B) {
		for range b.N {
			if _, err := CountRefusals(dir, Identity{}); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("Scan", func(b *testing.B) {
		for range b.N {
			if err := Scan(dir, Filter{Refusals: true}, func(Record) error { return nil }); err != nil {
				b.Fatal(err)
			}
		}
	})
}
