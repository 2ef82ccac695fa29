//go:build linux

package gvisor

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/spacesandbox/space/internal/runtime/runtimetest"
)

// The runsc scripts/install-deps builds carries gVisor's precompiled seccomp
// filters, so a sandbox's start and its restore render their filter instead
// of compiling it (40 ms of a boot and up to 210 ms of a restore here). With
// SPACE's own flags the sentry and the gofer must each find theirs: runsc's
// debug log (through a wrapper adding --debug) says which it did. A runsc
// built without them fails here — rerun scripts/install-deps.
func TestRunscRendersPrecompiledSeccompFilters(t *testing.T) {
	open, newSpec := testRuntime(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	runsc, _ := runtimetest.RequireRunsc(t)
	logs := t.TempDir()
	wrapper := filepath.Join(t.TempDir(), "runsc")
	script := "#!/bin/sh\nexec \"" + runsc + "\" --debug --debug-log=" + logs + "/%COMMAND%.log \"$@\"\n"
	if err := os.WriteFile(wrapper, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	r := open(wrapper)
	spec, c := started(ctx, t, r, newSpec)
	writeKept(ctx, t, c)
	if err := r.Suspend(ctx, spec); err != nil {
		t.Fatal(err)
	}
	if err := r.Restore(ctx, spec); err != nil {
		t.Fatal(err)
	}
	expectKept(ctx, t, r, spec)

	// A boot and a restore both start a sentry (boot.log) and a gofer
	// (gofer.log); runsc appends every start of a command to its log.
	for _, name := range []string{"boot.log", "gofer.log"} {
		b, err := os.ReadFile(filepath.Join(logs, name))
		if err != nil {
			t.Fatalf("runsc's debug log: %v", err)
		}
		log := string(b)
		if n := strings.Count(log, "Loaded precompiled seccomp instructions"); n < 2 {
			t.Errorf("%s: %d starts rendered a precompiled filter, want the boot and the restore", name, n)
		}
		if i := strings.Index(log, "No precompiled program found"); i >= 0 {
			line, _, _ := strings.Cut(log[i:], "\n")
			t.Errorf("%s: %s", name, line)
		}
	}
}
