package postgres_test

import (
	"context"
	"os"
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
	if err := first.Exclusive(ctx); err != nil {
		t.Fatal(err)
	}
	second, err := postgres.Open(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer second.Close()
	got := make(chan error, 1)
	go func() { got <- second.Exclusive(ctx) }()
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
