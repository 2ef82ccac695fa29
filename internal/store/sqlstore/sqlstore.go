// Package sqlstore is store.Store over database/sql, written once for the
// SQL databases SPACE runs on. A Dialect says what differs between them:
// placeholders, schema migrations, how a unique violation, a full disk or a
// conflict that must be retried looks, and how a transaction is begun.
// Packages sqlite (the embedded default) and postgres (shared by control
// planes) each provide one.
//
// Every change is one transaction. SQLite has a single writer, so its
// transactions never interleave. On PostgreSQL (READ COMMITTED) a
// transaction locks each row it reads before changing it (FOR UPDATE), so
// two processes moving the same sandbox take turns and the second sees the
// first's change; warm-pool claims skip rows another claim holds; creates
// against the active-sandbox limit take turns on an advisory lock. A
// transaction that still loses — a deadlock, or an idempotency key or
// snapshot tag another process inserted since it looked — is run again from
// the start, so the callbacks given to the store may be called more than
// once and must only decide.
package sqlstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/spacesandbox/space/internal/store"
)

// Dialect is what differs between the databases Store runs on.
type Dialect struct {
	// Name names the database in errors ("sqlite", "postgres").
	Name string
	// Numbered placeholders ($1, $2 …) instead of ?.
	Numbered bool
	// Migrations are applied in order, each once, in its own transaction.
	Migrations []string
	// MigrationLock, when set, runs first in every migration transaction
	// so that processes starting together migrate one at a time.
	MigrationLock string
	// TxOptions begin every write transaction.
	TxOptions *sql.TxOptions
	// ForUpdate locks the rows a read in a write transaction returns
	// (" FOR UPDATE"); SkipLocked picks a row no other transaction holds
	// (" FOR UPDATE SKIP LOCKED", warm-pool claims); LimitLock (with the
	// node as its one argument) runs before
	// the active-sandbox count of a create. Empty for a single writer.
	ForUpdate, SkipLocked, LimitLock string
	// DigestExpr extracts the template digest from a doc column; JSONInt
	// makes the expression that reads an integer at a path of it
	// ("resources", "vcpus").
	DigestExpr string
	JSONInt    func(path ...string) string
	// IsUnique says err is a unique-constraint violation.
	IsUnique func(error) bool
	// Retry says a transaction failed only because a concurrent one won a
	// conflict, and may be run again.
	Retry func(error) bool
	// StorageError gives errors of a full or failing database their kind.
	StorageError func(error) error
}

// Store is a store.Store on a SQL database.
type Store struct {
	d     *Dialect
	w     *db // writes (SQLite: its one writer connection)
	r     *db // reads (SQLite: a read-only pool; else the same pool as w)
	close func() error
	docs  docCache // GetSandbox's decodes
}

var _ store.Store = (*Store)(nil)

// New makes a Store over the databases w (writes) and r (reads; may be w)
// and migrates the schema. close releases them.
func New(ctx context.Context, d *Dialect, w, r *sql.DB, close func() error) (*Store, error) {
	rb := &rebinder{numbered: d.Numbered}
	s := &Store{d: d, w: &db{db: w, rb: rb}, r: &db{db: r, rb: rb}, close: close}
	if err := s.migrate(ctx); err != nil {
		return nil, err
	}
	return s, nil
}

// Close closes the database.
func (s *Store) Close() error { return s.close() }

// Ping reads the database (readiness).
func (s *Store) Ping(ctx context.Context) error {
	var n int
	err := s.r.QueryRowContext(ctx, `SELECT COUNT(*) FROM (SELECT 1 FROM sandboxes LIMIT 1) AS t`).Scan(&n)
	return s.d.StorageError(err)
}

func (s *Store) migrate(ctx context.Context) error {
	ms := s.d.Migrations
	for i := 0; i <= len(ms); i++ {
		version := i // 0: the table of versions itself
		err := s.tx(ctx, func(tx *tx) error {
			if s.d.MigrationLock != "" {
				if _, err := tx.ExecContext(ctx, s.d.MigrationLock); err != nil {
					return fmt.Errorf("lock for migrations: %w", err)
				}
			}
			if version == 0 {
				_, err := tx.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS schema_migrations (version INTEGER PRIMARY KEY, applied_at BIGINT NOT NULL)`)
				return err
			}
			var n int
			if err := tx.QueryRowContext(ctx, `SELECT COUNT(*) FROM schema_migrations WHERE version = ?`, version).Scan(&n); err != nil {
				return err
			}
			if n > 0 {
				return nil
			}
			if _, err := tx.ExecContext(ctx, ms[version-1]); err != nil {
				return err
			}
			_, err := tx.ExecContext(ctx, `INSERT INTO schema_migrations(version, applied_at) VALUES (?, ?)`, version, time.Now().Unix())
			return err
		})
		if err != nil {
			return fmt.Errorf("apply %s migration %d: %w", s.d.Name, version, err)
		}
	}
	var max int
	if err := s.w.QueryRowContext(ctx, `SELECT COALESCE(MAX(version), 0) FROM schema_migrations`).Scan(&max); err != nil {
		return fmt.Errorf("read schema version: %w", err)
	}
	if max > len(ms) {
		return fmt.Errorf("database schema version %d is newer than this binary (%d)", max, len(ms))
	}
	return nil
}

// errRetry makes tx run a transaction again: it lost a race that only a
// fresh start can see the outcome of (an idempotency key another process
// inserted meanwhile).
var errRetry = errors.New("retry the transaction")

// maxAttempts bounds how often a transaction that keeps losing conflicts is
// run; the last conflict is returned after that.
const maxAttempts = 20

// tx runs fn in a write transaction and commits it when fn returns nil; a
// transaction that lost a conflict is run again.
func (s *Store) tx(ctx context.Context, fn func(*tx) error) error {
	var err error
	for attempt := 0; attempt < maxAttempts; attempt++ {
		if attempt > 0 {
			// Back off a little, at random, so that the racers part.
			d := time.Duration(rand.Int64N(int64(time.Millisecond)<<min(attempt, 6))) + time.Millisecond
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(d):
			}
		}
		err = s.try(ctx, fn)
		if err == nil || !(errors.Is(err, errRetry) || s.d.Retry(err)) {
			return err
		}
	}
	return fmt.Errorf("gave up after %d conflicting attempts: %w", maxAttempts, err)
}

func (s *Store) try(ctx context.Context, fn func(*tx) error) error {
	t, err := s.w.db.BeginTx(ctx, s.d.TxOptions)
	if err != nil {
		return s.d.StorageError(fmt.Errorf("begin transaction: %w", err))
	}
	if err := fn(&tx{t, s.w.rb, s.d}); err != nil {
		t.Rollback()
		return s.d.StorageError(err)
	}
	if err := t.Commit(); err != nil {
		return s.d.StorageError(fmt.Errorf("commit: %w", err))
	}
	return nil
}

// db and tx run queries written with ? placeholders on the dialect's.
//
// db keeps each query it runs prepared (database/sql prepares it again on
// each connection that runs it): parsing and planning a statement took
// about a third of a sandbox read's time on SQLite (GET /v1/sandboxes/{id}
// at 16 connections: 8,800 req/s, the parser a tenth of the server's CPU).
// Queries are the package's own constants, with a few shapes built from
// filters, so the set is small; maxPrepared bounds it all the same.
type db struct {
	db *sql.DB
	rb *rebinder

	mu       sync.Mutex // guards prepared
	prepared map[string]*sql.Stmt
}

const maxPrepared = 256

// stmt returns q prepared, or nil when it could not be (the caller runs it
// unprepared, and so reports the error).
func (d *db) stmt(ctx context.Context, q string) *sql.Stmt {
	d.mu.Lock()
	st, full := d.prepared[q], len(d.prepared) >= maxPrepared
	d.mu.Unlock()
	if st != nil || full {
		return st
	}
	st, err := d.db.PrepareContext(ctx, q)
	if err != nil {
		return nil
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if had := d.prepared[q]; had != nil {
		st.Close()
		return had
	}
	if d.prepared == nil {
		d.prepared = map[string]*sql.Stmt{}
	}
	d.prepared[q] = st
	return st
}

func (d *db) ExecContext(ctx context.Context, q string, args ...any) (sql.Result, error) {
	q = d.rb.bind(q)
	if st := d.stmt(ctx, q); st != nil {
		return st.ExecContext(ctx, args...)
	}
	return d.db.ExecContext(ctx, q, args...)
}

func (d *db) QueryContext(ctx context.Context, q string, args ...any) (*sql.Rows, error) {
	q = d.rb.bind(q)
	if st := d.stmt(ctx, q); st != nil {
		return st.QueryContext(ctx, args...)
	}
	return d.db.QueryContext(ctx, q, args...)
}

func (d *db) QueryRowContext(ctx context.Context, q string, args ...any) *sql.Row {
	q = d.rb.bind(q)
	if st := d.stmt(ctx, q); st != nil {
		return st.QueryRowContext(ctx, args...)
	}
	return d.db.QueryRowContext(ctx, q, args...)
}

type tx struct {
	tx *sql.Tx
	rb *rebinder
	d  *Dialect
}

func (d *db) forUpdate() string { return "" }

func (t *tx) forUpdate() string { return t.d.ForUpdate }

func (t *tx) ExecContext(ctx context.Context, q string, args ...any) (sql.Result, error) {
	return t.tx.ExecContext(ctx, t.rb.bind(q), args...)
}

func (t *tx) QueryRowContext(ctx context.Context, q string, args ...any) *sql.Row {
	return t.tx.QueryRowContext(ctx, t.rb.bind(q), args...)
}

// rebinder turns ? placeholders into $1, $2 … for databases that number
// them; the queries are the package's own constants (no ? inside quotes),
// so each is rewritten once and remembered.
type rebinder struct {
	numbered bool
	cache    sync.Map // string → string
}

func (r *rebinder) bind(q string) string {
	if !r.numbered {
		return q
	}
	if b, ok := r.cache.Load(q); ok {
		return b.(string)
	}
	var b strings.Builder
	n := 0
	for _, c := range q {
		if c == '?' {
			n++
			b.WriteByte('$')
			b.WriteString(strconv.Itoa(n))
			continue
		}
		b.WriteRune(c)
	}
	r.cache.Store(q, b.String())
	return b.String()
}
