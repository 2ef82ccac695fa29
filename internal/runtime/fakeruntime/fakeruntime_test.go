package fakeruntime_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/spacesandbox/space/internal/ids"
	"github.com/spacesandbox/space/internal/runtime"
	"github.com/spacesandbox/space/internal/runtime/fakeruntime"
	"github.com/spacesandbox/space/internal/runtime/runtimetest"
	"github.com/spacesandbox/space/internal/sandbox"
)

// The fake runs the conformance suite so the suite itself is exercised in
// every build, and so engine tests can trust the fake's semantics.
func TestFakeConformance(t *testing.T) {
	runtimetest.Run(t, func(t *testing.T) runtimetest.Harness {
		dir := t.TempDir()
		open := func(t *testing.T) runtime.Runtime {
			r, err := fakeruntime.New(fakeruntime.Config{Dir: dir})
			if err != nil {
				t.Fatal(err)
			}
			return r
		}
		return runtimetest.Harness{Runtime: open(t), Template: sandbox.TemplateRef{Ref: "test:latest", Digest: "sha256:0"}, Reopen: open}
	})
}

func TestFakeInjectsFailureWithoutChange(t *testing.T) {
	r, _ := fakeruntime.New(fakeruntime.Config{Dir: t.TempDir(), Fail: fakeruntime.ParseFail("pause, suspend")})
	spec := runtime.Spec{SandboxID: ids.New(ids.Sandbox)}
	ctx := context.Background()
	if err := r.Create(ctx, spec); err != nil {
		t.Fatal(err)
	}
	if err := r.Pause(ctx, spec); !errors.Is(err, fakeruntime.ErrInjected) {
		t.Fatalf("pause = %v", err)
	}
	if st, _ := r.Recover(ctx, spec); st != runtime.StatusRunning {
		t.Fatalf("status after failed pause = %s", st)
	}
}

func TestFakeDelayHonoursContext(t *testing.T) {
	r, _ := fakeruntime.New(fakeruntime.Config{Dir: t.TempDir(), Delay: time.Hour})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
	defer cancel()
	if err := r.Create(ctx, runtime.Spec{SandboxID: ids.New(ids.Sandbox)}); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("create = %v", err)
	}
}
