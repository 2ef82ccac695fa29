package postgres_test

import (
	"context"
	"database/sql"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/spacesandbox/space/internal/store"
	"github.com/spacesandbox/space/internal/store/postgres"
	"github.com/spacesandbox/space/internal/store/postgres/pgtest"
	"github.com/spacesandbox/space/internal/store/storetest"
)

func TestMain(m *testing.M) {
	storetest.WorkerMain(func(ctx context.Context, url string) (store.Store, error) { return postgres.Open(ctx, url) })
	os.Exit(pgtest.Main(m))
}

// TestRacesAcrossProcesses: server processes sharing one database race on
// the same idempotency key, sandbox, warm pool and limit.
func TestRacesAcrossProcesses(t *testing.T) {
	storetest.RunRaces(t, func(t *testing.T) string { return pgtest.URL(t) },
		func(ctx context.Context, url string) (store.Store, error) { return postgres.Open(ctx, url) })
}

func TestConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T) storetest.Opener {
		url := pgtest.URL(t)
		return func() store.Store {
			s, err := postgres.Open(context.Background(), url)
			if err != nil {
				t.Fatal(err)
			}
			return s
		}
	})
}

// One server per database: a second one waits for the first's lock and
// takes it once the first is gone (a server killed a moment ago).
func TestExclusiveWaitsForThePreviousServer(t *testing.T) {
	url := pgtest.URL(t)
	ctx := context.Background()
	first, err := postgres.Open(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := first.Exclusive(ctx); err != nil {
		t.Fatal(err)
	}
	second, err := postgres.Open(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer second.Close()
	got := make(chan error, 1)
	go func() { _, err := second.Exclusive(ctx); got <- err }()
	select {
	case err := <-got:
		t.Fatalf("the second server took the lock the first holds: %v", err)
	case <-time.After(500 * time.Millisecond):
	}
	first.Close()
	select {
	case err := <-got:
		if err != nil {
			t.Fatalf("the second server after the first closed: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the second server never took the lock")
	}
}

// The lock lives with its session: when PostgreSQL ends the session (a
// restart, a cut connection) the server takes it again; when another
// server took it first, the server is told it lost the database.
func TestExclusiveSurvivesItsSessionEnding(t *testing.T) {
	url := pgtest.URL(t)
	ctx := context.Background()
	admin, err := sql.Open("pgx", url)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	killHolder := func() {
		t.Helper()
		if _, err := admin.Exec(`SELECT pg_terminate_backend(pid) FROM pg_locks WHERE locktype = 'advisory' AND granted`); err != nil {
			t.Fatal(err)
		}
	}
	first, err := postgres.Open(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer first.Close()
	lost, err := first.Exclusive(ctx)
	if err != nil {
		t.Fatal(err)
	}
	killHolder()
	deadline := time.Now().Add(15 * time.Second)
	for first.Relocks() == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the lock was not taken again after its session ended")
		}
		time.Sleep(50 * time.Millisecond)
	}
	// Again, with another server waiting for the lock: it wins, and the
	// first hears it lost.
	second, err := postgres.Open(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer second.Close()
	got := make(chan error, 1)
	go func() { _, err := second.Exclusive(ctx); got <- err }()
	time.Sleep(300 * time.Millisecond)
	killHolder()
	if err := <-got; err != nil {
		t.Fatalf("the waiting server: %v", err)
	}
	select {
	case err := <-lost:
		if !strings.Contains(err.Error(), "another server took the lock") {
			t.Fatalf("lost = %v", err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("the first server never heard it lost the lock")
	}
}
