package vhostuser

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// Device state transfer (vhost-user.rst, "Migrating back-end state"): with
// the device stopped, the front-end hands over one end of a pipe; the
// backend writes its state into it and closes it (save) or reads it to the
// end (load), while the front-end carries the bytes in its own migration
// stream. CHECK_DEVICE_STATE then asks whether it worked.

const (
	transferSave = 0 // VHOST_TRANSFER_STATE_DIRECTION_SAVE
	transferLoad = 1 // VHOST_TRANSFER_STATE_DIRECTION_LOAD

	phaseStopped = 0 // VHOST_TRANSFER_STATE_PHASE_STOPPED

	// transferNoFD is the reply flag saying the backend keeps the
	// front-end's channel (returns no descriptor of its own).
	transferNoFD = 0x100
)

// transferTimeout bounds how long CHECK_DEVICE_STATE waits for a transfer
// whose other end is stuck (the front-end closes its end before asking).
const transferTimeout = 2 * time.Minute

type transfer struct {
	f    *os.File
	done chan error
}

// startTransfer begins a save or load on fd (owned from here) and returns
// SET_DEVICE_STATE_FD's answer: transferNoFD, plus a non-zero low byte if
// it is refused.
func (b *Backend) startTransfer(direction, phase uint32, fd int) uint64 {
	// Non-blocking, so that the runtime's poller owns it and a Close (a
	// check that timed out, the connection ending) interrupts a transfer
	// stuck on a front-end that stopped reading or writing.
	unix.SetNonblock(fd, true)
	f := os.NewFile(uintptr(fd), "device-state")
	b.endTransfer()
	refuse := func(why string) uint64 {
		f.Close()
		b.log.Warn("vhost-user device state transfer refused", "why", why)
		b.xfer = &transfer{done: make(chan error, 1)}
		b.xfer.done <- errors.New(why)
		return transferNoFD | 1
	}
	if phase != phaseStopped {
		return refuse(fmt.Sprintf("phase %d: only a stopped device moves its state", phase))
	}
	if direction != transferSave && direction != transferLoad {
		return refuse(fmt.Sprintf("direction %d", direction))
	}
	for _, q := range b.queues {
		if q.running() {
			return refuse(fmt.Sprintf("queue %d is running", q.index))
		}
	}
	t := &transfer{f: f, done: make(chan error, 1)}
	b.xfer = t
	// The front-end reads (or writes) the other end only after this
	// message's reply: the transfer runs beside the message loop.
	go func() {
		var err error
		if direction == transferSave {
			err = b.cfg.State.SaveState(f)
		} else {
			err = b.cfg.State.LoadState(f)
		}
		if cerr := f.Close(); err == nil && !errors.Is(cerr, os.ErrClosed) {
			err = cerr
		}
		t.done <- err
	}()
	return transferNoFD
}

// checkTransfer waits for the transfer under way and returns its error.
func (b *Backend) checkTransfer() error {
	t := b.xfer
	if t == nil {
		return errors.New("no device state transfer")
	}
	b.xfer = nil
	select {
	case err := <-t.done:
		return err
	case <-time.After(transferTimeout):
		t.f.Close() // unblocks the transfer
		<-t.done
		return errors.New("device state transfer timed out")
	}
}

// endTransfer abandons a transfer nobody checked.
func (b *Backend) endTransfer() {
	if t := b.xfer; t != nil {
		b.xfer = nil
		if t.f != nil {
			t.f.Close()
		}
		<-t.done
	}
}

// CheckSharedMapping says whether process pid maps [addr, addr+n) shared
// (an 's' in /proc/PID/maps) and writable. QEMU hands a vhost-user
// backend the descriptor behind guest RAM whether it maps it shared or
// private; with a private mapping, the guest's writes stay in QEMU's copy
// and the backend reads stale requests, silently. A backend that checks
// refuses such a table instead.
func CheckSharedMapping(pid int, addr, n uint64) error {
	f, err := os.Open("/proc/" + strconv.Itoa(pid) + "/maps")
	if err != nil {
		return fmt.Errorf("vhostuser: front-end mappings: %w", err)
	}
	defer f.Close()
	end := addr + n
	cur := addr
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 0, 4096), 1<<16)
	// Lines are sorted by address: walk them while they cover cur.
	for sc.Scan() && cur < end {
		fields := strings.Fields(sc.Text())
		if len(fields) < 2 {
			continue
		}
		lo, hi, ok := strings.Cut(fields[0], "-")
		if !ok {
			continue
		}
		start, err1 := strconv.ParseUint(lo, 16, 64)
		stop, err2 := strconv.ParseUint(hi, 16, 64)
		if err1 != nil || err2 != nil || stop <= cur {
			continue
		}
		if start > cur {
			break
		}
		perm := fields[1]
		if len(perm) < 4 || perm[3] != 's' || perm[1] != 'w' {
			return malformed("guest memory at %#x is mapped %q by the front-end (pid %d), not shared and writable: give the VM shared RAM (memory-backend-memfd,share=on)", cur, perm, pid)
		}
		cur = stop
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("vhostuser: front-end mappings: %w", err)
	}
	if cur < end {
		return malformed("guest memory at %#x is not mapped by the front-end (pid %d)", cur, pid)
	}
	return nil
}
