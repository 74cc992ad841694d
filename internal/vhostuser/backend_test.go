package vhostuser

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"net"
	"os"
	"slices"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// The front-end here plays QEMU's part with real kernel objects: guest
// memory is a shared memfd mapping, notifications are eventfds, and the
// protocol runs on a unix socketpair with the descriptors passed by
// SCM_RIGHTS, as QEMU does. (QEMU itself drives the backend in the
// virtio-fs VM tests.)

const (
	testGPA      = 0x100000
	testUA       = 0x7f0000000000
	testMemSize  = 1 << 20
	testQueueNum = 8
	// ring layout in guest memory, offsets from testGPA
	offDesc  = 0x0
	offAvail = 0x1000
	offUsed  = 0x2000
	offData  = 0x10000
)

type frontEnd struct {
	t     testing.TB
	conn  *net.UnixConn
	memfd int
	mem   []byte
	kick  [2]int
	call  [2]int
	errfd [2]int
	done  chan error
	avail uint16
}

// echo answers each request with its readable bytes reversed.
type echo struct{}

func (echo) Handle(q int, c *Chain) (uint32, error) {
	var in []byte
	for _, b := range c.Readable {
		in = append(in, b...)
	}
	slices.Reverse(in)
	n := 0
	for _, w := range c.Writable {
		n += copy(w, in[n:])
	}
	return uint32(n), nil
}

func newFrontEnd(t testing.TB, h Handler) *frontEnd {
	t.Helper()
	return newFrontEndWith(t, Config{Queues: 2, Handler: h})
}

func newFrontEndWith(t testing.TB, cfg Config) *frontEnd {
	t.Helper()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	conn := func(fd int) *net.UnixConn {
		f := os.NewFile(uintptr(fd), "vhost-user")
		c, err := net.FileConn(f)
		f.Close()
		if err != nil {
			t.Fatal(err)
		}
		return c.(*net.UnixConn)
	}
	memfd, err := unix.MemfdCreate("guest-ram", unix.MFD_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.Ftruncate(memfd, testMemSize); err != nil {
		t.Fatal(err)
	}
	mem, err := unix.Mmap(memfd, 0, testMemSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	f := &frontEnd{t: t, conn: conn(fds[0]), memfd: memfd, mem: mem, done: make(chan error, 1)}
	f.kick[0], f.call[0], f.errfd[0] = -1, -1, -1
	for i := range 1 {
		for _, p := range []*[2]int{&f.kick, &f.call, &f.errfd} {
			e, err := unix.Eventfd(0, unix.EFD_CLOEXEC)
			if err != nil {
				t.Fatal(err)
			}
			p[i] = e
		}
	}
	back := conn(fds[1])
	go func() { f.done <- Serve(context.Background(), back, cfg) }()
	t.Cleanup(func() {
		f.conn.Close()
		select {
		case <-f.done:
		case <-time.After(10 * time.Second):
			t.Error("Serve did not return after the front-end hung up")
		}
		unix.Munmap(mem)
		unix.Close(memfd)
		for _, p := range []*[2]int{&f.kick, &f.call, &f.errfd} {
			unix.Close(p[0])
		}
	})
	return f
}

func (f *frontEnd) send(req, flags uint32, body []byte, fds ...int) {
	f.t.Helper()
	msg := make([]byte, headerSize, headerSize+len(body))
	binary.LittleEndian.PutUint32(msg[0:4], req)
	binary.LittleEndian.PutUint32(msg[4:8], flagVersion|flags)
	binary.LittleEndian.PutUint32(msg[8:12], uint32(len(body)))
	msg = append(msg, body...)
	var oob []byte
	if len(fds) > 0 {
		oob = unix.UnixRights(fds...)
	}
	if _, _, err := f.conn.WriteMsgUnix(msg, oob, nil); err != nil {
		f.t.Fatalf("send %d: %v", req, err)
	}
}

func (f *frontEnd) recv(req uint32) []byte {
	f.t.Helper()
	f.conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	hdr := make([]byte, headerSize)
	if _, err := ioReadFull(f.conn, hdr); err != nil {
		f.t.Fatalf("reply to %d: %v", req, err)
	}
	if got := binary.LittleEndian.Uint32(hdr[0:4]); got != req {
		f.t.Fatalf("reply to %d names request %d", req, got)
	}
	if fl := binary.LittleEndian.Uint32(hdr[4:8]); fl != flagVersion|flagReply {
		f.t.Fatalf("reply flags %#x", fl)
	}
	body := make([]byte, binary.LittleEndian.Uint32(hdr[8:12]))
	if _, err := ioReadFull(f.conn, body); err != nil {
		f.t.Fatal(err)
	}
	return body
}

func ioReadFull(c *net.UnixConn, b []byte) (int, error) {
	n := 0
	for n < len(b) {
		k, err := c.Read(b[n:])
		n += k
		if err != nil {
			return n, err
		}
	}
	return n, nil
}

func state(q, v uint32) []byte {
	b := binary.LittleEndian.AppendUint32(nil, q)
	return binary.LittleEndian.AppendUint32(b, v)
}

// setUp negotiates features and memory and starts queue 0.
func (f *frontEnd) setUp(base uint16) {
	f.send(reqGetFeatures, 0, nil)
	feat := binary.LittleEndian.Uint64(f.recv(reqGetFeatures))
	if feat&FeatureProtocolFeatures == 0 || feat&FeatureVersion1 == 0 {
		f.t.Fatalf("features %#x", feat)
	}
	f.send(reqGetProtocolFeatures, 0, nil)
	pf := binary.LittleEndian.Uint64(f.recv(reqGetProtocolFeatures))
	if pf&ProtocolReplyAck == 0 || pf&ProtocolMQ == 0 {
		f.t.Fatalf("protocol features %#x", pf)
	}
	f.send(reqSetProtocolFeatures, 0, u64(ProtocolReplyAck|ProtocolMQ))
	f.send(reqGetQueueNum, 0, nil)
	if n := binary.LittleEndian.Uint64(f.recv(reqGetQueueNum)); n != 2 {
		f.t.Fatalf("queue num %d", n)
	}
	f.send(reqSetFeatures, flagNeedReply, u64(FeatureVersion1|FeatureProtocolFeatures))
	f.ack(reqSetFeatures)
	f.send(reqSetOwner, 0, nil)
	table := binary.LittleEndian.AppendUint32(nil, 1)
	table = binary.LittleEndian.AppendUint32(table, 0)
	for _, v := range []uint64{testGPA, testMemSize, testUA, 0} {
		table = binary.LittleEndian.AppendUint64(table, v)
	}
	f.send(reqSetMemTable, flagNeedReply, table, f.memfd)
	f.ack(reqSetMemTable)
	f.startQueue(base)
}

func (f *frontEnd) startQueue(base uint16) {
	f.send(reqSetVringNum, 0, state(0, testQueueNum))
	f.send(reqSetVringBase, 0, state(0, uint32(base)))
	addr := binary.LittleEndian.AppendUint32(nil, 0)
	addr = binary.LittleEndian.AppendUint32(addr, 0)
	for _, v := range []uint64{testUA + offDesc, testUA + offUsed, testUA + offAvail, 0} {
		addr = binary.LittleEndian.AppendUint64(addr, v)
	}
	f.send(reqSetVringAddr, 0, addr)
	f.send(reqSetVringCall, 0, u64(0), f.call[0])
	f.send(reqSetVringErr, 0, u64(0), f.errfd[0])
	f.send(reqSetVringKick, 0, u64(0), f.kick[0])
	f.send(reqSetVringEnable, flagNeedReply, state(0, 1))
	f.ack(reqSetVringEnable)
}

func (f *frontEnd) ack(req uint32) {
	f.t.Helper()
	if v := binary.LittleEndian.Uint64(f.recv(req)); v != 0 {
		f.t.Fatalf("request %d: ack %d", req, v)
	}
}

type desc struct {
	addr  uint64
	len   uint32
	flags uint16
	next  uint16
}

func (f *frontEnd) putDesc(i int, d desc) {
	b := f.mem[offDesc+16*i:]
	binary.LittleEndian.PutUint64(b[0:], d.addr)
	binary.LittleEndian.PutUint32(b[8:], d.len)
	binary.LittleEndian.PutUint16(b[12:], d.flags)
	binary.LittleEndian.PutUint16(b[14:], d.next)
}

// post makes head available and kicks the queue.
func (f *frontEnd) post(head uint16) {
	binary.LittleEndian.PutUint16(f.mem[offAvail+4+2*int(f.avail%testQueueNum):], head)
	f.avail++
	binary.LittleEndian.PutUint16(f.mem[offAvail+2:], f.avail)
	unix.Write(f.kick[0], u64(1))
}

func waitEvent(t testing.TB, fd int) {
	t.Helper()
	p := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
	n, err := unix.Poll(p, 10000)
	if err != nil || n != 1 {
		t.Fatalf("no event on fd %d: %v", fd, err)
	}
	unix.Read(fd, make([]byte, 8))
}

func (f *frontEnd) used(i int) (id, n uint32, idx uint16) {
	idx = binary.LittleEndian.Uint16(f.mem[offUsed+2:])
	e := f.mem[offUsed+4+8*(i%testQueueNum):]
	return binary.LittleEndian.Uint32(e[0:]), binary.LittleEndian.Uint32(e[4:]), idx
}

func TestServeRequests(t *testing.T) {
	f := newFrontEnd(t, echo{})
	f.setUp(0)
	copy(f.mem[offData:], "hello, ")
	copy(f.mem[offData+0x100:], "world")
	f.putDesc(3, desc{testGPA + offData, 7, descFNext, 5})
	f.putDesc(5, desc{testGPA + offData + 0x100, 5, descFNext, 1})
	f.putDesc(1, desc{testGPA + offData + 0x200, 4, descFWrite | descFNext, 2})
	f.putDesc(2, desc{testGPA + offData + 0x300, 100, descFWrite, 0})
	f.post(3)
	waitEvent(t, f.call[0])
	id, n, idx := f.used(0)
	if id != 3 || n != 12 || idx != 1 {
		t.Fatalf("used entry: id %d len %d idx %d, want 3 12 1", id, n, idx)
	}
	got := string(f.mem[offData+0x200:offData+0x204]) + string(f.mem[offData+0x300:offData+0x308])
	if got != "dlrow ,olleh" {
		t.Fatalf("reply %q", got)
	}

	// GET_VRING_BASE stops the queue and says where it stands; a request
	// posted while it is stopped is served once it starts again there.
	f.send(reqGetVringBase, 0, state(0, 0))
	if st := f.recv(reqGetVringBase); binary.LittleEndian.Uint32(st[4:]) != 1 {
		t.Fatalf("vring base %v, want 1", st)
	}
	copy(f.mem[offData:], "abc")
	f.putDesc(0, desc{testGPA + offData, 3, descFNext, 4})
	f.putDesc(4, desc{testGPA + offData + 0x200, 3, descFWrite, 0})
	f.post(0)
	time.Sleep(50 * time.Millisecond)
	if _, _, idx := f.used(1); idx != 1 {
		t.Fatalf("a stopped queue served a request (used idx %d)", idx)
	}
	f.startQueue(1)
	waitEvent(t, f.call[0])
	if id, n, idx := f.used(1); id != 0 || n != 3 || idx != 2 || string(f.mem[offData+0x200:offData+0x203]) != "cba" {
		t.Fatalf("after restart: id %d len %d idx %d data %q", id, n, idx, f.mem[offData+0x200:offData+0x203])
	}
}

// A guest that names memory outside its RAM ends the device with an error,
// signals the error descriptor, and leaves the process running.
func TestHostileRingEndsDevice(t *testing.T) {
	for _, c := range []struct {
		name string
		d    []desc
		head uint16
	}{
		{"outside memory", []desc{{testGPA + testMemSize - 4, 8, 0, 0}}, 0},
		{"below memory", []desc{{0x1000, 8, 0, 0}}, 0},
		{"wraps", []desc{{^uint64(0) - 2, 8, 0, 0}}, 0},
		{"loop", []desc{{testGPA + offData, 1, descFNext, 1}, {testGPA + offData, 1, descFNext, 0}}, 0},
		{"next out of range", []desc{{testGPA + offData, 1, descFNext, testQueueNum}}, 0},
		{"head out of range", nil, testQueueNum + 3},
		{"indirect", []desc{{testGPA + offData, 16, descFIndirect, 0}}, 0},
		{"readable after writable", []desc{{testGPA + offData, 1, descFWrite | descFNext, 1}, {testGPA + offData, 1, 0, 0}}, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			f := newFrontEnd(t, echo{})
			f.setUp(0)
			for i, d := range c.d {
				f.putDesc(i, d)
			}
			f.post(c.head)
			waitEvent(t, f.errfd[0])
			select {
			case err := <-f.done:
				if !errors.Is(err, ErrMalformed) {
					t.Fatalf("Serve: %v, want ErrMalformed", err)
				}
				f.done <- err
			case <-time.After(10 * time.Second):
				t.Fatal("Serve did not end")
			}
			if _, _, idx := f.used(0); idx != 0 {
				t.Fatalf("used idx %d after a malformed request", idx)
			}
		})
	}
}

func TestAvailIndexTooFarAhead(t *testing.T) {
	f := newFrontEnd(t, echo{})
	f.setUp(0)
	binary.LittleEndian.PutUint16(f.mem[offAvail+2:], testQueueNum+1)
	unix.Write(f.kick[0], u64(1))
	if err := <-f.done; !errors.Is(err, ErrMalformed) {
		t.Fatalf("Serve: %v, want ErrMalformed", err)
	}
	f.done <- nil
}

func TestBadMessages(t *testing.T) {
	memfd := func() int {
		fd, _ := unix.MemfdCreate("m", unix.MFD_CLOEXEC)
		unix.Ftruncate(fd, 8192)
		return fd
	}
	region := func(gpa, size, ua, off uint64) []byte {
		var b []byte
		for _, v := range []uint64{gpa, size, ua, off} {
			b = binary.LittleEndian.AppendUint64(b, v)
		}
		return b
	}
	for _, c := range []struct {
		name string
		req  uint32
		body []byte
		fds  int
	}{
		{"unknown request", 99, nil, 0},
		{"queue out of range", reqSetVringNum, state(7, 8), 0},
		{"queue size not a power of two", reqSetVringNum, state(0, 6), 0},
		{"queue size too large", reqSetVringNum, state(0, 65536), 0},
		{"short body", reqSetFeatures, []byte{1, 2}, 0},
		{"feature not offered", reqSetFeatures, u64(1 << 5), 0},
		{"regions without descriptors", reqSetMemTable, append(state(1, 0), region(0, 4096, 0, 0)...), 0},
		{"region beyond its file", reqSetMemTable, append(state(1, 0), region(0, 1<<20, 0, 0)...), 1},
		{"overlapping regions", reqSetMemTable, append(append(state(2, 0), region(0, 4096, 0, 0)...), region(2048, 4096, 1<<30, 0)...), 2},
		{"region wraps", reqSetMemTable, append(state(1, 0), region(^uint64(0)-100, 4096, 0, 0)...), 1},
		{"dirty log not offered", reqSetLogBase, u64(0), 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			f := newFrontEnd(t, echo{})
			var fds []int
			for range c.fds {
				fds = append(fds, memfd())
			}
			f.send(c.req, 0, c.body, fds...)
			closeAll(fds)
			select {
			case err := <-f.done:
				if !errors.Is(err, ErrMalformed) {
					t.Fatalf("Serve: %v, want ErrMalformed", err)
				}
				f.done <- err
			case <-time.After(10 * time.Second):
				t.Fatal("Serve did not end")
			}
		})
	}
}

func TestMemoryGuest(t *testing.T) {
	a, b := make([]byte, 4096), make([]byte, 4096)
	m, err := NewMemory([]Region{{GPA: 0x1000, Mem: a}, {GPA: 0x2000, UserAddr: 0x10000, Mem: b}})
	if err != nil {
		t.Fatal(err)
	}
	// A buffer across two adjoining regions comes back in two pieces.
	got, err := m.Guest(0x1ff0, 0x20, nil)
	if err != nil || len(got) != 2 || len(got[0]) != 0x10 || len(got[1]) != 0x10 || !bytes.Equal(got[1], b[:0x10]) {
		t.Fatalf("Guest across regions: %d pieces, %v", len(got), err)
	}
	for _, r := range [][2]uint64{{0x0, 1}, {0x2ff0, 0x20}, {0x3000, 1}, {^uint64(0), 2}} {
		if _, err := m.Guest(r[0], r[1], nil); !errors.Is(err, ErrMalformed) {
			t.Errorf("Guest(%#x, %d): %v, want ErrMalformed", r[0], r[1], err)
		}
	}
	if _, err := m.guestRange(0x1ff0, 0x20); !errors.Is(err, ErrMalformed) {
		t.Errorf("a ring across regions: %v", err)
	}
}

// A new memory table while a queue runs: the queue goes on in the new
// mapping from where it stood.
func TestMemTableWhileRunning(t *testing.T) {
	f := newFrontEnd(t, echo{})
	f.setUp(0)
	copy(f.mem[offData:], "ab")
	f.putDesc(0, desc{testGPA + offData, 2, descFNext, 1})
	f.putDesc(1, desc{testGPA + offData + 0x100, 2, descFWrite, 0})
	f.post(0)
	waitEvent(t, f.call[0])
	f.send(reqSetMemTable, flagNeedReply, memTable([4]uint64{testGPA, testMemSize, testUA, 0}), f.memfd)
	f.ack(reqSetMemTable)
	copy(f.mem[offData:], "cd")
	f.post(0)
	waitEvent(t, f.call[0])
	if _, n, idx := f.used(1); n != 2 || idx != 2 || string(f.mem[offData+0x100:offData+0x102]) != "dc" {
		t.Fatalf("after the new table: len %d idx %d data %q", n, idx, f.mem[offData+0x100:offData+0x102])
	}
}

// A front-end that shrinks a region's file under the backend makes guest
// memory fault: the device ends with ErrMalformed, the process survives.
func TestShrunkRegionEndsDevice(t *testing.T) {
	f := newFrontEnd(t, echo{})
	f.setUp(0)
	extra, err := unix.MemfdCreate("extra", unix.MFD_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(extra)
	unix.Ftruncate(extra, 1<<16)
	const extraGPA = 0x10000000
	f.send(reqSetMemTable, flagNeedReply, memTable([4]uint64{testGPA, testMemSize, testUA, 0}, [4]uint64{extraGPA, 1 << 16, testUA + 1<<30, 0}), f.memfd, extra)
	f.ack(reqSetMemTable)
	unix.Ftruncate(extra, 0)
	f.putDesc(0, desc{extraGPA + 0x100, 16, descFNext, 1})
	f.putDesc(1, desc{testGPA + offData, 16, descFWrite, 0})
	f.post(0)
	select {
	case err := <-f.done:
		if !errors.Is(err, ErrMalformed) {
			t.Fatalf("Serve: %v, want ErrMalformed", err)
		}
		f.done <- err
	case <-time.After(10 * time.Second):
		t.Fatal("Serve did not end")
	}
}

func memTable(regions ...[4]uint64) []byte {
	b := binary.LittleEndian.AppendUint32(nil, uint32(len(regions)))
	b = binary.LittleEndian.AppendUint32(b, 0)
	for _, r := range regions {
		for _, v := range r {
			b = binary.LittleEndian.AppendUint64(b, v)
		}
	}
	return b
}

// holder holds a request whose first byte is 'H' until release is closed,
// and echoes the rest.
type holder struct {
	release chan struct{}
	held    chan struct{}
}

func (h holder) Handle(q int, c *Chain) (uint32, error) {
	if len(c.Readable) > 0 && len(c.Readable[0]) > 0 && c.Readable[0][0] == 'H' {
		c.Hold()
		c.Hold() // a second call changes nothing
		close(h.held)
		<-h.release
	}
	return echo{}.Handle(q, c)
}

// A held request does not hold the queue: the requests behind it are
// served while it waits, and it is answered after them, out of order.
// A stop of the queue waits for it.
func TestHeldRequest(t *testing.T) {
	h := holder{release: make(chan struct{}), held: make(chan struct{})}
	f := newFrontEnd(t, h)
	f.setUp(0)
	copy(f.mem[offData:], "Hold")
	copy(f.mem[offData+0x100:], "next")
	f.putDesc(0, desc{testGPA + offData, 4, descFNext, 1})
	f.putDesc(1, desc{testGPA + offData + 0x200, 4, descFWrite, 0})
	f.putDesc(2, desc{testGPA + offData + 0x100, 4, descFNext, 3})
	f.putDesc(3, desc{testGPA + offData + 0x300, 4, descFWrite, 0})
	f.post(0)
	<-h.held
	f.post(2)
	waitEvent(t, f.call[0])
	if id, n, idx := f.used(0); id != 2 || n != 4 || idx != 1 || string(f.mem[offData+0x300:offData+0x304]) != "txen" {
		t.Fatalf("behind a held request: id %d len %d idx %d", id, n, idx)
	}
	// GET_VRING_BASE waits for the held request.
	got := make(chan []byte, 1)
	go func() {
		f.send(reqGetVringBase, 0, state(0, 0))
		got <- f.recv(reqGetVringBase)
	}()
	select {
	case <-got:
		t.Fatal("the queue stopped while a request was held")
	case <-time.After(100 * time.Millisecond):
	}
	close(h.release)
	st := <-got
	if binary.LittleEndian.Uint32(st[4:]) != 2 {
		t.Fatalf("vring base %v, want 2", st)
	}
	if id, n, idx := f.used(1); id != 0 || n != 4 || idx != 2 || string(f.mem[offData+0x200:offData+0x204]) != "dloH" {
		t.Fatalf("the held request: id %d len %d idx %d", id, n, idx)
	}
}

// BenchmarkServeRequests is one request's round trip through a queue:
// post, kick, handle, push, signal (what Chain.Hold's bookkeeping adds to
// every request is measured here).
func BenchmarkServeRequests(b *testing.B) {
	f := newFrontEnd(b, echo{})
	f.setUp(0)
	copy(f.mem[offData:], "ping")
	f.putDesc(0, desc{testGPA + offData, 4, descFNext, 1})
	f.putDesc(1, desc{testGPA + offData + 0x200, 4, descFWrite, 0})
	b.ResetTimer()
	for range b.N {
		f.post(0)
		waitEvent(b, f.call[0])
	}
}
