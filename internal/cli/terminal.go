package cli

import (
	"io"
	"os"
	"os/signal"
	"syscall"

	"golang.org/x/term"

	"github.com/smx-dev/smx/internal/service"
)

// rawTerminal puts stdin's terminal into raw mode when stdin is one and
// follows its size until done is closed: size is its size now, resize
// carries later changes (the newest wins when the reader lags). When stdin
// is not a terminal, size and resize are nil. restore undoes raw mode; call
// it before done is closed or after, either is safe.
func rawTerminal(stdin io.Reader, done <-chan struct{}) (size *service.WindowSize, resize <-chan service.WindowSize, restore func()) {
	restore = func() {}
	fd, isTerm := terminalFd(stdin)
	if !isTerm {
		return nil, nil, restore
	}
	if old, err := term.MakeRaw(fd); err == nil {
		restore = func() { term.Restore(fd, old) }
	}
	if w, h, err := term.GetSize(fd); err == nil {
		size = &service.WindowSize{Rows: uint16(h), Cols: uint16(w)}
	}
	ch := make(chan service.WindowSize, 1)
	winch := make(chan os.Signal, 1)
	signal.Notify(winch, syscall.SIGWINCH)
	go func() {
		defer signal.Stop(winch)
		for {
			select {
			case <-done:
				return
			case <-winch:
			}
			if w, h, err := term.GetSize(fd); err == nil {
				select {
				case ch <- service.WindowSize{Rows: uint16(h), Cols: uint16(w)}:
				default:
				}
			}
		}
	}()
	return size, ch, restore
}
