package vhostuser

import (
	"encoding/binary"
	"sync/atomic"
	"unsafe"
)

// A split virtqueue (virtio 1.x, 2.7) in guest memory. Everything in it is
// written by the guest and is hostile: every index is checked against the
// queue size, every buffer against guest memory, and a chain may not be
// longer than the queue (a loop in the next fields ends the walk).

const (
	descSize = 16

	descFNext     = 1
	descFWrite    = 2
	descFIndirect = 4

	availFNoInterrupt = 1

	// MaxQueueSize is the largest split queue (virtio 1.x: 2^15).
	MaxQueueSize = 32768
)

// Chain is one request: the buffers the device reads (the guest's
// request) followed by the buffers it writes (the reply). The slices are
// guest memory itself; they are valid only until the request is answered.
type Chain struct {
	Head     uint16
	Readable [][]byte
	Writable [][]byte

	// written are the guest-physical ranges of the writable descriptors,
	// in order: what the dirty log marks for the bytes the handler wrote.
	written []span

	q    *queue // the queue whose worker handles it; nil outside one
	held bool   // Hold was called while it was handled (q.holdMu)
}

// Hold says that the request being handled will wait long (for the host
// user's answer): another goroutine takes over the queue at once and
// serves the requests behind it, and the goroutine handling this one
// returns its reply and ends when Handle returns. Replies may so reach
// the used ring out of order, as virtio allows.
//
// It may be called from any goroutine: on a chain its queue is not
// handling at that moment it does nothing, and on one handled by a
// worker other than the caller it only costs a goroutine. While a request
// is held the memory table cannot change and a stop of the queue
// (GET_VRING_BASE) waits for it, so its buffers stay valid.
func (c *Chain) Hold() {
	q := c.q
	if q == nil {
		return
	}
	q.holdMu.Lock()
	defer q.holdMu.Unlock()
	if q.handling != c || c.held {
		return
	}
	c.held = true
	go q.work()
}

// ReadableLen and WritableLen are the sizes of each side.
func (c *Chain) ReadableLen() int { return total(c.Readable) }
func (c *Chain) WritableLen() int { return total(c.Writable) }

func total(bs [][]byte) int {
	n := 0
	for _, b := range bs {
		n += len(b)
	}
	return n
}

// ring is one queue's split ring, with its three parts resolved to guest
// memory when the queue starts.
type ring struct {
	mem   *Memory
	num   uint16
	desc  []byte // num*16
	avail []byte // 4 + 2*num (+2 used_event, unused: no EVENT_IDX)
	used  []byte // 4 + 8*num (+2 avail_event, unused)

	lastAvail uint16 // next avail entry to take
	usedIdx   uint16 // next used entry to fill

	// logUsed says that writes to the used ring are logged, at logAddr
	// (the front-end's address for the used ring in the dirty log).
	logUsed bool
	logAddr uint64
}

// newRing resolves the ring's parts. desc and avail and used are
// guest-physical (the caller translates front-end addresses first).
func newRing(mem *Memory, num uint16, desc, avail, used []byte, base uint16) (*ring, error) {
	if num == 0 || num&(num-1) != 0 || uint32(num) > MaxQueueSize {
		return nil, malformed("queue size %d", num)
	}
	n := int(num)
	if len(desc) < n*descSize || len(avail) < 4+2*n || len(used) < 4+8*n {
		return nil, malformed("ring parts too small for %d entries", num)
	}
	if uintptr(unsafe.Pointer(&used[0]))%4 != 0 || uintptr(unsafe.Pointer(&avail[0]))%2 != 0 {
		return nil, malformed("ring parts misaligned")
	}
	return &ring{mem: mem, num: num, desc: desc, avail: avail, used: used, lastAvail: base, usedIdx: base}, nil
}

// availIdx reads the guest's avail index with an atomic load of the aligned
// 32-bit word holding it, so that the entries it covers are read after it.
func (r *ring) availIdx() uint16 {
	if uintptr(unsafe.Pointer(&r.avail[2]))%4 == 0 {
		return uint16(atomic.LoadUint32((*uint32)(unsafe.Pointer(&r.avail[2]))))
	}
	w := atomic.LoadUint32((*uint32)(unsafe.Pointer(&r.avail[0])))
	return uint16(w >> 16)
}

func (r *ring) availFlags() uint16 {
	return binary.LittleEndian.Uint16(r.avail[0:2])
}

// pending says whether the guest has made requests the device has not
// taken, or an error if its index is impossible.
func (r *ring) pending() (bool, error) {
	idx := r.availIdx()
	if d := idx - r.lastAvail; d > r.num {
		return false, malformed("avail index %d is %d ahead of the device (queue size %d)", idx, d, r.num)
	}
	return idx != r.lastAvail, nil
}

// pop takes the next request, or returns nil when there is none. The
// chain's slices reuse c's.
func (r *ring) pop(c *Chain) (*Chain, error) {
	ok, err := r.pending()
	if err != nil || !ok {
		return nil, err
	}
	slot := 4 + 2*int(r.lastAvail%r.num)
	head := binary.LittleEndian.Uint16(r.avail[slot : slot+2])
	if head >= r.num {
		return nil, malformed("avail entry %d names descriptor %d of %d", r.lastAvail, head, r.num)
	}
	c.Head, c.Readable, c.Writable, c.written = head, c.Readable[:0], c.Writable[:0], c.written[:0]
	i := head
	for n := 0; ; n++ {
		if n >= int(r.num) {
			return nil, malformed("descriptor chain from %d is longer than the queue (a loop)", head)
		}
		d := r.desc[int(i)*descSize : int(i)*descSize+descSize]
		addr := binary.LittleEndian.Uint64(d[0:8])
		length := binary.LittleEndian.Uint32(d[8:12])
		flags := binary.LittleEndian.Uint16(d[12:14])
		next := binary.LittleEndian.Uint16(d[14:16])
		if flags&descFIndirect != 0 {
			return nil, malformed("indirect descriptor %d (not negotiated)", i)
		}
		if flags&descFWrite != 0 {
			if c.Writable, err = r.mem.Guest(addr, uint64(length), c.Writable); err != nil {
				return nil, err
			}
			c.written = append(c.written, span{addr, uint64(length)})
		} else {
			if len(c.Writable) > 0 {
				return nil, malformed("readable descriptor %d after a writable one", i)
			}
			if c.Readable, err = r.mem.Guest(addr, uint64(length), c.Readable); err != nil {
				return nil, err
			}
		}
		if flags&descFNext == 0 {
			break
		}
		if next >= r.num {
			return nil, malformed("descriptor %d chains to %d of %d", i, next, r.num)
		}
		i = next
	}
	r.lastAvail++
	return c, nil
}

// push returns a request to the guest with the number of bytes written
// into its writable buffers. With log set and the ring's used writes
// logged, it marks the entry and the index it wrote.
func (r *ring) push(head uint16, written uint32, log *dirtyLog) error {
	slot := 4 + 8*int(r.usedIdx%r.num)
	binary.LittleEndian.PutUint32(r.used[slot:slot+4], uint32(head))
	binary.LittleEndian.PutUint32(r.used[slot+4:slot+8], written)
	r.usedIdx++
	// flags (0: the device wants kicks) and idx in one aligned store,
	// after the entry.
	atomic.StoreUint32((*uint32)(unsafe.Pointer(&r.used[0])), uint32(r.usedIdx)<<16)
	if log != nil && r.logUsed {
		// Marked after the write: QEMU reads and clears the bits, then
		// copies the pages, and syncs once more after the device stops,
		// so a mark that follows its write is never missed; one that
		// came first could be cleared before the write landed.
		if err := log.mark(r.logAddr+uint64(slot), 8); err != nil {
			return err
		}
		return log.mark(r.logAddr, 4)
	}
	return nil
}

// wantsInterrupt says whether the guest asked to be signalled for used
// buffers (no EVENT_IDX: the avail ring's NO_INTERRUPT flag).
func (r *ring) wantsInterrupt() bool {
	return r.availFlags()&availFNoInterrupt == 0
}
