// Package vhostuser is the backend side of the vhost-user protocol (QEMU
// docs/interop/vhost-user.rst) over a unix socket: QEMU (the front-end)
// hands the backend guest memory and the virtqueues of one virtio device,
// and the backend serves the guest's requests straight from and into guest
// memory. The supervisor uses it for the sandbox's virtio-fs device.
//
// The guest and, through it, everything in the queues is hostile: every
// descriptor, index and length is checked against guest memory before it
// is used, and a malformed message or ring ends this device alone (Serve
// returns an error wrapping ErrMalformed); it never panics the process.
package vhostuser

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"runtime/debug"
	"sync"
	"sync/atomic"

	"golang.org/x/sys/unix"
)

// Front-end requests (vhost-user.rst, "Front-end message types").
const (
	reqGetFeatures         = 1
	reqSetFeatures         = 2
	reqSetOwner            = 3
	reqResetOwner          = 4
	reqSetMemTable         = 5
	reqSetLogBase          = 6
	reqSetLogFD            = 7
	reqSetVringNum         = 8
	reqSetVringAddr        = 9
	reqSetVringBase        = 10
	reqGetVringBase        = 11
	reqSetVringKick        = 12
	reqSetVringCall        = 13
	reqSetVringErr         = 14
	reqGetProtocolFeatures = 15
	reqSetProtocolFeatures = 16
	reqGetQueueNum         = 17
	reqSetVringEnable      = 18
	reqSetDeviceStateFD    = 42
	reqCheckDeviceState    = 43
	reqSetBackendReqFD     = 21
)

// Header flags.
const (
	flagVersion   = 0x1
	flagReply     = 0x4
	flagNeedReply = 0x8
)

// Feature bits.
const (
	FeatureVersion1         = 1 << 32 // VIRTIO_F_VERSION_1
	FeatureProtocolFeatures = 1 << 30 // VHOST_USER_F_PROTOCOL_FEATURES
	FeatureAccessPlatform   = 1 << 33 // VIRTIO_F_ACCESS_PLATFORM: the guest maps buffers with its DMA API

	ProtocolMQ          = 1 << 0
	ProtocolReplyAck    = 1 << 3
	ProtocolDeviceState = 1 << 19
	// ProtocolBackendReq is offered only with FeatureAccessPlatform, which
	// QEMU refuses without it; the backend never sends on the channel.
	ProtocolBackendReq = 1 << 5
)

const (
	headerSize = 12
	// maxPayload bounds a message body; the largest this backend accepts is
	// SET_MEM_TABLE (8 + 8*32 bytes).
	maxPayload = 4096
	maxRegions = 8
	maxFDs     = maxRegions
)

// Handler serves the requests of a device's queues.
type Handler interface {
	// Handle serves one request taken from queue q and returns how many
	// bytes it wrote into c.Writable. It is called for one request at a
	// time per queue, and for several queues at once. c's buffers are
	// guest memory, changed by the guest at any time: read each field
	// once. An error ends the device; a request the device refuses is
	// answered, not an error.
	Handle(q int, c *Chain) (uint32, error)
}

// Config describes the device a Backend serves.
type Config struct {
	// Queues is the device's number of virtqueues (vhost-user-fs: one
	// high-priority queue plus its request queues).
	Queues int
	// Features are the device's virtio feature bits offered besides
	// VERSION_1 and PROTOCOL_FEATURES.
	Features uint64
	Handler  Handler
	// State, when set, saves and loads the device's state inside the
	// front-end's migration stream (PROTOCOL_F_DEVICE_STATE): QEMU 8.2
	// and newer migrate, snapshot and restore the device only with it.
	State DeviceState
	// FrontEndPID, when set, names the front-end process, whose mappings
	// of guest memory SET_MEM_TABLE checks are shared (see
	// CheckSharedMapping); 0 means not known yet, and refuses the table.
	FrontEndPID func() int
	Log         *slog.Logger
}

// DeviceState is a device's state as it travels in a migration, between a
// device whose queues are stopped on the source and one whose queues have
// not started on the destination. SaveState writes it all to w;
// LoadState reads it from r, which is input from the front-end's stream
// (a file on disk, for a snapshot): bounded and validated, never trusted.
// Neither is called while a queue runs.
type DeviceState interface {
	SaveState(w io.Writer) error
	LoadState(r io.Reader) error
}

// Backend is one device's backend, serving one front-end connection.
type Backend struct {
	cfg  Config
	conn *net.UnixConn
	log  *slog.Logger

	features, protocol uint64
	owned              bool

	memMu sync.RWMutex // held for reading while a queue handles requests
	mem   *Memory
	dlog  *dirtyLog // the dirty log, once the front-end sent one

	// logAll is VHOST_F_LOG_ALL as last set: mark what the device writes.
	logAll atomic.Bool

	// xfer is the device-state transfer under way (SET_DEVICE_STATE_FD),
	// its result read by CHECK_DEVICE_STATE.
	xfer *transfer

	queues []*queue

	failOnce sync.Once
	failErr  error
}

type queue struct {
	b     *Backend
	index int

	num                     uint16
	base                    uint16
	descUA, usedUA, availUA uint64
	addrSet                 bool
	enabled                 bool
	logUsed                 bool   // VHOST_VRING_F_LOG
	logAddr                 uint64 // the used ring's address in the dirty log

	kick, err int // -1 when unset

	callMu sync.Mutex
	call   int

	// while running
	ring *ring
	stop int // eventfd that tells the worker to stop
	done chan struct{}

	// One worker pops requests at a time; a request it holds (Chain.Hold)
	// is answered by that goroutine while another worker goes on.
	holdMu   sync.Mutex
	handling *Chain     // the chain a worker is in Handle with, if any
	pushMu   sync.Mutex // the used ring: workers and held requests push
	// stopping is set while halt waits: the worker takes no further
	// request once the one it is handling is answered, however many the
	// guest keeps posting.
	stopping atomic.Bool
}

// Serve runs the protocol on conn until the front-end hangs up (nil), a
// message or ring is malformed, or ctx ends. It closes conn and stops the
// queues before returning.
func Serve(ctx context.Context, conn *net.UnixConn, cfg Config) error {
	if cfg.Queues < 1 || cfg.Queues > 64 {
		return fmt.Errorf("vhostuser: %d queues: want 1..64", cfg.Queues)
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	b := &Backend{cfg: cfg, conn: conn, log: cfg.Log}
	for i := range cfg.Queues {
		b.queues = append(b.queues, &queue{b: b, index: i, kick: -1, err: -1, call: -1, stop: -1})
	}
	stop := context.AfterFunc(ctx, func() { b.fail(ctx.Err()) })
	defer stop()
	err := b.loop()
	b.fail(err)
	for _, q := range b.queues {
		q.halt()
		q.closeFDs()
	}
	b.endTransfer()
	b.memMu.Lock()
	b.mem.unmap()
	b.mem = nil
	b.dlog.unmap()
	b.dlog = nil
	b.memMu.Unlock()
	if errors.Is(b.failErr, io.EOF) {
		return nil
	}
	return b.failErr
}

// fail records the first error and closes the connection, which ends
// Serve's loop.
func (b *Backend) fail(err error) {
	if err == nil {
		err = io.EOF
	}
	b.failOnce.Do(func() {
		b.failErr = err
		b.conn.Close()
	})
}

func (b *Backend) loop() error {
	hdr := make([]byte, headerSize)
	oob := make([]byte, unix.CmsgSpace(maxFDs*4))
	payload := make([]byte, maxPayload)
	for {
		n, oobn, _, _, err := b.conn.ReadMsgUnix(hdr, oob)
		if err != nil || n == 0 {
			if err == nil || errors.Is(err, net.ErrClosed) {
				return io.EOF
			}
			return fmt.Errorf("vhostuser: read: %w", err)
		}
		fds, ferr := parseFDs(oob[:oobn])
		if n < headerSize {
			if _, err := io.ReadFull(b.conn, hdr[n:]); err != nil {
				closeAll(fds)
				return io.EOF
			}
		}
		req := binary.LittleEndian.Uint32(hdr[0:4])
		flags := binary.LittleEndian.Uint32(hdr[4:8])
		size := binary.LittleEndian.Uint32(hdr[8:12])
		if ferr != nil {
			closeAll(fds)
			return ferr
		}
		if flags&0x3 != flagVersion {
			closeAll(fds)
			return malformed("message %d: version %d", req, flags&3)
		}
		if size > maxPayload {
			closeAll(fds)
			return malformed("message %d: %d bytes", req, size)
		}
		body := payload[:size]
		if _, err := io.ReadFull(b.conn, body); err != nil {
			closeAll(fds)
			return io.EOF
		}
		reply, hasReply, err := b.handle(req, body, fds)
		if err != nil {
			return fmt.Errorf("vhostuser: message %d: %w", req, err)
		}
		switch {
		case hasReply:
			if err := b.send(req, reply); err != nil {
				return err
			}
		case flags&flagNeedReply != 0 && b.protocol&ProtocolReplyAck != 0:
			if err := b.send(req, u64(0)); err != nil {
				return err
			}
		}
	}
}

func (b *Backend) send(req uint32, body []byte) error {
	msg := make([]byte, headerSize+len(body))
	binary.LittleEndian.PutUint32(msg[0:4], req)
	binary.LittleEndian.PutUint32(msg[4:8], flagVersion|flagReply)
	binary.LittleEndian.PutUint32(msg[8:12], uint32(len(body)))
	copy(msg[headerSize:], body)
	if _, err := b.conn.Write(msg); err != nil {
		return fmt.Errorf("vhostuser: reply %d: %w", req, err)
	}
	return nil
}

func u64(v uint64) []byte { return binary.LittleEndian.AppendUint64(nil, v) }

func parseFDs(oob []byte) ([]int, error) {
	if len(oob) == 0 {
		return nil, nil
	}
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return nil, malformed("control message: %v", err)
	}
	var fds []int
	for _, m := range msgs {
		if m.Header.Level != unix.SOL_SOCKET || m.Header.Type != unix.SCM_RIGHTS {
			continue
		}
		f, err := unix.ParseUnixRights(&m)
		if err != nil {
			closeAll(fds)
			return nil, malformed("control message: %v", err)
		}
		fds = append(fds, f...)
	}
	return fds, nil
}

func closeAll(fds []int) {
	for _, fd := range fds {
		unix.Close(fd)
	}
}

// offered are the virtio feature bits this backend offers.
func (b *Backend) offered() uint64 {
	return b.cfg.Features | FeatureVersion1 | FeatureProtocolFeatures | FeatureLogAll
}

// offeredProtocol are the protocol features: the dirty log always, device
// state when the device has some to move.
func (b *Backend) offeredProtocol() uint64 {
	p := uint64(ProtocolMQ | ProtocolReplyAck | ProtocolLogShmfd)
	if b.cfg.State != nil {
		p |= ProtocolDeviceState
	}
	if b.cfg.Features&FeatureAccessPlatform != 0 {
		p |= ProtocolBackendReq
	}
	return p
}

// handle serves one message. It owns fds: every descriptor it does not
// keep is closed.
func (b *Backend) handle(req uint32, body []byte, fds []int) (reply []byte, hasReply bool, err error) {
	keep := 0 // fds taken over
	defer func() { closeAll(fds[keep:]) }()
	need := func(n int) error {
		if len(body) < n {
			return malformed("%d bytes, want %d", len(body), n)
		}
		return nil
	}
	switch req {
	case reqGetFeatures:
		return u64(b.offered()), true, nil
	case reqSetFeatures:
		if err := need(8); err != nil {
			return nil, false, err
		}
		f := binary.LittleEndian.Uint64(body)
		if f&^b.offered() != 0 {
			return nil, false, malformed("features %#x not offered", f&^b.offered())
		}
		b.features = f
		b.logAll.Store(f&FeatureLogAll != 0)
		return nil, false, nil
	case reqGetProtocolFeatures:
		return u64(b.offeredProtocol()), true, nil
	case reqSetProtocolFeatures:
		if err := need(8); err != nil {
			return nil, false, err
		}
		f := binary.LittleEndian.Uint64(body)
		if f&^b.offeredProtocol() != 0 {
			return nil, false, malformed("protocol features %#x not offered", f&^b.offeredProtocol())
		}
		b.protocol = f
		return nil, false, nil
	case reqGetQueueNum:
		return u64(uint64(b.cfg.Queues)), true, nil
	case reqSetOwner:
		b.owned = true
		return nil, false, nil
	case reqResetOwner:
		return nil, false, nil
	case reqSetMemTable:
		keep = len(fds)
		return nil, false, b.setMemTable(body, fds)
	case reqSetVringNum, reqSetVringBase, reqSetVringEnable, reqGetVringBase:
		if err := need(8); err != nil {
			return nil, false, err
		}
		q, err := b.queue(binary.LittleEndian.Uint32(body[0:4]))
		if err != nil {
			return nil, false, err
		}
		v := binary.LittleEndian.Uint32(body[4:8])
		switch req {
		case reqSetVringNum:
			if q.running() {
				return nil, false, malformed("queue %d: size changed while running", q.index)
			}
			if v == 0 || v&(v-1) != 0 || v > MaxQueueSize {
				return nil, false, malformed("queue %d: size %d", q.index, v)
			}
			q.num = uint16(v)
		case reqSetVringBase:
			if q.running() {
				return nil, false, malformed("queue %d: base changed while running", q.index)
			}
			if v > 0xffff {
				return nil, false, malformed("queue %d: base %d", q.index, v)
			}
			q.base = uint16(v)
		case reqSetVringEnable:
			q.enabled = v != 0
			if !q.enabled {
				q.halt()
				return nil, false, nil
			}
			return nil, false, b.maybeStart(q)
		case reqGetVringBase:
			q.halt()
			q.closeKick()
			out := make([]byte, 8)
			binary.LittleEndian.PutUint32(out[0:4], uint32(q.index))
			binary.LittleEndian.PutUint32(out[4:8], uint32(q.base))
			return out, true, nil
		}
		return nil, false, nil
	case reqSetVringAddr:
		if err := need(40); err != nil {
			return nil, false, err
		}
		q, err := b.queue(binary.LittleEndian.Uint32(body[0:4]))
		if err != nil {
			return nil, false, err
		}
		flags := binary.LittleEndian.Uint32(body[4:8])
		desc, used, avail := binary.LittleEndian.Uint64(body[8:16]), binary.LittleEndian.Uint64(body[16:24]), binary.LittleEndian.Uint64(body[24:32])
		logUsed, logAddr := flags&vringFLog != 0, binary.LittleEndian.Uint64(body[32:40])
		if q.running() && (desc != q.descUA || used != q.usedUA || avail != q.availUA) {
			return nil, false, malformed("queue %d: address changed while running", q.index)
		}
		// The front-end turns logging of a running queue's used ring on
		// and off with the same addresses (a live migration starts).
		b.memMu.Lock()
		q.descUA, q.usedUA, q.availUA = desc, used, avail
		q.logUsed, q.logAddr = logUsed, logAddr
		if q.ring != nil {
			q.ring.logUsed, q.ring.logAddr = logUsed, logAddr
		}
		b.memMu.Unlock()
		q.addrSet = true
		return nil, false, nil
	case reqSetVringKick, reqSetVringCall, reqSetVringErr:
		if err := need(8); err != nil {
			return nil, false, err
		}
		v := binary.LittleEndian.Uint64(body)
		q, err := b.queue(uint32(v & 0xff))
		if err != nil {
			return nil, false, err
		}
		fd := -1
		if v&0x100 == 0 {
			if len(fds) != 1 {
				return nil, false, malformed("queue %d: %d descriptors, want 1", q.index, len(fds))
			}
			fd, keep = fds[0], 1
		} else if req == reqSetVringKick {
			return nil, false, malformed("queue %d: polling without a kick descriptor is not supported", q.index)
		}
		switch req {
		case reqSetVringKick:
			q.halt()
			q.closeKick()
			q.kick = fd
			return nil, false, b.maybeStart(q)
		case reqSetVringCall:
			q.callMu.Lock()
			if q.call >= 0 {
				unix.Close(q.call)
			}
			q.call = fd
			q.callMu.Unlock()
		case reqSetVringErr:
			if q.err >= 0 {
				unix.Close(q.err)
			}
			q.err = fd
		}
		return nil, false, nil
	case reqSetLogBase:
		if b.protocol&ProtocolLogShmfd == 0 {
			return nil, false, malformed("log base without LOG_SHMFD")
		}
		if len(fds) != 1 {
			return nil, false, malformed("log base with %d descriptors, want 1", len(fds))
		}
		l, err := mapLog(fds[0], body)
		if err != nil {
			return nil, false, err
		}
		b.memMu.Lock()
		old := b.dlog
		b.dlog = l
		b.memMu.Unlock()
		old.unmap()
		b.log.Info("vhost-user dirty log set: a live migration", "bytes", l.size)
		// QEMU waits for a reply naming this request.
		return append([]byte(nil), body[:16]...), true, nil
	case reqSetLogFD:
		// An eventfd to say the log changed: QEMU reads the log when it
		// syncs, so it is not needed; closed by the deferred closeAll.
		return nil, false, nil
	case reqSetDeviceStateFD:
		if b.protocol&ProtocolDeviceState == 0 || b.cfg.State == nil {
			return nil, false, malformed("device state transfer without DEVICE_STATE")
		}
		if err := need(8); err != nil {
			return nil, false, err
		}
		if len(fds) != 1 {
			return nil, false, malformed("device state transfer with %d descriptors, want 1", len(fds))
		}
		keep = 1
		return u64(b.startTransfer(binary.LittleEndian.Uint32(body[0:4]), binary.LittleEndian.Uint32(body[4:8]), fds[0])), true, nil
	case reqCheckDeviceState:
		if b.protocol&ProtocolDeviceState == 0 || b.cfg.State == nil {
			return nil, false, malformed("device state check without DEVICE_STATE")
		}
		if err := b.checkTransfer(); err != nil {
			b.log.Warn("vhost-user device state transfer failed", "err", err)
			return u64(1), true, nil
		}
		return u64(0), true, nil
	case reqSetBackendReqFD:
		if b.offeredProtocol()&ProtocolBackendReq == 0 {
			return nil, false, malformed("the backend request channel was not offered")
		}
		return nil, false, nil // unused: the deferred close drops it
	}
	return nil, false, malformed("request %d is not supported", req)
}

func (b *Backend) queue(i uint32) (*queue, error) {
	if i >= uint32(len(b.queues)) {
		return nil, malformed("queue %d of %d", i, len(b.queues))
	}
	return b.queues[i], nil
}

// setMemTable replaces guest memory. Queues keep running: their rings are
// resolved again in the new table while no request is being handled.
func (b *Backend) setMemTable(body []byte, fds []int) error {
	defer closeAll(fds) // a mapping outlives its descriptor
	if len(body) < 8 {
		return malformed("memory table of %d bytes", len(body))
	}
	n := binary.LittleEndian.Uint32(body[0:4])
	if n == 0 || n > maxRegions || len(body) < 8+32*int(n) {
		return malformed("memory table: %d regions in %d bytes", n, len(body))
	}
	if len(fds) != int(n) {
		return malformed("memory table: %d regions, %d descriptors", n, len(fds))
	}
	if b.cfg.FrontEndPID != nil {
		pid := b.cfg.FrontEndPID()
		if pid <= 0 {
			return malformed("memory table before the front-end's process is known")
		}
		for i := range int(n) {
			r := body[8+32*i : 8+32*i+32]
			if err := CheckSharedMapping(pid, binary.LittleEndian.Uint64(r[16:24]), binary.LittleEndian.Uint64(r[8:16])); err != nil {
				return err
			}
		}
	}
	var regions []Region
	unmapAll := func() {
		(&Memory{regions: regions}).unmap()
	}
	for i := range int(n) {
		r := body[8+32*i : 8+32*i+32]
		reg, err := mapRegion(fds[i], binary.LittleEndian.Uint64(r[0:8]), binary.LittleEndian.Uint64(r[8:16]),
			binary.LittleEndian.Uint64(r[16:24]), binary.LittleEndian.Uint64(r[24:32]))
		if err != nil {
			unmapAll()
			return err
		}
		regions = append(regions, reg)
	}
	mem, err := NewMemory(regions)
	if err != nil {
		unmapAll()
		return err
	}
	b.memMu.Lock()
	defer b.memMu.Unlock()
	for _, q := range b.queues {
		if q.ring == nil {
			continue
		}
		r, err := q.resolve(mem)
		if err != nil {
			mem.unmap()
			return err
		}
		r.lastAvail, r.usedIdx = q.ring.lastAvail, q.ring.usedIdx
		q.ring = r
	}
	old := b.mem
	b.mem = mem
	old.unmap()
	return nil
}

func (q *queue) running() bool { return q.done != nil }

func (q *queue) resolve(mem *Memory) (*ring, error) {
	n := uint64(q.num)
	desc, err := mem.user(q.descUA, n*descSize)
	if err != nil {
		return nil, err
	}
	avail, err := mem.user(q.availUA, 6+2*n)
	if err != nil {
		return nil, err
	}
	used, err := mem.user(q.usedUA, 6+8*n)
	if err != nil {
		return nil, err
	}
	r, err := newRing(mem, q.num, desc, avail, used, q.base)
	if err != nil {
		return nil, err
	}
	r.logUsed, r.logAddr = q.logUsed, q.logAddr
	return r, nil
}

// maybeStart starts q's worker once it has a kick descriptor and is
// enabled (rings start disabled when PROTOCOL_FEATURES is negotiated).
func (b *Backend) maybeStart(q *queue) error {
	enabled := q.enabled || b.features&FeatureProtocolFeatures == 0
	if q.running() || q.kick < 0 || !enabled {
		return nil
	}
	if !q.addrSet || q.num == 0 {
		return malformed("queue %d started without its size and addresses", q.index)
	}
	b.memMu.Lock()
	if b.mem == nil {
		b.memMu.Unlock()
		return malformed("queue %d started before the memory table", q.index)
	}
	r, err := q.resolve(b.mem)
	if err == nil {
		q.ring = r
	}
	b.memMu.Unlock()
	if err != nil {
		return err
	}
	stop, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		return fmt.Errorf("vhostuser: eventfd: %w", err)
	}
	q.stop, q.done = stop, make(chan struct{})
	go q.work()
	return nil
}

// halt stops q's worker after the request it is handling and records where
// the queue stands in q.base (what GET_VRING_BASE answers). Requests the
// guest posted and the worker had not taken stay in the ring, for the
// queue's restart (or the destination of a migration) to serve.
func (q *queue) halt() {
	if !q.running() {
		return
	}
	q.stopping.Store(true)
	defer q.stopping.Store(false)
	unix.Write(q.stop, []byte{1, 0, 0, 0, 0, 0, 0, 0})
	<-q.done
	unix.Close(q.stop)
	q.b.memMu.Lock()
	q.base = q.ring.lastAvail
	q.ring = nil
	q.b.memMu.Unlock()
	q.stop, q.done = -1, nil
}

func (q *queue) closeKick() {
	if q.kick >= 0 {
		unix.Close(q.kick)
		q.kick = -1
	}
}

func (q *queue) closeFDs() {
	q.closeKick()
	if q.err >= 0 {
		unix.Close(q.err)
		q.err = -1
	}
	q.callMu.Lock()
	if q.call >= 0 {
		unix.Close(q.call)
		q.call = -1
	}
	q.callMu.Unlock()
}

// work waits for kicks and serves the queue until halted. A malformed
// ring, a handler error or a fault on guest memory (the front-end shrank
// a region's file) ends the device.
//
// A worker whose request was held (Chain.Hold) ends after answering it;
// the worker Hold started carries on, and closes done when it stops.
func (q *queue) work() {
	detached := false
	defer func() {
		if !detached {
			close(q.done)
		}
	}()
	debug.SetPanicOnFault(true)
	defer func() {
		if r := recover(); r != nil {
			q.fail(fmt.Errorf("%w: queue %d: fault on guest memory: %v", ErrMalformed, q.index, r))
		}
	}()
	c := Chain{q: q}
	buf := make([]byte, 8)
	pfd := []unix.PollFd{{Fd: int32(q.kick), Events: unix.POLLIN}, {Fd: int32(q.stop), Events: unix.POLLIN}}
	for {
		// Serve what is already there first: a kick may have come before
		// the worker started (a restart after GET_VRING_BASE, or a hold).
		var err error
		if detached, err = q.serve(&c); err != nil {
			q.fail(err)
			return
		}
		if detached {
			return
		}
		pfd[0].Revents, pfd[1].Revents = 0, 0
		if _, err := unix.Poll(pfd, -1); err != nil {
			if err == unix.EINTR {
				continue
			}
			q.fail(fmt.Errorf("vhostuser: queue %d: poll: %w", q.index, err))
			return
		}
		if pfd[1].Revents != 0 {
			return
		}
		if pfd[0].Revents&unix.POLLIN != 0 {
			unix.Read(q.kick, buf)
		} else if pfd[0].Revents != 0 {
			q.fail(fmt.Errorf("vhostuser: queue %d: kick descriptor closed", q.index))
			return
		}
	}
}

func (q *queue) fail(err error) {
	q.b.log.Warn("vhost-user device ended", "queue", q.index, "err", err)
	if q.err >= 0 {
		unix.Write(q.err, []byte{1, 0, 0, 0, 0, 0, 0, 0})
	}
	q.b.fail(err)
}

// serve handles every pending request, then signals the guest once. It
// reports detached when the request it handled last was held: the
// caller is then no longer the queue's worker.
func (q *queue) serve(c *Chain) (detached bool, err error) {
	served, detached, err := q.serveLocked(c)
	if served {
		q.signal()
	}
	return detached, err
}

// serveLocked holds the memory table for reading while it serves (a
// fault on guest memory unwinds through it, so the unlock is deferred).
func (q *queue) serveLocked(c *Chain) (signal, detached bool, err error) {
	q.b.memMu.RLock()
	defer q.b.memMu.RUnlock()
	served := false
	for !q.stopping.Load() {
		var got *Chain
		if got, err = q.ring.pop(c); err != nil || got == nil {
			break
		}
		q.holdMu.Lock()
		got.held, q.handling = false, got
		q.holdMu.Unlock()
		var n uint32
		n, err = q.b.cfg.Handler.Handle(q.index, got)
		q.holdMu.Lock()
		if q.handling == got {
			q.handling = nil
		}
		detached = got.held
		q.holdMu.Unlock()
		if err != nil {
			break
		}
		if int(n) > got.WritableLen() {
			err = fmt.Errorf("vhostuser: queue %d: handler wrote %d bytes into %d", q.index, n, got.WritableLen())
			break
		}
		var log *dirtyLog
		if q.b.logAll.Load() {
			log = q.b.dlog
		}
		q.pushMu.Lock()
		if log != nil {
			// What the handler wrote (the reply, read data) is marked
			// before the used entry that hands it to the guest.
			err = log.markWritten(got.written, uint64(n))
		}
		if err == nil {
			err = q.ring.push(got.Head, n, log)
		}
		q.pushMu.Unlock()
		if err != nil {
			break
		}
		served = true
		if detached {
			break
		}
	}
	return served && q.ring.wantsInterrupt(), detached, err
}

func (q *queue) signal() {
	q.callMu.Lock()
	defer q.callMu.Unlock()
	if q.call >= 0 {
		unix.Write(q.call, []byte{1, 0, 0, 0, 0, 0, 0, 0})
	}
}
