package lifecycle

import (
	"context"
	"sync"
	"time"

	"github.com/spacesandbox/space/internal/sandbox"
	"github.com/spacesandbox/space/internal/store"
)

// Change names records the engine has just written: a sandbox, an
// operation, or both. Watchers read the records themselves, so a change
// carries no state that could be stale.
type Change struct {
	Sandbox   string
	Operation string
}

// MaxPendingChanges bounds what a watcher that does not read keeps: past
// it, the changes are dropped and Take says so (re-read everything).
const MaxPendingChanges = 10000

// Changes are the records written since a watcher last read, each named
// once however often it changed (coalesced; dropped only past
// MaxPendingChanges, and then Take says so).
type Changes struct {
	mu   sync.Mutex
	set  map[Change]struct{}
	lost bool
	c    chan struct{} // a token when set is not empty
}

// C receives when changes are waiting; Take then returns them.
func (w *Changes) C() <-chan struct{} { return w.c }

// Take returns the changes waiting and forgets them; lost says some were
// dropped since the last Take (the watcher read too slowly), so whatever
// it shows must be read again.
func (w *Changes) Take() (changes []Change, lost bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := make([]Change, 0, len(w.set))
	for c := range w.set {
		out = append(out, c)
	}
	clear(w.set)
	lost, w.lost = w.lost, false
	return out, lost
}

func (w *Changes) add(cs []Change) {
	w.mu.Lock()
	for _, c := range cs {
		if _, named := w.set[c]; !named && len(w.set) >= MaxPendingChanges {
			clear(w.set)
			w.lost = true
		}
		w.set[c] = struct{}{}
	}
	w.mu.Unlock()
	select {
	case w.c <- struct{}{}:
	default:
	}
}

// Hub fans changes out to their watchers. The zero Hub is ready to use.
type Hub struct {
	mu   sync.Mutex
	subs map[*Changes]struct{}
}

// Publish tells every watcher of cs.
func (h *Hub) Publish(cs ...Change) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for w := range h.subs {
		w.add(cs)
	}
}

// Watch returns what is published from now until ctx ends.
func (h *Hub) Watch(ctx context.Context) *Changes {
	w := &Changes{set: map[Change]struct{}{}, c: make(chan struct{}, 1)}
	h.mu.Lock()
	if h.subs == nil {
		h.subs = map[*Changes]struct{}{}
	}
	h.subs[w] = struct{}{}
	h.mu.Unlock()
	context.AfterFunc(ctx, func() {
		h.mu.Lock()
		delete(h.subs, w)
		h.mu.Unlock()
	})
	return w
}

// Watch returns the records this engine writes from now until ctx ends:
// every sandbox and operation it creates or changes (operations it runs,
// pool claims, timeouts, deaths). In a cluster it is this process's own
// writes only: an outcome a node records in the shared store is not here.
func (e *Engine) Watch(ctx context.Context) *Changes { return e.changes.Watch(ctx) }

// watchedStore is the engine's store, telling the hub of every write that
// succeeded. Every write the engine makes goes through it.
type watchedStore struct {
	Store
	hub *Hub
}

func (s watchedStore) CreateSandbox(ctx context.Context, sb *sandbox.Sandbox, op *sandbox.Operation, idem *store.Completion, maxActive int) error {
	err := s.Store.CreateSandbox(ctx, sb, op, idem, maxActive)
	if err == nil {
		s.hub.Publish(Change{Sandbox: sb.ID, Operation: op.ID})
	}
	return err
}

func (s watchedStore) BeginOperation(ctx context.Context, op *sandbox.Operation, decide func(sb *sandbox.Sandbox, op *sandbox.Operation) (*store.Completion, error)) (*sandbox.Sandbox, error) {
	sb, err := s.Store.BeginOperation(ctx, op, decide)
	if err == nil {
		s.hub.Publish(Change{Sandbox: op.SandboxID, Operation: op.ID})
	}
	return sb, err
}

func (s watchedStore) BeginFork(ctx context.Context, op *sandbox.Operation, forks []*sandbox.Sandbox, maxActive int, decide func(sb *sandbox.Sandbox, op *sandbox.Operation) (*store.Completion, error)) (*sandbox.Sandbox, error) {
	sb, err := s.Store.BeginFork(ctx, op, forks, maxActive, decide)
	if err == nil {
		cs := []Change{{Sandbox: op.SandboxID, Operation: op.ID}}
		for _, f := range forks {
			cs = append(cs, Change{Sandbox: f.ID})
		}
		s.hub.Publish(cs...)
	}
	return sb, err
}

func (s watchedStore) BeginSnapshot(ctx context.Context, op *sandbox.Operation, snap *sandbox.Snapshot, decide func(sb *sandbox.Sandbox, op *sandbox.Operation) (*store.Completion, error)) (*sandbox.Sandbox, error) {
	sb, err := s.Store.BeginSnapshot(ctx, op, snap, decide)
	if err == nil {
		s.hub.Publish(Change{Sandbox: op.SandboxID, Operation: op.ID})
	}
	return sb, err
}

func (s watchedStore) CreateOperation(ctx context.Context, op *sandbox.Operation, idem *store.Completion) error {
	err := s.Store.CreateOperation(ctx, op, idem)
	if err == nil {
		s.hub.Publish(Change{Sandbox: op.SandboxID, Operation: op.ID})
	}
	return err
}

func (s watchedStore) UpdateOperationState(ctx context.Context, opID string, state sandbox.OpState, at time.Time) error {
	err := s.Store.UpdateOperationState(ctx, opID, state, at)
	if err == nil {
		s.hub.Publish(Change{Operation: opID})
	}
	return err
}

func (s watchedStore) FinishOperation(ctx context.Context, f store.Finish) error {
	err := s.Store.FinishOperation(ctx, f)
	if err == nil {
		cs := []Change{{Operation: f.OperationID}}
		for _, o := range f.Others {
			cs = append(cs, Change{Sandbox: o.SandboxID})
		}
		s.hub.Publish(cs...)
	}
	return err
}

func (s watchedStore) UpdateSandbox(ctx context.Context, id string, mutate func(sb *sandbox.Sandbox) error) (*sandbox.Sandbox, error) {
	sb, err := s.Store.UpdateSandbox(ctx, id, mutate)
	if err == nil {
		s.hub.Publish(Change{Sandbox: id})
	}
	return sb, err
}

func (s watchedStore) ClaimPoolSandbox(ctx context.Context, pool string, claim func(sb *sandbox.Sandbox) (*sandbox.Operation, *store.Completion, error)) (*sandbox.Sandbox, *sandbox.Operation, error) {
	sb, op, err := s.Store.ClaimPoolSandbox(ctx, pool, claim)
	if err == nil && sb != nil && op != nil {
		s.hub.Publish(Change{Sandbox: sb.ID, Operation: op.ID})
	}
	return sb, op, err
}
