package lifecycle_test

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"
	"time"

	"github.com/spacesandbox/space/internal/errdefs"
	"github.com/spacesandbox/space/internal/lifecycle"
	"github.com/spacesandbox/space/internal/sandbox"
)

func createWithTimeout(t *testing.T, w *world, timeout, action string) *sandbox.Sandbox {
	t.Helper()
	sb, op, err := w.eng.Create(context.Background(), lifecycle.CreateRequest{AutoLifecycle: &sandbox.AutoLifecycle{Timeout: timeout, TimeoutAction: action}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	wait(t, w, op.ID)
	got, _ := w.eng.Get(context.Background(), sb.ID)
	return got
}

// A timeout deletes or suspends on time, as a recorded operation; a wake
// starts the timeout afresh.
func TestTimeoutActions(t *testing.T) { synctest.Test(t, testTimeoutActions) }

func testTimeoutActions(t *testing.T) {
	w := idleWorld(t, 0)
	del := createWithTimeout(t, w, "1s", "")
	sus := createWithTimeout(t, w, "1s", "suspend")
	none := createWithTimeout(t, w, "", "")
	if del.AutoLifecycle.TimeoutAction != "delete" || del.ExpiresAt == nil || none.ExpiresAt != nil {
		t.Fatalf("deadlines: %+v %v / %v", del.AutoLifecycle, del.ExpiresAt, none.ExpiresAt)
	}
	if d := time.Until(*del.ExpiresAt); d <= 0 || d > time.Second {
		t.Fatalf("expires in %s, want within 1s", d)
	}
	waitState(t, w, del.ID, sandbox.Deleted, 5*time.Second)
	waitState(t, w, sus.ID, sandbox.Suspended, 5*time.Second)
	if autoOps(t, w, del.ID, sandbox.OpDelete) != 1 || autoOps(t, w, sus.ID, sandbox.OpSuspend) != 1 {
		t.Fatal("timeout actions are not recorded as operations")
	}
	if sb, _ := w.eng.Get(context.Background(), sus.ID); sb.ExpiresAt != nil {
		t.Fatalf("a suspended sandbox has a deadline: %v", sb.ExpiresAt)
	}
	op, err := w.eng.Wake(context.Background(), sus.ID, nil)
	if err != nil {
		t.Fatal(err)
	}
	wait(t, w, op.ID)
	sb, _ := w.eng.Get(context.Background(), sus.ID)
	if sb.State != sandbox.Running || sb.ExpiresAt == nil || time.Until(*sb.ExpiresAt) < 500*time.Millisecond {
		t.Fatalf("after wake: %s expires %v", sb.State, sb.ExpiresAt)
	}
	waitState(t, w, sus.ID, sandbox.Suspended, 5*time.Second)
	if state(t, w, none.ID) != sandbox.Running {
		t.Fatal("a sandbox without a timeout was acted on")
	}
}

// Paused time does not count: a sandbox paused past its deadline is not
// acted on while paused, and gets a whole timeout when woken.
func TestTimeoutIgnoresPausedTime(t *testing.T) { synctest.Test(t, testTimeoutIgnoresPausedTime) }

func testTimeoutIgnoresPausedTime(t *testing.T) {
	w := idleWorld(t, 0)
	sb := createWithTimeout(t, w, "1s", "delete")
	op, _ := w.eng.Pause(context.Background(), sb.ID, nil)
	wait(t, w, op.ID)
	time.Sleep(1500 * time.Millisecond)
	if state(t, w, sb.ID) != sandbox.Paused {
		t.Fatal("a paused sandbox was acted on by its timeout")
	}
	op, _ = w.eng.Wake(context.Background(), sb.ID, nil)
	wait(t, w, op.ID)
	if state(t, w, sb.ID) != sandbox.Running {
		t.Fatal("woken sandbox is not running")
	}
	waitState(t, w, sb.ID, sandbox.Deleted, 5*time.Second)
}

// SetTimeout replaces the deadline (it may shorten it); ExtendTimeout never
// shortens it; bad timeouts are refused.
func TestSetAndExtendTimeout(t *testing.T) { synctest.Test(t, testSetAndExtendTimeout) }

func testSetAndExtendTimeout(t *testing.T) {
	w := idleWorld(t, 0)
	ctx := context.Background()
	sb := createWithTimeout(t, w, "1h", "delete")
	got, err := w.eng.ExtendTimeout(ctx, sb.ID, time.Minute)
	if err != nil || !got.ExpiresAt.Equal(*sb.ExpiresAt) {
		t.Fatalf("extend by less than is left changed the deadline: %v %v", got.ExpiresAt, err)
	}
	got, _ = w.eng.ExtendTimeout(ctx, sb.ID, 2*time.Hour)
	if d := time.Until(*got.ExpiresAt); d < 119*time.Minute {
		t.Fatalf("extend: expires in %s", d)
	}
	got, _ = w.eng.SetTimeout(ctx, sb.ID, 300*time.Millisecond)
	if d := time.Until(*got.ExpiresAt); d > 300*time.Millisecond || got.AutoLifecycle.Timeout != "300ms" {
		t.Fatalf("set: expires in %s (%+v)", d, got.AutoLifecycle)
	}
	waitState(t, w, sb.ID, sandbox.Deleted, 5*time.Second)
	if _, err := w.eng.SetTimeout(ctx, sb.ID, 0); !errors.Is(err, errdefs.InvalidArgument) {
		t.Fatalf("zero timeout: %v", err)
	}
	if _, err := w.eng.SetTimeout(ctx, sb.ID, time.Minute); !errors.Is(err, errdefs.NotFound) {
		t.Fatalf("timeout of a deleted sandbox: %v", err)
	}
	for _, al := range []sandbox.AutoLifecycle{{Timeout: "soon"}, {Timeout: "-1s"}, {Timeout: "1000h"}, {Timeout: "1m", TimeoutAction: "explode"}} {
		if _, _, err := w.eng.Create(ctx, lifecycle.CreateRequest{AutoLifecycle: &al}, nil); !errors.Is(err, errdefs.InvalidArgument) {
			t.Fatalf("create with %+v: %v", al, err)
		}
	}
}
