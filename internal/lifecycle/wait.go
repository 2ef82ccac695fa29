package lifecycle

import (
	"context"
	"time"

	"github.com/spacesandbox/space/internal/sandbox"
)

// WaitOperation blocks until an operation is terminal (or ctx ends) and
// returns it. Operations run by this engine wake the waiter as they finish;
// the store is also re-read now and then, so an operation finished elsewhere
// is seen too.
func (e *Engine) WaitOperation(ctx context.Context, id string) (*sandbox.Operation, error) {
	delay := time.Millisecond
	for {
		e.mu.Lock()
		ch := e.finished
		e.mu.Unlock()
		op, err := e.store.GetOperation(ctx, id)
		if err != nil {
			return nil, err
		}
		if op.State.Terminal() {
			return op, nil
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-ch:
		case <-time.After(delay):
			delay = min(delay*2, 250*time.Millisecond)
		}
	}
}

// notifyFinished wakes every WaitOperation.
func (e *Engine) notifyFinished() {
	e.mu.Lock()
	close(e.finished)
	e.finished = make(chan struct{})
	e.mu.Unlock()
}
