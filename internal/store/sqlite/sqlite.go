// Package sqlite is the embedded Store: SQLite through a pure-Go driver (no
// cgo), in WAL mode, one writer connection and a pool of read-only readers.
package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"os"
	"time"

	_ "modernc.org/sqlite" // registers the "sqlite" driver

	"github.com/spacesandbox/space/internal/errdefs"
	"github.com/spacesandbox/space/internal/store"
)

// Store is a store.Store on a SQLite file.
type Store struct {
	w *sql.DB // the single writer; transactions begin IMMEDIATE
	r *sql.DB // read-only pool
}

var _ store.Store = (*Store)(nil)

// Open opens (creating if needed) the database at path and migrates it.
func Open(ctx context.Context, path string) (*Store, error) {
	dsn := func(readOnly bool) string {
		q := url.Values{}
		q.Add("_pragma", "busy_timeout(10000)")
		q.Add("_pragma", "journal_mode(WAL)")
		q.Add("_pragma", "synchronous(FULL)")
		q.Add("_pragma", "foreign_keys(1)")
		q.Set("_txlock", "immediate")
		if readOnly {
			q.Add("_pragma", "query_only(1)")
		}
		return "file:" + path + "?" + q.Encode()
	}
	// The database holds sandbox env values: it (and the -wal and -shm
	// files, which SQLite makes with the database's mode) is 0600.
	if f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600); err == nil {
		f.Close()
	}
	for _, p := range []string{path, path + "-wal", path + "-shm"} {
		if err := os.Chmod(p, 0o600); err != nil && !errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("make %s private: %w", p, err)
		}
	}
	w, err := sql.Open("sqlite", dsn(false))
	if err != nil {
		return nil, fmt.Errorf("open sqlite writer: %w", err)
	}
	w.SetMaxOpenConns(1)
	w.SetConnMaxIdleTime(0)
	s := &Store{w: w}
	if err := s.migrate(ctx); err != nil {
		w.Close()
		return nil, err
	}
	r, err := sql.Open("sqlite", dsn(true))
	if err != nil {
		w.Close()
		return nil, fmt.Errorf("open sqlite readers: %w", err)
	}
	r.SetMaxOpenConns(8)
	r.SetMaxIdleConns(8)
	s.r = r
	return s, nil
}

// Close closes the database.
func (s *Store) Close() error {
	return errors.Join(s.r.Close(), s.w.Close())
}

// Ping reads the database (readiness).
func (s *Store) Ping(ctx context.Context) error {
	var n int
	err := s.r.QueryRowContext(ctx, `SELECT COUNT(*) FROM (SELECT 1 FROM sandboxes LIMIT 1)`).Scan(&n)
	return storageError(err)
}

func (s *Store) migrate(ctx context.Context) error {
	if _, err := s.w.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS schema_migrations (version INTEGER PRIMARY KEY, applied_at INTEGER NOT NULL)`); err != nil {
		return fmt.Errorf("create schema_migrations: %w", err)
	}
	for i, m := range migrations {
		version := i + 1
		err := s.tx(ctx, func(tx *sql.Tx) error {
			var n int
			if err := tx.QueryRowContext(ctx, `SELECT COUNT(*) FROM schema_migrations WHERE version = ?`, version).Scan(&n); err != nil {
				return err
			}
			if n > 0 {
				return nil
			}
			if _, err := tx.ExecContext(ctx, m); err != nil {
				return err
			}
			_, err := tx.ExecContext(ctx, `INSERT INTO schema_migrations(version, applied_at) VALUES (?, ?)`, version, time.Now().Unix())
			return err
		})
		if err != nil {
			return fmt.Errorf("apply migration %d: %w", version, err)
		}
	}
	var max int
	if err := s.w.QueryRowContext(ctx, `SELECT COALESCE(MAX(version), 0) FROM schema_migrations`).Scan(&max); err != nil {
		return fmt.Errorf("read schema version: %w", err)
	}
	if max > len(migrations) {
		return fmt.Errorf("database schema version %d is newer than this binary (%d)", max, len(migrations))
	}
	return nil
}

// tx runs fn in a write transaction and commits it when fn returns nil.
func (s *Store) tx(ctx context.Context, fn func(*sql.Tx) error) error {
	tx, err := s.w.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("begin transaction: %w", err)
	}
	if err := fn(tx); err != nil {
		tx.Rollback()
		return storageError(err)
	}
	if err := tx.Commit(); err != nil {
		return storageError(fmt.Errorf("commit: %w", err))
	}
	return nil
}

// storageError gives SQLite's "disk full" and "read-only / I/O error" the
// kinds a full or failing data directory has (507, 503), not 500.
func storageError(err error) error {
	var e interface{ Code() int }
	if !errors.As(err, &e) {
		return err
	}
	switch e.Code() & 0xff {
	case 13: // SQLITE_FULL
		return errdefs.Wrap(errdefs.InsufficientStorage, err, "the server's storage is full")
	case 8, 10: // SQLITE_READONLY, SQLITE_IOERR
		return errdefs.Wrap(errdefs.Unavailable, err, "the server's storage cannot take writes")
	}
	return err
}

func isUnique(err error) bool {
	// modernc reports constraint violations in the error text; the code
	// (SQLITE_CONSTRAINT_UNIQUE / PRIMARYKEY) is in the message as well.
	var e interface{ Code() int }
	if errors.As(err, &e) {
		c := e.Code()
		return c == 2067 || c == 1555 // SQLITE_CONSTRAINT_UNIQUE, SQLITE_CONSTRAINT_PRIMARYKEY
	}
	return false
}
