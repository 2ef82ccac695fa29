package api

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"
	"testing"

	"github.com/santhosh-tekuri/jsonschema/v6"

	apispec "github.com/spacesandbox/space/api"
)

func loadSpec(t *testing.T) map[string]any {
	t.Helper()
	var doc map[string]any
	if err := json.Unmarshal(apispec.OpenAPI, &doc); err != nil {
		t.Fatalf("openapi-m1.json is not JSON: %v", err)
	}
	if doc["openapi"] != "3.1.0" {
		t.Fatalf("openapi version = %v", doc["openapi"])
	}
	return doc
}

// Every implemented route is documented and every documented route exists.
func TestOpenAPIMatchesRoutes(t *testing.T) {
	doc := loadSpec(t)
	documented := map[string]bool{}
	for path, item := range doc["paths"].(map[string]any) {
		for method := range item.(map[string]any) {
			documented[strings.ToUpper(method)+" "+path] = true
		}
	}
	implemented := map[string]bool{}
	for _, r := range append((&Server{}).Routes(), (&DataPlane{}).Routes()...) {
		implemented[r.Method+" "+r.Pattern] = true
	}
	var missing, extra []string
	for k := range implemented {
		if !documented[k] {
			missing = append(missing, k)
		}
	}
	for k := range documented {
		if !implemented[k] {
			extra = append(extra, k)
		}
	}
	sort.Strings(missing)
	sort.Strings(extra)
	if len(missing) > 0 || len(extra) > 0 {
		t.Fatalf("routes not in the OpenAPI document: %v\ndocumented routes not implemented: %v", missing, extra)
	}
}

// Every example in the document validates against its schema.
func TestOpenAPIExamplesValidate(t *testing.T) {
	doc := loadSpec(t)
	c := jsonschema.NewCompiler()
	c.DefaultDraft(jsonschema.Draft2020)
	const base = "https://space.invalid/openapi-m1.json"
	raw, err := jsonschema.UnmarshalJSON(bytes.NewReader(apispec.OpenAPI))
	if err != nil {
		t.Fatal(err)
	}
	if err := c.AddResource(base, raw); err != nil {
		t.Fatal(err)
	}
	n := 0
	check := func(where string, content map[string]any, schemaPtr string) {
		for mt, v := range content {
			media := v.(map[string]any)
			if _, ok := media["schema"]; !ok || !strings.Contains(mt, "json") {
				continue
			}
			sch, err := c.Compile(base + "#" + schemaPtr + "/content/" + escape(mt) + "/schema")
			if err != nil {
				t.Fatalf("%s: compile schema: %v", where, err)
			}
			exs, _ := media["examples"].(map[string]any)
			for name, ex := range exs {
				val := ex.(map[string]any)["value"]
				// Round-trip through the validator's own decoder for numbers.
				b, _ := json.Marshal(val)
				inst, _ := jsonschema.UnmarshalJSON(bytes.NewReader(b))
				if err := sch.Validate(inst); err != nil {
					t.Errorf("%s example %q does not validate: %v", where, name, err)
				}
				n++
			}
		}
	}
	for path, item := range doc["paths"].(map[string]any) {
		for method, o := range item.(map[string]any) {
			op := o.(map[string]any)
			ptr := "/paths/" + escape(path) + "/" + method
			if rb, ok := op["requestBody"].(map[string]any); ok {
				check(fmt.Sprintf("%s %s request", method, path), rb["content"].(map[string]any), ptr+"/requestBody")
			}
			for code, r := range op["responses"].(map[string]any) {
				resp := r.(map[string]any)
				if content, ok := resp["content"].(map[string]any); ok {
					check(fmt.Sprintf("%s %s %s", method, path, code), content, ptr+"/responses/"+code)
				}
			}
		}
	}
	if n < 20 {
		t.Fatalf("only %d examples checked", n)
	}
}

// escape makes a JSON Pointer token (RFC 6901) safe inside a URI fragment.
func escape(s string) string {
	s = strings.ReplaceAll(s, "~", "~0")
	s = strings.ReplaceAll(s, "/", "~1")
	s = strings.ReplaceAll(s, "{", "%7B")
	s = strings.ReplaceAll(s, "}", "%7D")
	return s
}

// An error without a kind is a 500 whose message reveals nothing.
func TestUnkindedErrorsDoNotLeak(t *testing.T) {
	status, body := errorResponse(fmt.Errorf("open /var/lib/space/secret: %w", errors.New("permission denied")))
	if status != 500 || strings.Contains(string(body), "secret") || !strings.Contains(string(body), `"code":"internal"`) {
		t.Fatalf("errorResponse = %d %s", status, body)
	}
}
