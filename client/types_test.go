package client

import (
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/spacesandbox/space/internal/commands"
	"github.com/spacesandbox/space/internal/lifecycle"
	"github.com/spacesandbox/space/internal/sandbox"
	"github.com/spacesandbox/space/internal/sandboxio"
	"github.com/spacesandbox/space/internal/store"
	"github.com/spacesandbox/space/internal/templates"
	"github.com/spacesandbox/space/internal/usage"
)

// The client decodes into types of its own: each must carry every field
// the server writes of the same object, or `space … --json` and the
// client's users silently lose it. (Tokens and nodes are rendered by the
// API from types of its own, not compared here.)
func TestClientTypesCarryEveryFieldTheServerSends(t *testing.T) {
	for _, c := range []struct{ server, client any }{
		{sandbox.Sandbox{}, Sandbox{}},
		{sandbox.Snapshot{}, Snapshot{}},
		{sandbox.Operation{}, Operation{}},
		{sandbox.Resources{}, Resources{}},
		{sandbox.AutoLifecycle{}, AutoLifecycle{}},
		{sandbox.Network{}, Network{}},
		{sandbox.ErrorInfo{}, ErrorInfo{}},
		{store.Project{}, Project{}},
		{store.Quotas{}, Quotas{}},
		{store.AuditEntry{}, AuditEntry{}},
		{sandboxio.Entry{}, Entry{}},
		{commands.Process{}, Process{}},
		{templates.Template{}, Template{}},
		{lifecycle.WarmPool{}, WarmPool{}},
		{usage.Sample{}, MetricSample{}},
	} {
		have := jsonFields(reflect.TypeOf(c.client))
		for _, f := range jsonFields(reflect.TypeOf(c.server)) {
			if !slices.Contains(have, f) {
				t.Errorf("client.%T lacks %q, which the server sends", c.client, f)
			}
		}
	}
}

func jsonFields(t reflect.Type) []string {
	var out []string
	for i := range t.NumField() {
		f := t.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if f.Anonymous && name == "" && f.Type.Kind() == reflect.Struct {
			out = append(out, jsonFields(f.Type)...) // encoding/json flattens it
			continue
		}
		if !f.IsExported() || name == "-" {
			continue
		}
		if name == "" {
			name = f.Name
		}
		out = append(out, name)
	}
	return out
}
