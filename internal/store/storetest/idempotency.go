package storetest

// The cases of store.Idempotency.

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/spacesandbox/space/internal/errdefs"
	"github.com/spacesandbox/space/internal/sandbox"
	"github.com/spacesandbox/space/internal/store"
)

func testIdempotency(t *testing.T, open Opener) {
	s := open()
	defer s.Close()
	ctx := context.Background()
	rec := store.IdempotencyRecord{Key: "k1", Fingerprint: "f1", Owner: "boot-a", CreatedAt: epoch, ExpiresAt: epoch.Add(24 * time.Hour)}
	got, reserved, err := s.ReserveIdempotencyKey(ctx, rec)
	if err != nil || !reserved || got.State != store.IdemInFlight {
		t.Fatalf("first reserve = %+v %v %v", got, reserved, err)
	}
	got, reserved, err = s.ReserveIdempotencyKey(ctx, store.IdempotencyRecord{Key: "k1", Fingerprint: "other", Owner: "boot-a", CreatedAt: epoch, ExpiresAt: epoch.Add(time.Hour)})
	if err != nil || reserved || got.Fingerprint != "f1" || got.State != store.IdemInFlight {
		t.Fatalf("second reserve = %+v %v %v", got, reserved, err)
	}
	body := []byte(`{"x":1}`)
	if err := s.CompleteIdempotencyKey(ctx, store.Completion{Key: "k1", Status: 202, Location: "/v1/x", Body: func() ([]byte, error) { return body, nil }}); err != nil {
		t.Fatal(err)
	}
	got, err = s.GetIdempotencyKey(ctx, "k1")
	if err != nil || got.State != store.IdemDone || got.Status != 202 || string(got.Body) != string(body) || got.Location != "/v1/x" {
		t.Fatalf("completed = %+v %v", got, err)
	}
	// Completing twice is refused.
	wantKind(t, s.CompleteIdempotencyKey(ctx, store.Completion{Key: "k1", Status: 500, Body: func() ([]byte, error) { return nil, nil }}), errdefs.Conflict)
	// Release only drops in-flight reservations.
	if err := s.ReleaseIdempotencyKey(ctx, "k1"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.GetIdempotencyKey(ctx, "k1"); err != nil {
		t.Fatalf("release dropped a completed key: %v", err)
	}
	s.ReserveIdempotencyKey(ctx, store.IdempotencyRecord{Key: "k2", Fingerprint: "f", Owner: "boot-a", CreatedAt: epoch, ExpiresAt: epoch.Add(time.Hour)})
	if err := s.ReleaseIdempotencyKey(ctx, "k2"); err != nil {
		t.Fatal(err)
	}
	_, err = s.GetIdempotencyKey(ctx, "k2")
	wantKind(t, err, errdefs.NotFound)

	// Prune: expired completed keys and in-flight keys of dead owners go.
	s.ReserveIdempotencyKey(ctx, store.IdempotencyRecord{Key: "dead", Fingerprint: "f", Owner: "boot-old", CreatedAt: epoch, ExpiresAt: epoch.Add(48 * time.Hour)})
	s.ReserveIdempotencyKey(ctx, store.IdempotencyRecord{Key: "live", Fingerprint: "f", Owner: "boot-b", CreatedAt: epoch, ExpiresAt: epoch.Add(48 * time.Hour)})
	n, err := s.PruneIdempotencyKeys(ctx, epoch.Add(25*time.Hour), "boot-b")
	if err != nil || n != 2 {
		t.Fatalf("prune = %d, %v (want k1 and dead)", n, err)
	}
	for key, want := range map[string]bool{"k1": false, "dead": false, "live": true} {
		_, err := s.GetIdempotencyKey(ctx, key)
		if (err == nil) != want {
			t.Fatalf("after prune %s present=%v", key, err == nil)
		}
	}
	// An expired completed key that was not pruned yet is treated as new.
	s.ReserveIdempotencyKey(ctx, store.IdempotencyRecord{Key: "exp", Fingerprint: "f", Owner: "boot-b", CreatedAt: epoch, ExpiresAt: epoch.Add(time.Hour)})
	s.CompleteIdempotencyKey(ctx, store.Completion{Key: "exp", Status: 200, Body: func() ([]byte, error) { return nil, nil }})
	got, reserved, err = s.ReserveIdempotencyKey(ctx, store.IdempotencyRecord{Key: "exp", Fingerprint: "g", Owner: "boot-b", CreatedAt: epoch.Add(2 * time.Hour), ExpiresAt: epoch.Add(3 * time.Hour)})
	if err != nil || !reserved || got.Fingerprint != "g" {
		t.Fatalf("expired key reuse = %+v %v %v", got, reserved, err)
	}
}

func testIdempotencyAtomicWithChange(t *testing.T, open Opener) {
	s := open()
	defer s.Close()
	ctx := context.Background()
	s.ReserveIdempotencyKey(ctx, store.IdempotencyRecord{Key: "c", Fingerprint: "f", Owner: "o", CreatedAt: epoch, ExpiresAt: epoch.Add(time.Hour)})
	sb, op := newSandbox(sandbox.Starting)
	// A failing render aborts the whole change.
	err := s.CreateSandbox(ctx, sb, op, &store.Completion{Key: "c", Status: 202, Body: func() ([]byte, error) { return nil, errors.New("render failed") }}, 0)
	if err == nil {
		t.Fatal("create succeeded with a failing render")
	}
	if _, err := s.GetSandbox(ctx, sb.ID); !errors.Is(err, errdefs.NotFound) {
		t.Fatalf("sandbox stored despite failed completion: %v", err)
	}
	err = s.CreateSandbox(ctx, sb, op, &store.Completion{Key: "c", Status: 202, Body: func() ([]byte, error) { return []byte("ok"), nil }}, 0)
	if err != nil {
		t.Fatal(err)
	}
	rec, _ := s.GetIdempotencyKey(ctx, "c")
	if rec.State != store.IdemDone || string(rec.Body) != "ok" {
		t.Fatalf("record = %+v", rec)
	}
	// A completion for a key that is not in flight aborts the change too.
	sb2, op2 := newSandbox(sandbox.Starting)
	err = s.CreateSandbox(ctx, sb2, op2, &store.Completion{Key: "c", Status: 202, Body: func() ([]byte, error) { return []byte("again"), nil }}, 0)
	wantKind(t, err, errdefs.Conflict)
	if _, err := s.GetSandbox(ctx, sb2.ID); !errors.Is(err, errdefs.NotFound) {
		t.Fatalf("sandbox stored despite completed key: %v", err)
	}
}

// A key reserved in a process's memory is written once, done, with the
// change it answers; a live record under it refuses that change.
func testIdempotencyReservedInMemory(t *testing.T, open Opener) {
	s := open()
	defer s.Close()
	ctx := context.Background()
	mem := func(key, fp string, at time.Time) *store.IdempotencyRecord {
		return &store.IdempotencyRecord{Key: key, Fingerprint: fp, Owner: "boot-a", CreatedAt: at, ExpiresAt: at.Add(time.Hour)}
	}
	body := func(b string) func() ([]byte, error) { return func() ([]byte, error) { return []byte(b), nil } }
	sb, op := newSandbox(sandbox.Starting)
	if err := s.CreateSandbox(ctx, sb, op, &store.Completion{Key: "m", Status: 202, Location: "/v1/o", Body: body("made"), New: mem("m", "f1", epoch)}, 0); err != nil {
		t.Fatal(err)
	}
	got, err := s.GetIdempotencyKey(ctx, "m")
	if err != nil || got.State != store.IdemDone || got.Fingerprint != "f1" || got.Owner != "boot-a" || got.Status != 202 ||
		string(got.Body) != "made" || got.Location != "/v1/o" || !got.CreatedAt.Equal(epoch) || !got.ExpiresAt.Equal(epoch.Add(time.Hour)) {
		t.Fatalf("record = %+v %v", got, err)
	}
	// A second change under the live key is refused, and not made.
	sb2, op2 := newSandbox(sandbox.Starting)
	err = s.CreateSandbox(ctx, sb2, op2, &store.Completion{Key: "m", Status: 202, Body: body("again"), New: mem("m", "f2", epoch.Add(time.Minute))}, 0)
	wantKind(t, err, errdefs.Conflict)
	if _, err := s.GetSandbox(ctx, sb2.ID); !errors.Is(err, errdefs.NotFound) {
		t.Fatalf("sandbox stored despite a live key: %v", err)
	}
	// So is one under a key another process holds in flight.
	s.ReserveIdempotencyKey(ctx, store.IdempotencyRecord{Key: "held", Fingerprint: "f", Owner: "boot-b", CreatedAt: epoch, ExpiresAt: epoch.Add(time.Hour)})
	wantKind(t, s.CompleteIdempotencyKey(ctx, store.Completion{Key: "held", Status: 200, Body: body("x"), New: mem("held", "f", epoch)}), errdefs.Conflict)
	// An expired record (not pruned yet) is replaced.
	later := epoch.Add(2 * time.Hour)
	if err := s.CompleteIdempotencyKey(ctx, store.Completion{Key: "m", Status: 201, Body: body("new"), New: mem("m", "f3", later)}); err != nil {
		t.Fatal(err)
	}
	got, err = s.GetIdempotencyKey(ctx, "m")
	if err != nil || got.Fingerprint != "f3" || got.Status != 201 || string(got.Body) != "new" || got.Location != "" || !got.ExpiresAt.Equal(later.Add(time.Hour)) {
		t.Fatalf("replaced record = %+v %v", got, err)
	}
}
