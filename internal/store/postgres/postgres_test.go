package postgres_test

import (
	"context"
	"os"
	"testing"

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
