package api

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"net/http"
	"sync"
	"time"

	"github.com/spacesandbox/space/internal/auth"
	"github.com/spacesandbox/space/internal/edge"
	"github.com/spacesandbox/space/internal/errdefs"
	"github.com/spacesandbox/space/internal/lifecycle"
	"github.com/spacesandbox/space/internal/sandbox"
	"github.com/spacesandbox/space/internal/store"
)

// IdempotencyTTL is how long a key's response is kept (api.md: ≥ 24 h).
const IdempotencyTTL = 24 * time.Hour

// HeaderIdempotencyKey and HeaderReplayed are the idempotency headers.
const (
	HeaderIdempotencyKey = "Idempotency-Key"
	HeaderReplayed       = "Idempotent-Replayed"
)

// response is what a mutating handler answers.
type response struct {
	status   int
	body     []byte
	location string
	// stored, when set, is the body kept for replays instead of body (a
	// response that carries a secret keeps it out of the database).
	stored []byte
}

// idem is one idempotent request in progress. A handler that changes state
// in a store transaction passes render() to the engine so the key is
// completed in that same transaction; otherwise the key is completed after
// the handler returns.
type idem struct {
	key string
	// rec, when set, is the key's record reserved in this process's
	// memory (idempotency.alone): the completion inserts it.
	rec *store.IdempotencyRecord
	// completed is set when the response was stored with the change.
	completed bool
	resp      response
}

// render returns a lifecycle.Render storing the response built by build
// (from the records as committed) under this request's key.
func (i *idem) render(status int, location func(*sandbox.Sandbox, *sandbox.Operation) string, build func(*sandbox.Sandbox, *sandbox.Operation) any) lifecycle.Render {
	if i == nil || i.key == "" {
		return nil
	}
	return func(sb *sandbox.Sandbox, op *sandbox.Operation) *store.Completion {
		loc := location(sb, op)
		return &store.Completion{Key: i.key, Status: status, Location: loc, New: i.rec, Body: func() ([]byte, error) {
			b, err := edge.Marshal(build(sb, op))
			if err == nil {
				i.completed = true
				i.resp = response{status: status, body: b, location: loc}
			}
			return b, err
		}}
	}
}

// idempotency coordinates keys in the store with waiters in this process.
type idempotency struct {
	store store.Idempotency
	owner string // this process's boot id
	now   func() time.Time
	// alive says whether another process holding a reservation still runs
	// (a cluster's member); nil: no other process shares the store.
	alive func(ctx context.Context, owner string) bool
	// alone: no other process uses the store, and every plane of this
	// process shares this value. A key is then reserved in memory and
	// written once, with its outcome — one store commit (a device flush
	// with SQLite) per request instead of two. A crash loses nothing this
	// way that a reservation in the store kept: the restarted server drops
	// the reservations of the process that died (PruneIdempotencyKeys),
	// and a change that commits completes its key in the same transaction.
	alone bool

	mu      sync.Mutex // guards waiters
	waiters map[string]chan struct{}
}

func newIdempotency(s store.Idempotency, owner string) *idempotency {
	return &idempotency{store: s, owner: owner, now: func() time.Time { return time.Now().UTC() }, waiters: map[string]chan struct{}{}}
}

// Keys is the idempotency of a server that no other process shares its
// store with: its control and data planes are given the same Keys, so a
// key is held once whichever plane it came to, and each is reserved in
// memory rather than in the store.
type Keys struct{ m *idempotency }

// NewKeys returns the Keys of a lone server whose boot id is owner.
func NewKeys(s store.Idempotency, owner string) *Keys {
	m := newIdempotency(s, owner)
	m.alone = true
	return &Keys{m: m}
}

// keysOr is the idempotency a plane uses: k's, or one of its own that
// reserves keys in the store.
func keysOr(k *Keys, s store.Idempotency, owner string) *idempotency {
	if k != nil {
		return k.m
	}
	return newIdempotency(s, owner)
}

func fingerprint(r *http.Request, body []byte) string {
	h := sha256.New()
	h.Write([]byte(r.Method + "\n" + r.URL.EscapedPath() + "\n" + r.URL.RawQuery + "\n"))
	h.Write(body)
	return hex.EncodeToString(h.Sum(nil))
}

func validKey(k string) bool {
	if len(k) == 0 || len(k) > 255 {
		return false
	}
	for i := 0; i < len(k); i++ {
		if k[i] < 0x21 || k[i] > 0x7e {
			return false
		}
	}
	return true
}

// scopedKey makes keys per project: another project's key is another key.
// The default project's keys are stored as they come (as before projects);
// others' are prefixed with the project and a space, which no key contains.
func scopedKey(ctx context.Context, key string) string {
	if p := auth.Project(ctx); p != store.DefaultProject {
		return p + " " + key
	}
	return key
}

// do runs handler at most once per key. A request with no key just runs.
// With a key: a finished earlier request with the same method, path and body
// is replayed; one still in flight is waited for and then replayed; a
// different request with the same key is refused with 422.
func (m *idempotency) do(w http.ResponseWriter, r *http.Request, body []byte, handler func(*idem) (response, error)) (response, bool, error) {
	key := r.Header.Get(HeaderIdempotencyKey)
	if key == "" {
		resp, err := handler(nil)
		return resp, false, err
	}
	if !validKey(key) {
		return response{}, false, errdefs.New(errdefs.InvalidArgument, "Idempotency-Key must be 1 to 255 visible ASCII characters")
	}
	key = scopedKey(r.Context(), key)
	fp := fingerprint(r, body)
	if m.alone {
		return m.doAlone(r.Context(), key, fp, handler)
	}
	for {
		now := m.now()
		rec, reserved, err := m.store.ReserveIdempotencyKey(r.Context(), store.IdempotencyRecord{
			Key: key, Fingerprint: fp, Owner: m.owner, CreatedAt: now, ExpiresAt: now.Add(IdempotencyTTL),
		})
		if err != nil {
			return response{}, false, err
		}
		if !reserved {
			if rec.Fingerprint != fp {
				return response{}, false, errdefs.New(errdefs.IdempotencyKeyReused, "Idempotency-Key was already used for a different request")
			}
			if rec.State == store.IdemDone {
				return response{status: rec.Status, body: rec.Body, location: rec.Location}, true, nil
			}
			if m.alive != nil && rec.Owner != m.owner && !m.alive(r.Context(), rec.Owner) {
				// Its process died before the change committed (a change
				// completes the key in its own transaction): this request
				// runs it, once.
				took, err := m.store.TakeOverIdempotencyKey(r.Context(), key, rec.Owner, m.owner)
				if err != nil {
					return response{}, false, err
				}
				if took {
					return m.run(r.Context(), key, m.hold(key), nil, handler)
				}
				continue
			}
			if err := m.wait(r.Context(), key); err != nil {
				return response{}, false, err
			}
			continue // done, or released for a retry: look again
		}
		return m.run(r.Context(), key, m.hold(key), nil, handler)
	}
}

// doAlone is do for a lone server: the key is held in memory while the
// handler runs, and the store is read, not written, before it runs.
func (m *idempotency) doAlone(ctx context.Context, key, fp string, handler func(*idem) (response, error)) (response, bool, error) {
	for {
		m.mu.Lock()
		held := m.waiters[key]
		if held == nil {
			held = make(chan struct{})
			m.waiters[key] = held
			m.mu.Unlock()
			break
		}
		m.mu.Unlock()
		select {
		case <-held:
		case <-ctx.Done():
			return response{}, false, errdefs.New(errdefs.Conflict, "a request with this Idempotency-Key is still in progress")
		}
	}
	release := m.unhold(key)
	now := m.now()
	rec, err := m.store.GetIdempotencyKey(ctx, key)
	switch {
	case errors.Is(err, errdefs.NotFound) || err == nil && rec.State == store.IdemDone && !rec.ExpiresAt.After(now):
		// New (or expired): this request runs.
		return m.run(ctx, key, release, &store.IdempotencyRecord{Key: key, Fingerprint: fp, Owner: m.owner, CreatedAt: now, ExpiresAt: now.Add(IdempotencyTTL)}, handler)
	case err != nil:
		release()
		return response{}, false, err
	}
	release()
	if rec.Fingerprint != fp {
		return response{}, false, errdefs.New(errdefs.IdempotencyKeyReused, "Idempotency-Key was already used for a different request")
	}
	if rec.State == store.IdemDone {
		return response{status: rec.Status, body: rec.Body, location: rec.Location}, true, nil
	}
	// In flight in the store: left by a process that shared it (the server
	// before a restart prunes those). Not this request's to run.
	return response{}, false, errdefs.New(errdefs.Conflict, "a request with this Idempotency-Key is still in progress")
}

// hold registers this process as running key's request and returns what
// ends that; others with the key wait (wait) until then.
func (m *idempotency) hold(key string) func() {
	m.mu.Lock()
	m.waiters[key] = make(chan struct{})
	m.mu.Unlock()
	return m.unhold(key)
}

// unhold returns what wakes the waiters of key's request and forgets it.
func (m *idempotency) unhold(key string) func() {
	return func() {
		m.mu.Lock()
		ch := m.waiters[key]
		delete(m.waiters, key)
		m.mu.Unlock()
		close(ch)
	}
}

// run runs the handler of key's request, held until release, and records
// its outcome. rec is the key's record when it was reserved in memory
// (alone), nil when the store holds the reservation.
func (m *idempotency) run(ctx context.Context, key string, release func(), rec *store.IdempotencyRecord, handler func(*idem) (response, error)) (resp response, replayed bool, err error) {
	defer release()
	// The key's fate must be recorded even when the client goes away.
	bg := context.WithoutCancel(ctx)
	i := &idem{key: key, rec: rec}
	resp, err = handler(i)
	if i.completed && err == nil {
		return i.resp, false, nil
	}
	if err != nil {
		status, body := errorResponse(err)
		if !finalError(status) {
			// Nothing was changed (the refusal depends on the moment: a
			// limit, an operation in flight, the sandbox's state), or we
			// cannot tell (5xx): let a retry with this key run again.
			if rec == nil {
				if rerr := m.store.ReleaseIdempotencyKey(bg, key); rerr != nil {
					err = errors.Join(err, rerr)
				}
			}
			return response{}, false, err
		}
		resp = response{status: status, body: body}
	}
	keep := resp.body
	if resp.stored != nil {
		keep = resp.stored
	}
	c := store.Completion{Key: key, Status: resp.status, Location: resp.location, New: rec, Body: func() ([]byte, error) { return keep, nil }}
	if cerr := m.store.CompleteIdempotencyKey(bg, c); cerr != nil {
		return response{}, false, cerr
	}
	return resp, false, nil
}

// finalError reports whether an error answer is a final outcome, stored
// under the key and replayed: only a refusal of the request itself (bad
// input, too large, not found, not allowed) is. Answers that depend on the
// moment — 409 (an operation in flight, a state that does not allow it),
// 429/507 (a limit), 5xx — are not stored, so a client that retries with the
// same key, as it is told to, gets a fresh answer once the moment passes.
func finalError(status int) bool {
	switch status {
	case http.StatusBadRequest, http.StatusForbidden, http.StatusNotFound, http.StatusMethodNotAllowed,
		http.StatusRequestEntityTooLarge, http.StatusUnprocessableEntity:
		return true
	}
	return false
}

// wait blocks until the in-flight request holding key finishes (in this
// process, or — by polling — in another) or ctx ends.
func (m *idempotency) wait(ctx context.Context, key string) error {
	m.mu.Lock()
	ch := m.waiters[key]
	m.mu.Unlock()
	t := time.NewTimer(25 * time.Millisecond)
	defer t.Stop()
	select {
	case <-ch: // nil channel (holder in another process) never fires
	case <-t.C:
	case <-ctx.Done():
		return errdefs.New(errdefs.Conflict, "a request with this Idempotency-Key is still in progress")
	}
	return nil
}

// write sends a response, marking replays.
func writeResponse(w http.ResponseWriter, resp response, replayed bool) {
	if resp.location != "" {
		w.Header().Set("Location", resp.location)
	}
	if replayed {
		w.Header().Set(HeaderReplayed, "true")
	}
	edge.Raw(w, resp.status, resp.body)
}
