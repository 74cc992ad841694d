package cli

import (
	"context"

	"github.com/smx-dev/smx/internal/image"
	"github.com/smx-dev/smx/internal/sandbox"
)

// The helpers below are the names commands used before the service layer
// (internal/service) took the orchestration over; they are thin calls
// into it, kept so that commands written against them still build. New
// code calls e.svc().

func (e *env) manager() *sandbox.Manager { return &sandbox.Manager{State: e.state} }
func (e *env) images() *image.Store      { return &image.Store{Dir: e.state.Images()} }

// create is service.Create with the flags of `smx agent create`.
func (e *env) create(f *createFlags, env []string) (*sandbox.Info, error) {
	req, err := f.request(env)
	if err != nil {
		return nil, err
	}
	sb, err := e.svc().Create(e.ctx, req)
	if err != nil {
		return nil, err
	}
	return &sb.Info, nil
}

// start is service.Start (honouring --cold).
func (e *env) start(ctx context.Context, name string) (*sandbox.Info, error) {
	sb, err := e.startOwned(ctx, name, nil)
	if err != nil {
		return nil, err
	}
	return &sb.Info, nil
}

// runningSandbox returns sandbox name if an exec may run in it, else the
// state table's refusal.
func (e *env) runningSandbox(name string) (*sandbox.Info, error) {
	in, err := e.svc().Inspect(e.ctx, name)
	if err != nil {
		return nil, err
	}
	if _, err := sandbox.Check(in, sandbox.OpExec); err != nil {
		return nil, err
	}
	return in, nil
}
