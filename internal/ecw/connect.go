package ecw

import (
	"context"
	"errors"
	"log/slog"

	"connectrpc.com/connect"

	"github.com/spacesandbox/space/internal/errdefs"
	"github.com/spacesandbox/space/internal/httpguard"
)

// connectCode is the Connect code of an error kind (the one mapping for
// envd's RPCs; HTTP statuses come from the kinds themselves).
func connectCode(k *errdefs.Kind) connect.Code {
	switch k {
	case errdefs.InvalidArgument, errdefs.TooLarge:
		return connect.CodeInvalidArgument
	case errdefs.Unauthenticated:
		return connect.CodeUnauthenticated
	case errdefs.PermissionDenied:
		return connect.CodePermissionDenied
	case errdefs.NotFound:
		return connect.CodeNotFound
	case errdefs.Conflict:
		return connect.CodeAlreadyExists
	case errdefs.FailedPrecondition:
		return connect.CodeFailedPrecondition
	case errdefs.ResourceExhausted, kindNoSpace:
		return connect.CodeResourceExhausted
	case errdefs.Unavailable, kindGone:
		return connect.CodeUnavailable
	}
	return connect.CodeInternal
}

// toConnect turns a handler's error into a Connect error with a client-safe
// message; Connect errors and context ends pass through.
func toConnect(err error) error {
	var ce *connect.Error
	if err == nil || errors.As(err, &ce) {
		return err
	}
	if errors.Is(err, context.Canceled) {
		return connect.NewError(connect.CodeCanceled, err)
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return connect.NewError(connect.CodeDeadlineExceeded, err)
	}
	kind, msg, _ := errdefs.Public(err)
	return connect.NewError(connectCode(kind), errors.New(msg))
}

// errorInterceptor applies toConnect to every handler and logs failures
// of the server's own.
type errorInterceptor struct{ log *slog.Logger }

func (i errorInterceptor) convert(procedure string, err error) error {
	if err != nil && errdefs.KindOf(err) == errdefs.Internal {
		var ce *connect.Error
		if !errors.As(err, &ce) && !errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded) {
			i.log.Error("envd call failed", "procedure", procedure, "err", err)
		}
	}
	return toConnect(err)
}

func (i errorInterceptor) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		resp, err := next(ctx, req)
		return resp, i.convert(req.Spec().Procedure, err)
	}
}

func (i errorInterceptor) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return next
}

func (i errorInterceptor) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return func(ctx context.Context, conn connect.StreamingHandlerConn) error {
		// Past envd's token check: a process or watch stream may stay open.
		httpguard.Exempt(ctx)
		return i.convert(conn.Spec().Procedure, next(ctx, conn))
	}
}
