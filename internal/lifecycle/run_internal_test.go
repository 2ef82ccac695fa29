package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/spacesandbox/space/internal/agentclient"
	"github.com/spacesandbox/space/internal/errdefs"
	"github.com/spacesandbox/space/internal/sandbox"
)

// What a client reads of a failed operation: the error's own code and
// message where it has one, a time-out, a sandbox whose process died as it
// started, and otherwise a pointer to the server log — never the host's
// details (paths, runsc's output).
func TestOperationErrorSaysWhatFailedWithoutHostDetails(t *testing.T) {
	op := sandbox.Operation{ID: "op_test", Kind: sandbox.OpWake}
	host := "runsc restore: exit status 128: /var/lib/space/runtime/x"
	for _, c := range []struct {
		cause      error
		code, says string
	}{
		{errdefs.New(errdefs.InsufficientStorage, "not enough disk space"), "resource_exhausted", "not enough disk space"},
		{fmt.Errorf("%s: %w", host, context.DeadlineExceeded), "unavailable", "wake did not finish in time"},
		{fmt.Errorf("restore: %w", fmt.Errorf("sbx_1: %w", agentclient.ErrHostEnded)), "internal", "the sandbox's process ended before its agent answered"},
		{errors.New(host), "internal", "wake failed in the runtime; the server log has the details for operation op_test"},
	} {
		got := operationError(op, c.cause)
		if got.Code != c.code || !strings.Contains(got.Message, c.says) || strings.Contains(got.Message, "/var/lib") {
			t.Errorf("%v: got %s %q, want %s saying %q", c.cause, got.Code, got.Message, c.code, c.says)
		}
	}
}
