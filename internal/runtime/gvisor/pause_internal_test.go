//go:build linux

package gvisor

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/spacesandbox/space/internal/runtime"
)

// cpuUsed is the CPU time the sandbox's cgroup has used.
func cpuUsed(t *testing.T, id string) time.Duration {
	t.Helper()
	if b, err := os.ReadFile(filepath.Join("/sys/fs/cgroup/space", id, "cpu.stat")); err == nil { // v2
		for _, l := range strings.Split(string(b), "\n") {
			if f := strings.Fields(l); len(f) == 2 && f[0] == "usage_usec" {
				us, _ := strconv.ParseInt(f[1], 10, 64)
				return time.Duration(us) * time.Microsecond
			}
		}
	}
	b, err := os.ReadFile(filepath.Join("/sys/fs/cgroup/cpuacct/space", id, "cpuacct.usage"))
	if err != nil {
		t.Fatalf("no CPU accounting for sandbox %s: %v", id, err)
	}
	ns, _ := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	return time.Duration(ns)
}

// usedOver is the CPU time the sandbox uses over d.
func usedOver(t *testing.T, id string, d time.Duration) time.Duration {
	t.Helper()
	before := cpuUsed(t, id)
	time.Sleep(d)
	return cpuUsed(t, id) - before
}

// spins reports whether the sandbox uses want of CPU within 10 s: on a
// machine busy with other tests a spinning process may get far less than
// a core, but it gets some, where a paused one gets none.
func spins(t *testing.T, id string, want time.Duration) bool {
	t.Helper()
	before := cpuUsed(t, id)
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if cpuUsed(t, id)-before >= want {
			return true
		}
	}
	return false
}

// A pause (through the sandbox's control server, not the runsc CLI)
// stops a process that spins: the sandbox uses no CPU while paused, its
// agent does not answer, and after the resume the process spins again.
// Each is idempotent: a second pause and a second resume change nothing
// (a resume of a kernel not paused would crash the sentry).
func TestPauseFreezesTheSandbox(t *testing.T) {
	open, newSpec := testRuntime(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	r := open()
	spec, c := started(ctx, t, r, newSpec)
	startShell(ctx, t, c, "spin", "while :; do :; done")
	id := spec.SandboxID
	if !spins(t, id, 100*time.Millisecond) {
		t.Fatal("running: less than 100 ms of CPU in 10 s; the spinning process does not spin")
	}
	for i := 0; i < 2; i++ {
		if err := r.Pause(ctx, spec); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(50 * time.Millisecond) // tasks stop at their next check
	if used := usedOver(t, id, 300*time.Millisecond); used > 30*time.Millisecond {
		t.Fatalf("paused: %v of CPU in 300 ms", used)
	}
	if r.agentAnswers(ctx, id) {
		t.Fatal("the agent of a paused sandbox answered")
	}
	if st, err := r.Recover(ctx, spec); err != nil || st != runtime.StatusPaused {
		t.Fatalf("paused sandbox recovered as %v %v", st, err)
	}
	for i := 0; i < 2; i++ {
		if err := r.Resume(ctx, spec); err != nil {
			t.Fatal(err)
		}
	}
	if !spins(t, id, 100*time.Millisecond) {
		t.Fatal("resumed: less than 100 ms of CPU in 10 s; the process does not spin again")
	}
	if !r.agentAnswers(ctx, id) {
		t.Fatal("the agent does not answer after the resume")
	}
}

// A server that died in the middle of a pause or a resume left its mark
// saying so; the next server finds out what the sentry did (from whether
// the agent answers) and goes on from there without a resume of a kernel
// that is not paused. A sandbox an earlier release paused with `runsc
// pause` (with an empty mark, or none from before the mark) is resumed by
// runsc.
func TestPauseInterruptedByACrashIsSettled(t *testing.T) {
	const noMark = "(no mark file)"
	open, newSpec := testRuntime(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	r := open()
	for _, c := range []struct {
		name, mark string
		pause      func(runtime.Spec) // what the sentry was told, by whom
		want       runtime.Status
	}{
		{"pause sent", markPausing, func(s runtime.Spec) {
			if err := r.control(ctx, s.SandboxID, "containerManager.Pause"); err != nil {
				t.Fatal(err)
			}
		}, runtime.StatusPaused},
		{"pause not sent", markPausing, func(runtime.Spec) {}, runtime.StatusRunning},
		{"resume sent", markResuming, func(runtime.Spec) {}, runtime.StatusRunning},
		{"resume not sent", markResuming, func(s runtime.Spec) {
			if err := r.control(ctx, s.SandboxID, "containerManager.Pause"); err != nil {
				t.Fatal(err)
			}
		}, runtime.StatusPaused},
		{"earlier release's runsc pause", "", func(s runtime.Spec) {
			if _, err := r.runsc(ctx, s, "pause", s.SandboxID); err != nil {
				t.Fatal(err)
			}
		}, runtime.StatusPaused},
		{"runsc pause of a release before the mark", noMark, func(s runtime.Spec) {
			if _, err := r.runsc(ctx, s, "pause", s.SandboxID); err != nil {
				t.Fatal(err)
			}
		}, runtime.StatusPaused},
	} {
		t.Run(c.name, func(t *testing.T) {
			spec, _ := started(ctx, t, r, newSpec)
			c.pause(spec)
			if c.mark != noMark {
				if err := os.WriteFile(r.pausedMark(spec.SandboxID), []byte(c.mark), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			r.Close()
			r = open()
			if st, err := r.Recover(ctx, spec); err != nil || st != c.want {
				t.Fatalf("recovered as %v %v, want %v", st, err, c.want)
			}
			for _, step := range []func(context.Context, runtime.Spec) error{r.Resume, r.Pause, r.Resume} {
				if err := step(ctx, spec); err != nil {
					t.Fatal(err)
				}
			}
			if err := r.waitAgent(ctx, spec.SandboxID); err != nil {
				t.Fatalf("after a resume: %v", err)
			}
			if st, err := r.Recover(ctx, spec); err != nil || st != runtime.StatusRunning {
				t.Fatalf("after a resume: %v %v", st, err)
			}
		})
	}
}
