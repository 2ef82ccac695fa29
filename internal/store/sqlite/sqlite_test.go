package sqlite_test

import (
	"context"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/spacesandbox/space/internal/store"
	"github.com/spacesandbox/space/internal/store/sqlite"
	"github.com/spacesandbox/space/internal/store/storetest"
)

func TestMain(m *testing.M) {
	storetest.WorkerMain(func(ctx context.Context, path string) (store.Store, error) { return sqlite.Open(ctx, path) })
	os.Exit(m.Run())
}

// TestRacesAcrossProcesses: processes sharing one database file race on the
// same idempotency key, sandbox, warm pool and limit.
func TestRacesAcrossProcesses(t *testing.T) {
	storetest.RunRaces(t, func(t *testing.T) string { return filepath.Join(t.TempDir(), "space.db") },
		func(ctx context.Context, path string) (store.Store, error) { return sqlite.Open(ctx, path) })
}

func TestConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T) storetest.Opener {
		path := filepath.Join(t.TempDir(), "space.db")
		return func() store.Store {
			s, err := sqlite.Open(context.Background(), path)
			if err != nil {
				t.Fatal(err)
			}
			return s
		}
	})
}

func TestMigrationsAreIdempotent(t *testing.T) {
	path := filepath.Join(t.TempDir(), "space.db")
	for i := 0; i < 3; i++ {
		s, err := sqlite.Open(context.Background(), path)
		if err != nil {
			t.Fatalf("open %d: %v", i, err)
		}
		s.Close()
	}
}

// The database holds sandbox env values in clear: it and its -wal and -shm
// files are readable by their owner only, also when they existed with a
// wider mode (issue #14, item 13).
func TestFilesArePrivate(t *testing.T) {
	old := syscall.Umask(0o022)
	defer syscall.Umask(old)
	path := filepath.Join(t.TempDir(), "space.db")
	s, err := sqlite.Open(context.Background(), path)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.ListTokens(context.Background(), ""); err != nil {
		t.Fatal(err)
	}
	check := func() {
		t.Helper()
		for _, p := range []string{path, path + "-wal", path + "-shm"} {
			fi, err := os.Stat(p)
			if err != nil {
				t.Fatal(err)
			}
			if fi.Mode().Perm() != 0o600 {
				t.Errorf("%s is %v, want 0600", filepath.Base(p), fi.Mode().Perm())
			}
		}
	}
	check()
	s.Close()
	os.Chmod(path, 0o644)
	s, err = sqlite.Open(context.Background(), path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	s.ListTokens(context.Background(), "")
	check()
}
