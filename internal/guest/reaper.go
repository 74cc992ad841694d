package guest

import (
	"errors"
	"os"
	"os/signal"
	"sync"

	"golang.org/x/sys/unix"
)

// Reaper collects the exit status of child processes and hands each one to
// whoever started that child.
//
// As PID 1 the agent inherits every orphan in the guest and must reap them
// all, so it waits for any child (wait4(-1)). That would steal statuses from
// os/exec, so processes are started through Start, never exec.Cmd.Wait.
// Outside PID 1 (tests on the host) the Reaper waits only for the pids it
// started, leaving the rest of the process's children alone.
//
// A Reaper is safe for concurrent use. There must be at most one Reaper
// with all set per process.
type Reaper struct {
	all bool

	mu      sync.Mutex
	waiters map[int]chan unix.WaitStatus

	sig  chan os.Signal
	done chan struct{}
	once sync.Once
}

// NewReaper starts a reaper. all makes it reap every child (for PID 1).
func NewReaper(all bool) *Reaper {
	r := &Reaper{
		all:     all,
		waiters: map[int]chan unix.WaitStatus{},
		sig:     make(chan os.Signal, 1),
		done:    make(chan struct{}),
	}
	signal.Notify(r.sig, unix.SIGCHLD)
	go r.loop()
	// Children may have exited before SIGCHLD was hooked up.
	r.kick()
	return r
}

// Close stops the reaper. Processes still registered never get a status.
func (r *Reaper) Close() {
	r.once.Do(func() {
		signal.Stop(r.sig)
		close(r.done)
	})
}

// Start runs start, which must create exactly one child process and return
// its pid, and returns a channel that receives that child's wait status.
//
// The reaper's lock is held across start so that a child that exits at once
// cannot be reaped before it is registered.
func (r *Reaper) Start(start func() (int, error)) (int, <-chan unix.WaitStatus, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	pid, err := start()
	if err != nil {
		return 0, nil, err
	}
	ch := make(chan unix.WaitStatus, 1)
	r.waiters[pid] = ch
	return pid, ch, nil
}

func (r *Reaper) kick() {
	select {
	case r.sig <- unix.SIGCHLD:
	default:
	}
}

func (r *Reaper) loop() {
	for {
		select {
		case <-r.done:
			return
		case <-r.sig:
			r.reap()
		}
	}
}

func (r *Reaper) reap() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.all {
		for {
			var ws unix.WaitStatus
			pid, err := unix.Wait4(-1, &ws, unix.WNOHANG, nil)
			if errors.Is(err, unix.EINTR) {
				continue
			}
			if err != nil || pid <= 0 {
				return
			}
			r.deliver(pid, ws)
		}
	}
	for pid := range r.waiters {
		var ws unix.WaitStatus
		got, err := unix.Wait4(pid, &ws, unix.WNOHANG, nil)
		for errors.Is(err, unix.EINTR) {
			got, err = unix.Wait4(pid, &ws, unix.WNOHANG, nil)
		}
		if err != nil || got != pid {
			continue
		}
		r.deliver(pid, ws)
	}
}

// deliver hands a status to its waiter; statuses of orphans nobody started
// are dropped, which is all reaping them needs. Callers hold r.mu.
func (r *Reaper) deliver(pid int, ws unix.WaitStatus) {
	ch, ok := r.waiters[pid]
	if !ok {
		return
	}
	delete(r.waiters, pid)
	ch <- ws
}
