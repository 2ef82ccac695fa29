package postgres_test

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/spacesandbox/space/internal/ids"
	"github.com/spacesandbox/space/internal/sandbox"
	"github.com/spacesandbox/space/internal/store"
	"github.com/spacesandbox/space/internal/store/postgres"
	"github.com/spacesandbox/space/internal/store/postgres/pgtest"
	"github.com/spacesandbox/space/internal/store/sqlite"
)

// BenchmarkStores measures what the control plane asks of its database
// most, on SQLite and PostgreSQL in the same run, from 16 goroutines: a
// sandbox read (GET /v1/sandboxes/{id}) and a create (sandbox, operation
// and idempotency record in one transaction).
//
//	go test -run XXX -bench Stores -benchtime 3s ./internal/store/postgres
func BenchmarkStores(b *testing.B) {
	ctx := context.Background()
	for _, db := range []struct {
		name string
		open func(b *testing.B) store.Store
	}{
		{"sqlite", func(b *testing.B) store.Store {
			s, err := sqlite.Open(ctx, filepath.Join(b.TempDir(), "space.db"))
			if err != nil {
				b.Fatal(err)
			}
			return s
		}},
		{"postgres", func(b *testing.B) store.Store {
			s, err := postgres.Open(ctx, pgtest.URL(b))
			if err != nil {
				b.Fatal(err)
			}
			return s
		}},
	} {
		b.Run(db.name+"/get", func(b *testing.B) {
			s := db.open(b)
			defer s.Close()
			sb, op := newSandbox()
			if err := s.CreateSandbox(ctx, sb, op, nil, 0); err != nil {
				b.Fatal(err)
			}
			b.SetParallelism(16)
			b.ResetTimer()
			start := time.Now()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					if _, err := s.GetSandbox(ctx, sb.ID); err != nil {
						b.Fatal(err)
					}
				}
			})
			b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "reads/s")
		})
		b.Run(db.name+"/create", func(b *testing.B) {
			s := db.open(b)
			defer s.Close()
			b.SetParallelism(16)
			b.ResetTimer()
			start := time.Now()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					sb, op := newSandbox()
					key := ids.New(ids.Operation)
					if _, _, err := s.ReserveIdempotencyKey(ctx, store.IdempotencyRecord{Key: key, Fingerprint: "f", Owner: "bench", CreatedAt: time.Now(), ExpiresAt: time.Now().Add(time.Hour)}); err != nil {
						b.Fatal(err)
					}
					idem := &store.Completion{Key: key, Status: 202, Body: func() ([]byte, error) { return []byte(`{}`), nil }}
					if err := s.CreateSandbox(ctx, sb, op, idem, 1_000_000); err != nil {
						b.Fatal(err)
					}
				}
			})
			b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "creates/s")
		})
	}
}

func newSandbox() (*sandbox.Sandbox, *sandbox.Operation) {
	now := time.Now().UTC()
	sb := &sandbox.Sandbox{ID: ids.New(ids.Sandbox), State: sandbox.Starting, Template: sandbox.TemplateRef{Ref: "seed:latest", Digest: "sha256:abc"},
		Runtime: "gvisor", Resources: sandbox.Resources{VCPUs: 1, MemoryMiB: 512, DiskMiB: 2048}, CreatedAt: now, UpdatedAt: now, LastActiveAt: now}
	op := &sandbox.Operation{ID: ids.New(ids.Operation), Kind: sandbox.OpCreate, SandboxID: sb.ID, State: sandbox.OpPending, CreatedAt: now, UpdatedAt: now}
	sb.ActiveOperation = op.ID
	return sb, op
}
