//go:build linux

package exitwatch

import (
	"log/slog"
	"os"
	"os/exec"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/spacesandbox/space/internal/runtime"
)

func sleeper(t *testing.T) *exec.Cmd {
	t.Helper()
	c := exec.Command("sleep", "60")
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	go c.Wait() // reaped, as a runtime's own children are
	t.Cleanup(func() { c.Process.Kill() })
	return c
}

func TestKilledProcessIsReportedOnceAndStoppedOneIsNot(t *testing.T) {
	w := New(slog.New(slog.DiscardHandler))
	got := make(chan runtime.Exit, 4)
	w.OnExit(func(x runtime.Exit) { got <- x })

	dies, stopped := sleeper(t), sleeper(t)
	if err := w.Watch("sbx_dies", dies.Process.Pid, func() (string, string) { return runtime.ExitOutOfMemory, "at its limit" }); err != nil {
		t.Fatal(err)
	}
	if err := w.Watch("sbx_stopped", stopped.Process.Pid, nil); err != nil {
		t.Fatal(err)
	}
	w.Stop("sbx_stopped") // the runtime ends it itself
	stopped.Process.Kill()
	dies.Process.Kill()
	select {
	case x := <-got:
		if x.SandboxID != "sbx_dies" || x.Reason != runtime.ExitOutOfMemory || x.Message != "at its limit" {
			t.Fatalf("exit = %+v", x)
		}
	case <-time.After(30 * time.Second):
		// Generous: a CI run that also ran e2e sandboxes beside it once
		// missed 10 s (not reproduced in 30 runs alone).
		t.Fatal("a killed process was not reported")
	}
	select {
	case x := <-got:
		t.Fatalf("reported as well: %+v", x)
	case <-time.After(300 * time.Millisecond):
	}
}

func TestGoneProcessIsReportedAtOnce(t *testing.T) {
	w := New(slog.New(slog.DiscardHandler))
	got := make(chan runtime.Exit, 1)
	w.OnExit(func(x runtime.Exit) { got <- x })
	c := exec.Command("true")
	if err := c.Run(); err != nil {
		t.Fatal(err)
	}
	if err := w.Watch("sbx_gone", c.Process.Pid, nil); err != nil {
		t.Fatal(err)
	}
	select {
	case x := <-got:
		if x.Reason != runtime.ExitKilled {
			t.Fatalf("exit = %+v", x)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("a process gone before the watch was not reported")
	}
}

// A new watch of the same sandbox (a restore) replaces the old one: the old
// process ending is not reported.
func TestRewatchReplaces(t *testing.T) {
	w := New(slog.New(slog.DiscardHandler))
	got := make(chan runtime.Exit, 2)
	w.OnExit(func(x runtime.Exit) { got <- x })
	old, cur := sleeper(t), sleeper(t)
	w.Watch("sbx_a", old.Process.Pid, nil)
	w.Watch("sbx_a", cur.Process.Pid, nil)
	old.Process.Kill()
	select {
	case x := <-got:
		t.Fatalf("the replaced watch reported: %+v", x)
	case <-time.After(300 * time.Millisecond):
	}
	cur.Process.Kill()
	select {
	case <-got:
	case <-time.After(10 * time.Second):
		t.Fatal("the current process was not reported")
	}
}

// The backstop asks the pidfd itself: not ended while the process lives,
// ended once it is gone.
func TestBackstopPollsThePidfd(t *testing.T) {
	c := sleeper(t)
	fd, err := unix.PidfdOpen(c.Process.Pid, unix.PIDFD_NONBLOCK)
	if err != nil {
		t.Fatal(err)
	}
	f := os.NewFile(uintptr(fd), "pidfd")
	defer f.Close()
	rc, err := f.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	if exited(rc) {
		t.Fatal("a live process reads as ended")
	}
	c.Process.Kill()
	deadline := time.Now().Add(10 * time.Second)
	for !exited(rc) {
		if time.Now().After(deadline) {
			t.Fatal("a killed process never reads as ended")
		}
		time.Sleep(10 * time.Millisecond)
	}
}
