// Package sqlite is the embedded Store: SQLite through a pure-Go driver (no
// cgo), in WAL mode, one writer connection and a pool of read-only readers.
// The queries are sqlstore's; this package opens the file and says how
// SQLite differs.
package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"os"
	"strings"

	_ "modernc.org/sqlite" // registers the "sqlite" driver

	"github.com/spacesandbox/space/internal/errdefs"
	"github.com/spacesandbox/space/internal/store/sqlstore"
)

// Store is a store.Store on a SQLite file.
type Store = sqlstore.Store

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
	r, err := sql.Open("sqlite", dsn(true))
	if err != nil {
		w.Close()
		return nil, fmt.Errorf("open sqlite readers: %w", err)
	}
	r.SetMaxOpenConns(8)
	r.SetMaxIdleConns(8)
	s, err := sqlstore.New(ctx, dialect, w, r, func() error { return errors.Join(r.Close(), w.Close()) })
	if err != nil {
		r.Close()
		w.Close()
		return nil, err
	}
	return s, nil
}

var dialect = &sqlstore.Dialect{
	Name:       "sqlite",
	Migrations: migrations,
	DigestExpr: `json_extract(doc, '$.template.digest')`,
	JSONInt: func(path ...string) string {
		return `COALESCE(json_extract(doc, '$.` + strings.Join(path, ".") + `'), 0)`
	},
	IsUnique:     isUnique,
	Retry:        func(error) bool { return false }, // one writer: nothing to lose
	StorageError: storageError,
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
	var e interface{ Code() int }
	if errors.As(err, &e) {
		c := e.Code()
		return c == 2067 || c == 1555 // SQLITE_CONSTRAINT_UNIQUE, SQLITE_CONSTRAINT_PRIMARYKEY
	}
	return false
}
