// Package postgres is the Store control planes share: PostgreSQL through
// pgx, a pool of connections, transactions READ COMMITTED that lock the rows
// they change (see sqlstore). The queries are sqlstore's; this
// package connects and says how PostgreSQL differs.
package postgres

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"hash/fnv"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/spacesandbox/space/internal/errdefs"
	"github.com/spacesandbox/space/internal/store/sqlstore"
)

// Store is a store.Store on a PostgreSQL database.
type Store struct {
	*sqlstore.Store
	db       *sql.DB
	heldMu   sync.Mutex
	held     *sql.Conn // the session that holds the server lock (Exclusive)
	stopKeep context.CancelFunc
	keeping  sync.WaitGroup
	relocks  atomic.Int64
	cfg      *pgx.ConnConfig
	live     *sqlstore.Store // (Liveness)
}

// IsURL says spec names a PostgreSQL database (postgres:// or
// postgresql://).
func IsURL(spec string) bool {
	return strings.HasPrefix(spec, "postgres://") || strings.HasPrefix(spec, "postgresql://")
}

// Open connects to the database url names (a libpq URL: postgres://user@host:port/db?sslmode=…;
// the password may also come from PGPASSWORD or ~/.pgpass) and migrates it.
// Errors never carry the password.
func Open(ctx context.Context, url string) (*Store, error) {
	cfg, err := pgx.ParseConfig(url)
	if err != nil {
		// pgx's parse errors quote the URL; ours says only what is wrong.
		return nil, errors.New("parse the PostgreSQL URL: it is not a valid postgres:// URL")
	}
	db, err := connect(ctx, cfg, 16)
	if err != nil {
		return nil, err
	}
	s := &Store{db: db, cfg: cfg}
	st, err := sqlstore.New(ctx, dialect, db, db, s.close)
	if err != nil {
		db.Close()
		return nil, err
	}
	s.Store = st
	return s, nil
}

// connect opens a pool of at most n connections and checks it answers.
func connect(ctx context.Context, cfg *pgx.ConnConfig, n int) (*sql.DB, error) {
	db := stdlib.OpenDB(*cfg)
	db.SetMaxOpenConns(n)
	db.SetMaxIdleConns(n)
	db.SetConnMaxIdleTime(5 * time.Minute)
	db.SetConnMaxLifetime(time.Hour)
	pctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	if err := db.PingContext(pctx); err != nil {
		db.Close()
		return nil, fmt.Errorf("connect to PostgreSQL at %s:%d/%s: %w", cfg.Host, cfg.Port, cfg.Database, err)
	}
	return db, nil
}

// Liveness is the same database on a small pool of its own, for a cluster
// member's heartbeats: a process busy enough to use every connection of
// its main pool still says in time that it is alive. Closed with s.
func (s *Store) Liveness(ctx context.Context) (*sqlstore.Store, error) {
	if s.live != nil {
		return s.live, nil
	}
	db, err := connect(ctx, s.cfg, 3)
	if err != nil {
		return nil, err
	}
	live, err := sqlstore.New(ctx, dialect, db, db, db.Close)
	if err != nil {
		db.Close()
		return nil, err
	}
	s.live = live
	return live, nil
}

func (s *Store) close() error {
	if s.live != nil {
		s.live.Close()
	}
	if s.stopKeep != nil {
		s.stopKeep()
		s.keeping.Wait()
	}
	var err error
	if s.held != nil {
		err = s.held.Close() // ends the session: the lock goes with it
	}
	return errors.Join(err, s.db.Close())
}

// serverLock is the advisory lock a serving process holds on its database.
const serverLock = 0x5350414345 // "SPACE"

// Exclusive makes this process the only SPACE server on the database for as
// long as the Store is open: a server recovers and sweeps every sandbox
// the database records as its own, so a second one would take the first's
// sandboxes for lost. It fails with FailedPrecondition when another holds
// it for lockWait (a server killed a moment ago holds it until PostgreSQL
// sees its connection close). (Several control planes share one database
// once sandboxes record the node that runs them.)
//
// The lock lives as long as its session. If the session ends (PostgreSQL
// restarted, the connection was cut) the lock is taken again; if another
// server took it meanwhile, lost receives why, and this one must stop.
func (s *Store) Exclusive(ctx context.Context) (lost <-chan error, err error) {
	c, err := s.lock(ctx, lockWait)
	if err != nil {
		return nil, err
	}
	s.held = c
	ch := make(chan error, 1)
	kctx, cancel := context.WithCancel(context.Background())
	s.stopKeep = cancel
	s.keeping.Add(1)
	go s.keep(kctx, ch)
	return ch, nil
}

// lock takes the server lock on a connection of its own, trying for wait.
func (s *Store) lock(ctx context.Context, wait time.Duration) (*sql.Conn, error) {
	c, err := s.db.Conn(ctx)
	if err != nil {
		return nil, fmt.Errorf("take a connection for the server lock: %w", err)
	}
	deadline := time.Now().Add(wait)
	for {
		var ok bool
		if err := c.QueryRowContext(ctx, `SELECT pg_try_advisory_lock($1)`, serverLock).Scan(&ok); err != nil {
			c.Close()
			return nil, fmt.Errorf("take the server lock: %w", err)
		}
		if ok {
			return c, nil
		}
		if time.Now().After(deadline) {
			c.Close()
			return nil, errdefs.New(errdefs.FailedPrecondition, "another SPACE server is using this PostgreSQL database (waited %s)", wait)
		}
		select {
		case <-ctx.Done():
			c.Close()
			return nil, ctx.Err()
		case <-time.After(25 * time.Millisecond): // (a killed server's session ends within milliseconds)
		}
	}
}

// keep checks every keepEvery that the lock's session lives, and takes the
// lock again on a new one when it does not.
func (s *Store) keep(ctx context.Context, lost chan<- error) {
	defer s.keeping.Done()
	for {
		select {
		case <-ctx.Done():
			return
		case <-time.After(keepEvery):
		}
		s.heldMu.Lock()
		c := s.held
		s.heldMu.Unlock()
		pctx, cancel := context.WithTimeout(ctx, keepEvery)
		err := c.PingContext(pctx)
		cancel()
		if err == nil || ctx.Err() != nil {
			continue
		}
		c.Close()
		nc, err := s.lock(ctx, 0)
		switch {
		case err == nil:
			s.heldMu.Lock()
			s.held = nc
			s.heldMu.Unlock()
			s.relocks.Add(1)
		case errors.Is(err, errdefs.FailedPrecondition):
			lost <- fmt.Errorf("the session holding the server lock ended and another server took the lock: %w", err)
			return
		}
		// Unreachable: no one else can take it either; try again.
	}
}

// TryLock takes the advisory lock called name on a connection of its own if
// no other session holds it; release gives it back (and the connection).
// Cluster sweeps run under such locks, so one process runs each at a time;
// a process that dies loses its lock with its session.
func (s *Store) TryLock(ctx context.Context, name string) (release func(), ok bool, err error) {
	c, err := s.db.Conn(ctx)
	if err != nil {
		return nil, false, fmt.Errorf("take a connection for lock %s: %w", name, err)
	}
	h := fnv.New64a()
	h.Write([]byte(name))
	key := int64(h.Sum64())
	if err := c.QueryRowContext(ctx, `SELECT pg_try_advisory_lock($1)`, key).Scan(&ok); err != nil || !ok {
		c.Close()
		if err != nil {
			err = fmt.Errorf("take lock %s: %w", name, err)
		}
		return nil, false, err
	}
	return func() {
		uctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		c.ExecContext(uctx, `SELECT pg_advisory_unlock($1)`, key)
		c.Close()
	}, true, nil
}

// Relocks says how often the lock was taken again after its session ended.
func (s *Store) Relocks() int64 { return s.relocks.Load() }

// keepEvery is how often the lock's session is checked.
var keepEvery = 2 * time.Second

// lockWait is how long Exclusive waits for another server's lock.
const lockWait = 10 * time.Second

var dialect = &sqlstore.Dialect{
	Name:          "postgres",
	Numbered:      true,
	Migrations:    migrations,
	MigrationLock: `SELECT pg_advisory_xact_lock(7355608)`,
	ForUpdate:     " FOR UPDATE",
	SkipLocked:    " FOR UPDATE SKIP LOCKED",
	LimitLock:     `SELECT pg_advisory_xact_lock(7355609, hashtext(?))`, // per node
	DigestExpr:    `(doc::jsonb #>> '{template,digest}')`,
	JSONInt: func(path ...string) string {
		return `COALESCE((doc::jsonb #>> '{` + strings.Join(path, ",") + `}')::bigint, 0)`
	},
	IsUnique: func(err error) bool { return code(err) == "23505" },
	Retry: func(err error) bool {
		c := code(err)
		return c == "40001" || c == "40P01" // serialization_failure, deadlock_detected
	},
	StorageError: storageError,
}

func code(err error) string {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		return pe.Code
	}
	return ""
}

// storageError gives a full disk and an unreachable database the kinds (507,
// 503) a full or failing SQLite file has.
func storageError(err error) error {
	if err == nil {
		return nil
	}
	c := code(err)
	switch {
	case c == "53100": // disk_full
		return errdefs.Wrap(errdefs.InsufficientStorage, err, "the server's database is out of disk space")
	case strings.HasPrefix(c, "08"), c == "57P01", c == "57P02", c == "57P03", c == "25006": // connection, shutdown, read-only
		return errdefs.Wrap(errdefs.Unavailable, err, "the server's database cannot take requests")
	}
	var ne net.Error
	var ce *pgconn.ConnectError
	if errors.As(err, &ne) || errors.As(err, &ce) {
		return errdefs.Wrap(errdefs.Unavailable, err, "the server's database cannot be reached")
	}
	return err
}
