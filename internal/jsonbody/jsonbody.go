// Package jsonbody decodes untrusted JSON request bodies strictly: one value,
// no unknown fields, errors that name what is wrong without echoing input.
// Both HTTP front ends (the native API and the E2B layer) use it, so a body
// is judged the same way whichever door it came through.
package jsonbody

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"

	"github.com/spacesandbox/space/internal/errdefs"
)

// Decode reads one JSON value from r into v. An empty body (or only
// whitespace) leaves v untouched and is not an error; so does `null`,
// JSON's own "no value" (a client serialising an absent body sends it). Errors are
// invalid_argument, or too_large when r is an http.MaxBytesReader that hit
// its limit.
func Decode(r io.Reader, v any) error {
	dec := json.NewDecoder(r)
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		var tooBig *http.MaxBytesError
		switch {
		case errors.As(err, &tooBig):
			return errdefs.New(errdefs.TooLarge, "request body exceeds %d bytes", tooBig.Limit)
		case errors.Is(err, io.EOF):
			return nil
		}
		return errdefs.Wrap(errdefs.InvalidArgument, err, "invalid JSON body: %s", describe(err))
	}
	if _, err := dec.Token(); err != io.EOF {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			return errdefs.New(errdefs.TooLarge, "request body exceeds %d bytes", tooBig.Limit)
		}
		return errdefs.New(errdefs.InvalidArgument, "invalid JSON body: unexpected data after the value")
	}
	return nil
}

// describe turns a decoding error into a short message for the client.
func describe(err error) string {
	var syn *json.SyntaxError
	var typ *json.UnmarshalTypeError
	switch {
	case errors.As(err, &syn):
		return fmt.Sprintf("syntax error at byte %d", syn.Offset)
	case errors.As(err, &typ):
		if typ.Field != "" {
			return fmt.Sprintf("field %s must be %s", typ.Field, typ.Type)
		}
		return fmt.Sprintf("expected %s", typ.Type)
	case errors.Is(err, io.ErrUnexpectedEOF):
		return "unexpected end of input"
	}
	// json reports unknown fields as `json: unknown field "x"`.
	msg := err.Error()
	const p = "json: "
	if len(msg) > len(p) && msg[:len(p)] == p {
		msg = msg[len(p):]
	}
	if len(msg) > 200 {
		msg = msg[:200]
	}
	return msg
}
