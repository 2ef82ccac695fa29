package api

import (
	"bytes"
	"encoding/json"
	"mime"

	"github.com/spacesandbox/space/internal/errdefs"
	"github.com/spacesandbox/space/internal/jsonbody"
)

type errorBody struct {
	Error errorDetail `json:"error"`
}

type errorDetail struct {
	Code    string         `json:"code"`
	Message string         `json:"message"`
	Details map[string]any `json:"details,omitempty"`
}

// errorResponse renders err as the API's error envelope (the Render of its
// listeners' edges). Errors without a
// kind are internal: their text goes to the log, never to the client.
func errorResponse(err error) (int, []byte) {
	kind, msg, details := errdefs.Public(err)
	b, _ := json.Marshal(errorBody{Error: errorDetail{Code: kind.Code, Message: msg, Details: details}})
	return kind.Status, append(b, '\n')
}

// codeOf is the code of an error body errorResponse made ("" if body is
// not one).
func codeOf(body []byte) string {
	var e errorBody
	if json.Unmarshal(body, &e) != nil {
		return ""
	}
	return e.Error.Code
}

// decodeJSON strictly decodes body into v: one JSON object, no unknown
// fields, nothing after it. An empty body leaves v as it is.
func decodeJSON(contentType string, body []byte, v any) error {
	if len(bytes.TrimSpace(body)) == 0 {
		return nil
	}
	if contentType != "" {
		mt, _, err := mime.ParseMediaType(contentType)
		if err != nil || (mt != "application/json" && mt != "application/*+json") {
			return errdefs.New(errdefs.InvalidArgument, "request body must be application/json")
		}
	}
	return jsonbody.Decode(bytes.NewReader(body), v)
}

// errInvalid is an invalid_argument naming a field.
func errInvalid(field, msg string) error {
	return errdefs.New(errdefs.InvalidArgument, "%s: %s", field, msg).WithDetails(map[string]any{"field": field})
}
