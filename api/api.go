// Package api holds SPACE's API specification: the OpenAPI 3.1 document of
// the native API, served at GET /openapi-m1.json and checked against the
// implemented routes by the API tests.
package api

import _ "embed"

// OpenAPI is the OpenAPI 3.1 document of the native API.
//
//go:embed openapi-m1.json
var OpenAPI []byte
