package vhostuser

import (
	"encoding/binary"
	"errors"
	"testing"
)

// fuzzRing lays a hostile guest's ring out from data: data[0] picks the
// queue size (1..16), then come the descriptor table and the avail ring,
// and the rest fills the data area. Guest memory is one region at
// fuzzGPA; the used ring starts zeroed.
const (
	fuzzGPA      = 0x10000
	fuzzMemSize  = 0x4000
	fuzzDescOff  = 0x0
	fuzzAvailOff = 0x1000
	fuzzUsedOff  = 0x2000
	fuzzDataOff  = 0x3000
)

func fuzzRing(data []byte) (*ring, *Memory, bool) {
	if len(data) == 0 {
		return nil, nil, false
	}
	num := uint16(1) << (data[0] % 5)
	data = data[1:]
	buf := make([]byte, fuzzMemSize)
	n := copy(buf[fuzzDescOff:fuzzDescOff+16*int(num)], data)
	data = data[n:]
	n = copy(buf[fuzzAvailOff:fuzzAvailOff+6+2*int(num)], data)
	data = data[n:]
	copy(buf[fuzzDataOff:], data)
	mem, err := NewMemory([]Region{{GPA: fuzzGPA, UserAddr: fuzzGPA, Mem: buf}})
	if err != nil {
		panic(err)
	}
	r, err := newRing(mem, num, buf[fuzzDescOff:fuzzDescOff+16*int(num)], buf[fuzzAvailOff:fuzzAvailOff+6+2*int(num)], buf[fuzzUsedOff:fuzzUsedOff+6+8*int(num)], 0)
	if err != nil {
		panic(err)
	}
	return r, mem, true
}

// ringSeed builds a seed: a queue of 4 with the given descriptors and
// avail entries.
func ringSeed(descs []desc, avail ...uint16) []byte {
	b := []byte{2}
	d := make([]byte, 16*4)
	for i, x := range descs {
		binary.LittleEndian.PutUint64(d[16*i:], x.addr)
		binary.LittleEndian.PutUint32(d[16*i+8:], x.len)
		binary.LittleEndian.PutUint16(d[16*i+12:], x.flags)
		binary.LittleEndian.PutUint16(d[16*i+14:], x.next)
	}
	b = append(b, d...)
	a := make([]byte, 6+2*4)
	binary.LittleEndian.PutUint16(a[2:], uint16(len(avail)))
	for i, h := range avail {
		binary.LittleEndian.PutUint16(a[4+2*i:], h)
	}
	return append(append(b, a...), "payload"...)
}

// FuzzRing walks hostile rings: every buffer handed out must be guest
// memory, no chain may be longer than the queue, and a bad ring is an
// ErrMalformed error, never a panic or a hang.
func FuzzRing(f *testing.F) {
	data := uint64(fuzzGPA + fuzzDataOff)
	f.Add(ringSeed([]desc{{data, 7, descFNext, 1}, {data + 0x100, 64, descFWrite, 0}}, 0))
	f.Add(ringSeed([]desc{{data, 7, 0, 0}, {data + 8, 8, descFWrite, 0}}, 0, 1, 0))
	f.Add(ringSeed([]desc{{data, 1, descFNext, 1}, {data, 1, descFNext, 0}}, 0))
	f.Add(ringSeed([]desc{{data + 0xff0, 0x20, 0, 0}}, 0))
	f.Add(ringSeed([]desc{{data, 16, descFIndirect, 0}}, 0))
	f.Add(ringSeed([]desc{{data, 4, descFWrite | descFNext, 1}, {data, 4, 0, 0}}, 0))
	f.Add(ringSeed(nil, 9))
	f.Fuzz(func(t *testing.T, data []byte) {
		r, mem, ok := fuzzRing(data)
		if !ok {
			return
		}
		var c Chain
		for range 4 * int(r.num) {
			got, err := r.pop(&c)
			if err != nil {
				if !errors.Is(err, ErrMalformed) {
					t.Fatalf("error %v is not ErrMalformed", err)
				}
				return
			}
			if got == nil {
				return
			}
			if got.Head >= r.num {
				t.Fatalf("head %d of %d", got.Head, r.num)
			}
			if len(got.Readable)+len(got.Writable) > int(r.num) {
				t.Fatalf("chain of %d buffers in a queue of %d", len(got.Readable)+len(got.Writable), r.num)
			}
			for _, b := range append(append([][]byte{}, got.Readable...), got.Writable...) {
				if !mem.contains(b) {
					t.Fatalf("buffer of %d bytes outside guest memory", len(b))
				}
			}
			r.push(got.Head, uint32(got.WritableLen()), nil)
		}
	})
}
