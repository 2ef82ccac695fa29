package main

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"
)

// The server warns about each host setting that would hold gVisor
// sandboxes back (FAKE sysctl values standing for other hosts), and says
// nothing on a host set up by make deps.
func TestWarnHostLimitsNamesEachLowSysctlFakeHost(t *testing.T) {
	real := hostSysctl
	defer func() { hostSysctl = real }()
	for _, c := range []struct {
		pidMax, wmem int
		want         []string
	}{
		{4194304, 1 << 20, nil},
		{32768, 1 << 20, []string{"kernel.pid_max"}},
		{4194304, 212992, []string{"net.core.wmem_default"}},
		{32768, 212992, []string{"kernel.pid_max", "net.core.wmem_default"}},
	} {
		hostSysctl = func(name string) (int, bool) {
			switch name {
			case "kernel/pid_max":
				return c.pidMax, true
			case "net/core/wmem_default":
				return c.wmem, true
			}
			return 0, false
		}
		var buf bytes.Buffer
		warnHostLimits(slog.New(slog.NewTextHandler(&buf, nil)), 1000)
		out := buf.String()
		if n := strings.Count(out, "level=WARN"); n != len(c.want) {
			t.Errorf("pid_max %d, wmem_default %d: %d warnings, want %d:\n%s", c.pidMax, c.wmem, n, len(c.want), out)
		}
		for _, w := range c.want {
			if !strings.Contains(out, w) {
				t.Errorf("pid_max %d, wmem_default %d: no warning names %s:\n%s", c.pidMax, c.wmem, w, out)
			}
		}
	}
}
