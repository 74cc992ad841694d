package vhostuser

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"os"
	"strings"
	"sync"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// testLogSize covers guest-physical 0 .. 64 MiB (one bit per 4 KiB page).
const testLogSize = 64 << 20 / logPage / 8

// newLog makes a shared memfd for the dirty log, as QEMU does, with the
// bitmap at off, and returns the descriptor and the front-end's view.
func newLog(t *testing.T, off int) (int, []byte) {
	t.Helper()
	fd, err := unix.MemfdCreate("vhost-log", unix.MFD_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.Ftruncate(fd, int64(off+testLogSize)); err != nil {
		t.Fatal(err)
	}
	mp, err := unix.Mmap(fd, 0, off+testLogSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Munmap(mp); unix.Close(fd) })
	return fd, mp[off:]
}

// dirty lists the pages whose bits are set, read as QEMU reads them.
func dirty(log []byte) []uint64 {
	var out []uint64
	for i, b := range log {
		for k := range 8 {
			if b&(1<<k) != 0 {
				out = append(out, uint64(i*8+k))
			}
		}
	}
	return out
}

func page(gpa uint64) uint64 { return gpa / logPage }

func TestDirtyLogBitLayout(t *testing.T) {
	// An odd offset: the bits are found by byte, as the spec's pseudo-code
	// writes them, whatever word the backend ORs into.
	for _, off := range []int{0, 3, 4093} {
		fd, view := newLog(t, off)
		l, err := mapLog(fd, append(u64(testLogSize), u64(uint64(off))...))
		if err != nil {
			t.Fatal(err)
		}
		if err := l.mark(0x5000, 1); err != nil {
			t.Fatal(err)
		}
		if err := l.mark(0x1fff, 2); err != nil { // crosses pages 1 and 2
			t.Fatal(err)
		}
		if err := l.mark(64<<20-1, 1); err != nil { // the last page
			t.Fatal(err)
		}
		want := []uint64{1, 2, 5, 64<<20/logPage - 1}
		if got := dirty(view); !slicesEqual(got, want) {
			t.Errorf("offset %d: dirty pages %v, want %v", off, got, want)
		}
		if err := l.mark(64<<20, 1); !errors.Is(err, ErrMalformed) {
			t.Errorf("offset %d: a page beyond the log: %v", off, err)
		}
		l.unmap()
	}
}

func slicesEqual(a, b []uint64) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// The front-end starts a live migration on a running queue: LOG_ALL, the
// log, the used ring logged at its own address. Every page the backend
// writes (reply data across a page boundary, the used entry and index)
// is marked; pages it only read are not; before LOG_ALL nothing is.
func TestDirtyLogMarksWhatTheBackendWrites(t *testing.T) {
	f := newFrontEnd(t, echo{})
	f.setUp(0)
	logFD, view := newLog(t, 0)

	req := func(head uint16, rd, wr uint64, wlen uint32) {
		copy(f.mem[rd:], "0123456789")
		f.putDesc(int(head), desc{testGPA + rd, 10, descFNext, head + 1})
		f.putDesc(int(head)+1, desc{testGPA + wr, wlen, descFWrite, 0})
		f.post(head)
		waitEvent(t, f.call[0])
	}
	req(0, 0x20000, 0x30000, 10)
	if d := dirty(view); len(d) != 0 {
		t.Fatalf("pages marked before logging started: %v", d)
	}

	f.send(reqSetProtocolFeatures, 0, u64(ProtocolReplyAck|ProtocolMQ|ProtocolLogShmfd))
	f.send(reqSetFeatures, flagNeedReply, u64(FeatureVersion1|FeatureProtocolFeatures|FeatureLogAll))
	f.ack(reqSetFeatures)
	f.send(reqSetLogBase, 0, append(u64(testLogSize), u64(0)...), logFD)
	if r := f.recv(reqSetLogBase); len(r) != 16 {
		t.Fatalf("log base reply %v", r)
	}
	// Same addresses, log flag on, used ring logged at its guest address.
	const logUsedAt = testGPA + offUsed
	addr := binary.LittleEndian.AppendUint32(nil, 0)
	addr = binary.LittleEndian.AppendUint32(addr, vringFLog)
	for _, v := range []uint64{testUA + offDesc, testUA + offUsed, testUA + offAvail, logUsedAt} {
		addr = binary.LittleEndian.AppendUint64(addr, v)
	}
	f.send(reqSetVringAddr, flagNeedReply, addr)
	f.ack(reqSetVringAddr)

	// 10 bytes are written: 4 at the end of one page, 6 on the next. The
	// writable buffer is longer than what was written: the page after is
	// not marked.
	const wr = 0x40000 - 4
	req(2, 0x50000, wr, 0x2000)
	want := []uint64{page(testGPA + offUsed), page(testGPA + wr), page(testGPA + wr + 4)}
	if got := dirty(view); !slicesEqual(got, want) {
		t.Fatalf("dirty pages %#x, want %#x (used ring, two reply pages)", got, want)
	}

	// LOG_ALL off: nothing more is marked.
	clear(view)
	f.send(reqSetFeatures, flagNeedReply, u64(FeatureVersion1|FeatureProtocolFeatures))
	f.ack(reqSetFeatures)
	req(4, 0x60000, 0x70000, 10)
	if d := dirty(view); len(d) != 0 {
		t.Fatalf("pages marked after logging stopped: %#x", d)
	}
}

// A log base without LOG_SHMFD negotiated, or beyond its file, ends the
// device.
func TestDirtyLogBadBase(t *testing.T) {
	for _, c := range []struct {
		name  string
		proto uint64
		body  []byte
	}{
		{"not negotiated", ProtocolReplyAck, append(u64(testLogSize), u64(0)...)},
		{"beyond its file", ProtocolReplyAck | ProtocolLogShmfd, append(u64(testLogSize), u64(1<<20)...)},
		{"huge", ProtocolReplyAck | ProtocolLogShmfd, append(u64(1<<40), u64(0)...)},
		{"short", ProtocolReplyAck | ProtocolLogShmfd, u64(testLogSize)},
	} {
		t.Run(c.name, func(t *testing.T) {
			f := newFrontEnd(t, echo{})
			fd, _ := newLog(t, 0)
			f.send(reqSetProtocolFeatures, 0, u64(c.proto))
			f.send(reqSetLogBase, 0, c.body, fd)
			if err := <-f.done; !errors.Is(err, ErrMalformed) {
				t.Fatalf("Serve: %v, want ErrMalformed", err)
			}
			f.done <- nil
		})
	}
}

// memState is a device state held in memory.
type memState struct {
	mu      sync.Mutex
	data    []byte
	loadErr error
}

func (m *memState) SaveState(w io.Writer) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	_, err := w.Write(m.data)
	return err
}

func (m *memState) LoadState(r io.Reader) error {
	b, err := io.ReadAll(r)
	m.mu.Lock()
	defer m.mu.Unlock()
	if err != nil {
		return err
	}
	if m.loadErr != nil {
		return m.loadErr
	}
	m.data = b
	return nil
}

func pipe(t *testing.T) (r, w *os.File) {
	t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close(); w.Close() })
	return r, w
}

func (f *frontEnd) deviceStateFD(dir uint32, fd *os.File) uint64 {
	f.t.Helper()
	f.send(reqSetDeviceStateFD, 0, state(dir, phaseStopped), int(fd.Fd()))
	fd.Close() // the backend holds its own copy now
	return binary.LittleEndian.Uint64(f.recv(reqSetDeviceStateFD))
}

func (f *frontEnd) checkDeviceState() uint64 {
	f.t.Helper()
	f.send(reqCheckDeviceState, 0, nil)
	return binary.LittleEndian.Uint64(f.recv(reqCheckDeviceState))
}

// Save and load as QEMU does them: the state is larger than a pipe holds,
// so the backend must write while the front-end reads.
func TestDeviceStateTransfer(t *testing.T) {
	src := &memState{data: bytes.Repeat([]byte("node table "), 100000)}
	f := newFrontEndWith(t, Config{Queues: 2, Handler: echo{}, State: src})
	f.send(reqGetProtocolFeatures, 0, nil)
	if pf := binary.LittleEndian.Uint64(f.recv(reqGetProtocolFeatures)); pf&ProtocolDeviceState == 0 || pf&ProtocolLogShmfd == 0 {
		t.Fatalf("protocol features %#x: no DEVICE_STATE or LOG_SHMFD", pf)
	}
	f.send(reqGetFeatures, 0, nil)
	if ft := binary.LittleEndian.Uint64(f.recv(reqGetFeatures)); ft&FeatureLogAll == 0 {
		t.Fatalf("features %#x: no LOG_ALL", ft)
	}
	f.send(reqSetProtocolFeatures, 0, u64(ProtocolReplyAck|ProtocolMQ|ProtocolDeviceState))

	r, w := pipe(t)
	if v := f.deviceStateFD(transferSave, w); v != transferNoFD {
		t.Fatalf("save: reply %#x", v)
	}
	saved, err := io.ReadAll(r)
	if err != nil {
		t.Fatal(err)
	}
	if v := f.checkDeviceState(); v != 0 {
		t.Fatalf("save: check %d", v)
	}
	if !bytes.Equal(saved, src.data) {
		t.Fatalf("saved %d bytes, want %d", len(saved), len(src.data))
	}

	dst := &memState{}
	g := newFrontEndWith(t, Config{Queues: 2, Handler: echo{}, State: dst})
	g.send(reqSetProtocolFeatures, 0, u64(ProtocolReplyAck|ProtocolMQ|ProtocolDeviceState))
	r2, w2 := pipe(t)
	if v := g.deviceStateFD(transferLoad, r2); v != transferNoFD {
		t.Fatalf("load: reply %#x", v)
	}
	if _, err := w2.Write(saved); err != nil {
		t.Fatal(err)
	}
	w2.Close()
	if v := g.checkDeviceState(); v != 0 {
		t.Fatalf("load: check %d", v)
	}
	if !bytes.Equal(dst.data, saved) {
		t.Fatalf("loaded %d bytes, want %d", len(dst.data), len(saved))
	}

	// A state the device rejects fails the check; the device stays.
	dst.loadErr = errors.New("bad state")
	r3, w3 := pipe(t)
	g.deviceStateFD(transferLoad, r3)
	w3.Write([]byte("junk"))
	w3.Close()
	if v := g.checkDeviceState(); v == 0 {
		t.Fatal("a rejected state passed the check")
	}
}

// The state moves only while the device is stopped: a transfer with a
// queue running is refused, as is an unknown phase.
func TestDeviceStateRefusedWhileRunning(t *testing.T) {
	f := newFrontEndWith(t, Config{Queues: 2, Handler: echo{}, State: &memState{}})
	f.setUp(0)
	f.send(reqSetProtocolFeatures, 0, u64(ProtocolReplyAck|ProtocolMQ|ProtocolDeviceState))
	_, w := pipe(t)
	if v := f.deviceStateFD(transferSave, w); v&0xff == 0 || v&transferNoFD == 0 {
		t.Fatalf("save with a running queue: reply %#x", v)
	}
	if v := f.checkDeviceState(); v == 0 {
		t.Fatal("check passed a refused transfer")
	}
	f.send(reqGetVringBase, 0, state(0, 0))
	f.recv(reqGetVringBase)
	_, w2 := pipe(t)
	f.send(reqSetDeviceStateFD, 0, state(transferSave, 7), int(w2.Fd()))
	if v := binary.LittleEndian.Uint64(f.recv(reqSetDeviceStateFD)); v&0xff == 0 {
		t.Fatalf("phase 7: reply %#x", v)
	}
}

// Without DEVICE_STATE negotiated the messages end the device.
func TestDeviceStateNotNegotiated(t *testing.T) {
	f := newFrontEnd(t, echo{})
	_, w := pipe(t)
	f.send(reqSetDeviceStateFD, 0, state(transferSave, 0), int(w.Fd()))
	if err := <-f.done; !errors.Is(err, ErrMalformed) {
		t.Fatalf("Serve: %v", err)
	}
	f.done <- nil
}

func TestCheckSharedMapping(t *testing.T) {
	fd, err := unix.MemfdCreate("ram", unix.MFD_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	unix.Ftruncate(fd, 1<<20)
	shared, err := unix.Mmap(fd, 0, 1<<20, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(shared)
	private, err := unix.Mmap(fd, 0, 1<<20, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(private)
	at := func(b []byte) uint64 { return uint64(uintptr(unsafe.Pointer(&b[0]))) }
	if err := CheckSharedMapping(os.Getpid(), at(shared), 1<<20); err != nil {
		t.Errorf("shared mapping: %v", err)
	}
	if err := CheckSharedMapping(os.Getpid(), at(private)+4096, 4096); !errors.Is(err, ErrMalformed) || !strings.Contains(err.Error(), "share=on") {
		t.Errorf("private mapping: %v", err)
	}
	if err := CheckSharedMapping(os.Getpid(), 0x1000, 4096); !errors.Is(err, ErrMalformed) {
		t.Errorf("unmapped range: %v", err)
	}
}

// A front-end whose guest RAM is a private mapping is refused at
// SET_MEM_TABLE, before any request is served from stale memory.
func TestPrivateGuestRAMRefused(t *testing.T) {
	f := newFrontEndWith(t, Config{Queues: 2, Handler: echo{}, FrontEndPID: os.Getpid})
	private, err := unix.Mmap(f.memfd, 0, testMemSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(private)
	ua := uint64(uintptr(unsafe.Pointer(&private[0])))
	f.send(reqSetProtocolFeatures, 0, u64(ProtocolReplyAck))
	f.send(reqSetMemTable, flagNeedReply, memTable([4]uint64{testGPA, testMemSize, ua, 0}), f.memfd)
	if err := <-f.done; !errors.Is(err, ErrMalformed) {
		t.Fatalf("Serve: %v, want ErrMalformed", err)
	}
	f.done <- nil

	// The same table over the front-end's shared mapping is taken.
	g := newFrontEndWith(t, Config{Queues: 2, Handler: echo{}, FrontEndPID: os.Getpid})
	ua = uint64(uintptr(unsafe.Pointer(&g.mem[0])))
	g.send(reqSetProtocolFeatures, 0, u64(ProtocolReplyAck))
	g.send(reqSetMemTable, flagNeedReply, memTable([4]uint64{testGPA, testMemSize, ua, 0}), g.memfd)
	g.ack(reqSetMemTable)
}

// A front-end that never reads the saved state does not hold the device
// forever: hanging up ends Serve, transfer included.
func TestDeviceStateStuckTransferEnds(t *testing.T) {
	big := &memState{data: bytes.Repeat([]byte("x"), 1<<20)} // more than a pipe holds
	f := newFrontEndWith(t, Config{Queues: 2, Handler: echo{}, State: big})
	f.send(reqSetProtocolFeatures, 0, u64(ProtocolReplyAck|ProtocolDeviceState))
	r, w := pipe(t)
	if v := f.deviceStateFD(transferSave, w); v != transferNoFD {
		t.Fatalf("save: reply %#x", v)
	}
	_ = r // never read
	f.conn.Close()
	select {
	case <-f.done:
		f.done <- nil
	case <-time.After(10 * time.Second):
		t.Fatal("Serve did not end with a transfer stuck on a full pipe")
	}
}

// gate blocks each request until it is let through.
type gate struct {
	entered chan struct{}
	release chan struct{}
}

func (g gate) Handle(q int, c *Chain) (uint32, error) {
	g.entered <- struct{}{}
	<-g.release
	return echo{}.Handle(q, c)
}

// GET_VRING_BASE stops a queue after the request in flight, not after
// every request the guest posted: the rest stay in the ring (a guest that
// keeps posting cannot hold the stop), and are served after the restart.
func TestStopAfterInFlight(t *testing.T) {
	g := gate{entered: make(chan struct{}, 4), release: make(chan struct{})}
	f := newFrontEnd(t, g)
	f.setUp(0)
	copy(f.mem[offData:], "ab")
	for i := range 3 {
		f.putDesc(2*i, desc{testGPA + offData, 2, descFNext, uint16(2*i + 1)})
		f.putDesc(2*i+1, desc{testGPA + offData + 0x1000*uint64(i+1), 2, descFWrite, 0})
	}
	f.post(0)
	<-g.entered // the first request is in flight
	f.post(2)
	f.post(4)
	f.send(reqGetVringBase, 0, state(0, 0))
	reply := make(chan []byte, 1)
	go func() {
		// Read without t: the test may have ended when this returns.
		f.conn.SetReadDeadline(time.Now().Add(5 * time.Second))
		b := make([]byte, headerSize+8)
		if _, err := ioReadFull(f.conn, b); err != nil {
			b = nil
		}
		reply <- b
	}()
	time.Sleep(50 * time.Millisecond) // GET_VRING_BASE waits for the request in flight
	g.release <- struct{}{}
	st := <-reply
	if st == nil {
		t.Fatal("GET_VRING_BASE did not answer: the queue kept taking the requests posted after the one in flight")
	}
	st = st[headerSize:]
	if base := binary.LittleEndian.Uint32(st[4:]); base != 1 {
		t.Fatalf("vring base %d, want 1 (the one request taken)", base)
	}
	if _, _, idx := f.used(0); idx != 1 {
		t.Fatalf("used idx %d after the stop, want 1", idx)
	}
	go func() {
		for range 2 {
			<-g.entered
			g.release <- struct{}{}
		}
	}()
	f.startQueue(1)
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, _, idx := f.used(2); idx == 3 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the requests left in the ring were not served after the restart")
		}
		time.Sleep(10 * time.Millisecond)
	}
}
