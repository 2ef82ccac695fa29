// Package sandboxio is the host's one way into a running sandbox's agent:
// files, processes and the sandbox's identity. It speaks the agent protocol
// (internal/agent/proto) so that nothing else on the host does: the control
// plane, the E2B layer and command sessions use its types, and every error it
// returns already carries an errdefs kind — an agent's own codes keep their
// meaning, a lost connection is Unavailable.
package sandboxio

import (
	"context"
	"errors"
	"fmt"

	"github.com/spacesandbox/space/internal/agent/proto"
	"github.com/spacesandbox/space/internal/agentclient"
	"github.com/spacesandbox/space/internal/errdefs"
)

// Agent is a running sandbox's agent. The runtime keeps the connection; an
// Agent is cheap and never closed by its users.
type Agent struct {
	c    *agentclient.Client
	lost func(error) error
}

// Wrap gives a runtime's agent connection its domain methods.
func Wrap(c *agentclient.Client) *Agent { return &Agent{c: c} }

// WhenLost has every call whose connection went away (the sandbox died, or
// an operation took it away) answered with explain(its Unavailable error)
// instead: the caller that knows the sandbox can say what became of it.
func (a *Agent) WhenLost(explain func(error) error) *Agent {
	a.lost = explain
	return a
}

// fail is fail, and a lost connection explained (WhenLost).
func (a *Agent) fail(step string, err error) error {
	out := fail(step, err)
	if a.lost != nil && errors.Is(err, agentclient.ErrClosed) {
		return a.lost(out)
	}
	return out
}

// kinds maps the agent's error codes to error kinds.
var kinds = map[string]*errdefs.Kind{
	proto.CodeInvalidArgument: errdefs.InvalidArgument, proto.CodeNotFound: errdefs.NotFound,
	proto.CodeFailedPrecondition: errdefs.FailedPrecondition, proto.CodeAlreadyExists: errdefs.Conflict,
	proto.CodePermissionDenied: errdefs.PermissionDenied, proto.CodeResourceExhausted: errdefs.ResourceExhausted,
}

// fail gives an agent call's failure its kind: the agent's own codes keep
// their meaning, a lost connection (or a call cut short) is Unavailable,
// anything else keeps no kind (shown as internal) with the step named.
func fail(step string, err error) error {
	if err == nil {
		return nil
	}
	var pe *proto.Error
	if errors.As(err, &pe) {
		kind := kinds[pe.Code]
		if kind == nil {
			kind = errdefs.Internal
		}
		return errdefs.Wrap(kind, err, "%s", pe.Message)
	}
	if Lost(err) {
		return errdefs.Wrap(errdefs.Unavailable, err, "%s: the sandbox's agent did not answer", step)
	}
	var ke *errdefs.Error
	if errors.As(err, &ke) {
		return err
	}
	return fmt.Errorf("%s: %w", step, err)
}

// Lost reports whether err means the agent did not answer (the connection
// went away or the call was cut short), as opposed to an answer that says no.
func Lost(err error) bool {
	return errors.Is(err, agentclient.ErrClosed) || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)
}

// Refused reports whether err is the agent's own answer (it understood the
// call and said no), as opposed to a call that got no answer.
func Refused(err error) bool {
	var pe *proto.Error
	return errors.As(err, &pe)
}
