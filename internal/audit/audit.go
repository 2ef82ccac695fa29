// Package audit appends who changed what to the store's audit log. Entries
// are written in batches by one goroutine, so a mutation's response never
// waits for its entry (a server that stops flushes what it holds first; a
// crash loses at most the entries of the last moment).
package audit

import (
	"context"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"github.com/spacesandbox/space/internal/edge"
	"github.com/spacesandbox/space/internal/errdefs"
	"github.com/spacesandbox/space/internal/store"
)

// Log writes audit entries to a store.
type Log struct {
	st   store.Audit
	log  *slog.Logger
	ch   chan store.AuditEntry
	done chan struct{}
}

// maxBatch bounds the entries written in one transaction.
const maxBatch = 256

// New starts a Log over st.
func New(st store.Audit, log *slog.Logger) *Log {
	l := &Log{st: st, log: log, ch: make(chan store.AuditEntry, 4096), done: make(chan struct{})}
	go l.run()
	return l
}

// Record queues e. When the queue is full it waits: an audit log that
// cannot keep up slows mutations down rather than lose their entries.
func (l *Log) Record(e store.AuditEntry) {
	defer func() { recover() }() // recorded after Close: dropped
	l.ch <- e
}

// Close writes what is queued and stops; ctx bounds the wait.
func (l *Log) Close(ctx context.Context) {
	close(l.ch)
	select {
	case <-l.done:
	case <-ctx.Done():
		l.log.Warn("audit log not flushed before shutdown", "err", ctx.Err())
	}
}

func (l *Log) run() {
	defer close(l.done)
	for e := range l.ch {
		batch := []store.AuditEntry{e}
	fill:
		for len(batch) < maxBatch {
			select {
			case e, ok := <-l.ch:
				if !ok {
					break fill
				}
				batch = append(batch, e)
			default:
				break fill
			}
		}
		l.write(batch)
	}
}

func (l *Log) write(batch []store.AuditEntry) {
	var err error
	for attempt := range 5 {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		err = l.st.AppendAudit(ctx, batch)
		cancel()
		if err == nil {
			return
		}
		time.Sleep(time.Duration(100<<attempt) * time.Millisecond)
	}
	l.log.Error("audit entries lost: the store did not take them", "entries", len(batch), "err", err)
}

// Entry is the audit entry of a request answered with status and err (nil:
// none), made by tok on listener; target names the object the path names
// and operation the operation the request started ("" for none).
func Entry(tok store.Token, listener, action, target, operation, requestID string, status int, err error) store.AuditEntry {
	outcome := "ok"
	switch {
	case err != nil:
		kind, _, _ := errdefs.Public(err)
		outcome = kind.Code
	case status >= 400:
		outcome = strings.ToLower(strings.ReplaceAll(http.StatusText(status), " ", "_"))
	}
	return store.AuditEntry{At: time.Now().UTC(), Project: tok.Project, TokenID: tok.ID, TokenName: tok.Name, Role: string(tok.Role),
		Action: action, Target: target, Operation: operation, Status: status, Outcome: outcome, RequestID: requestID, Listener: listener}
}

// Request is what a request tells the audit log as it is served: the
// action (method and route), the object its path names, the token it
// authenticated with, and the operation it started. Listeners put one in a
// request's context as it arrives (With) and fill it in as they serve it.
type Request struct {
	Action    string
	Target    string
	Token     store.Token
	Operation string
	// Code is the error code of a refusal answered without an error
	// reaching the edge (one stored under an Idempotency-Key, first
	// answered or replayed); empty otherwise.
	Code string
	// Forwarded requests are recorded by the node that served them.
	Forwarded bool
}

type requestKey struct{}

// With gives r an empty Request to fill in.
func With(r *http.Request) *http.Request {
	return r.WithContext(context.WithValue(r.Context(), requestKey{}, &Request{}))
}

// From is the Request of ctx (nil: none).
func From(ctx context.Context) *Request {
	rec, _ := ctx.Value(requestKey{}).(*Request)
	return rec
}

// Finished is a listener edge's Finished hook: every authenticated change
// (a method other than GET or HEAD, unless skip says it only reads),
// allowed or refused, becomes an entry. Requests refused before a token
// was known (401) are not entries. A nil Log records nothing.
func (l *Log) Finished(listener string, skip func(*Request) bool) func(r *http.Request, status int, err error) {
	return func(r *http.Request, status int, err error) {
		rec := From(r.Context())
		if l == nil || rec == nil || rec.Action == "" || rec.Token.ID == "" || rec.Forwarded ||
			r.Method == http.MethodGet || r.Method == http.MethodHead || (skip != nil && skip(rec)) {
			return
		}
		e := Entry(rec.Token, listener, rec.Action, rec.Target, rec.Operation, edge.RequestID(r.Context()), status, err)
		if err == nil && status >= 400 && rec.Code != "" {
			e.Outcome = rec.Code
		}
		l.Record(e)
	}
}
