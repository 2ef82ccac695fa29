// Package errdefs defines the small set of error kinds SPACE uses everywhere.
//
// Domain code wraps errors with one of these kinds (errors.Is-compatible);
// the HTTP edge maps a kind to a status and a stable JSON code exactly once.
package errdefs

import (
	"errors"
	"fmt"
	"syscall"
)

// Kind is a class of failure with one API code and HTTP status.
type Kind struct {
	Code   string
	Status int
}

func (k *Kind) Error() string { return k.Code }

// The kinds. Each is a sentinel: errors.Is(err, errdefs.NotFound).
var (
	InvalidArgument      = &Kind{"invalid_argument", 400}
	Unauthenticated      = &Kind{"unauthenticated", 401}
	PermissionDenied     = &Kind{"permission_denied", 403}
	NotFound             = &Kind{"not_found", 404}
	MethodNotAllowed     = &Kind{"method_not_allowed", 405}
	FailedPrecondition   = &Kind{"failed_precondition", 409}
	Conflict             = &Kind{"conflict", 409}
	TooLarge             = &Kind{"payload_too_large", 413}
	IdempotencyKeyReused = &Kind{"idempotency_key_reused", 422}
	ResourceExhausted    = &Kind{"resource_exhausted", 429}
	// InsufficientStorage is resource_exhausted of the server's own storage
	// (its data directory is full): 507, not a client's limit.
	InsufficientStorage = &Kind{"resource_exhausted", 507}
	Internal            = &Kind{"internal", 500}
	Unavailable         = &Kind{"unavailable", 503}
)

// Error is an error of a kind with a client-safe message and optional details.
type Error struct {
	Kind    *Kind
	Message string
	Details map[string]any
	cause   error
}

func (e *Error) Error() string {
	if e.cause != nil {
		return e.Message + ": " + e.cause.Error()
	}
	return e.Message
}

// Is reports whether target is this error's kind.
func (e *Error) Is(target error) bool { return target == e.Kind }

// Unwrap exposes the cause (not shown to clients).
func (e *Error) Unwrap() error { return e.cause }

// New returns an error of kind k whose message is shown to clients.
func New(k *Kind, format string, args ...any) *Error {
	return &Error{Kind: k, Message: fmt.Sprintf(format, args...)}
}

// Wrap returns an error of kind k with a client-safe message and a hidden cause.
func Wrap(k *Kind, cause error, format string, args ...any) *Error {
	return &Error{Kind: k, Message: fmt.Sprintf(format, args...), cause: cause}
}

// WithDetails attaches structured details shown to clients.
func (e *Error) WithDetails(d map[string]any) *Error {
	e.Details = d
	return e
}

// KindOf returns the kind of err, Internal when it has none.
func KindOf(err error) *Kind {
	var e *Error
	if errors.As(err, &e) {
		return e.Kind
	}
	var k *Kind
	if errors.As(err, &k) {
		return k
	}
	if k, _ := hostKind(err); k != nil {
		return k
	}
	return Internal
}

// hostKind classifies the failures of the server's own storage that are
// expected in operation (a full or read-only data directory) so that they
// reach the client as what they are, not as 500 internal.
func hostKind(err error) (*Kind, string) {
	switch {
	case errors.Is(err, syscall.ENOSPC), errors.Is(err, syscall.EDQUOT):
		return InsufficientStorage, "the server's storage is full"
	case errors.Is(err, syscall.EROFS), errors.Is(err, syscall.EIO):
		return Unavailable, "the server's storage cannot take writes"
	}
	return nil, ""
}

// Public returns the client-safe message and details of err. Errors without a
// kind never leak their text: they become a generic internal error.
func Public(err error) (kind *Kind, message string, details map[string]any) {
	var e *Error
	if errors.As(err, &e) {
		return e.Kind, e.Message, e.Details
	}
	var k *Kind
	if errors.As(err, &k) {
		return k, k.Code, nil
	}
	if k, msg := hostKind(err); k != nil {
		return k, msg, nil
	}
	return Internal, "internal error", nil
}
