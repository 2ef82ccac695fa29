package ids

import (
	"strings"
	"testing"
)

func TestNewIsValidAndUnique(t *testing.T) {
	seen := map[string]bool{}
	for i := 0; i < 1000; i++ {
		id := New(Sandbox)
		if !Valid(Sandbox, id) {
			t.Fatalf("New produced invalid id %q", id)
		}
		if Valid(Operation, id) {
			t.Fatalf("sandbox id %q accepted as operation id", id)
		}
		if seen[id] {
			t.Fatalf("duplicate id %q", id)
		}
		seen[id] = true
	}
}

func TestValidRejects(t *testing.T) {
	good := New(Operation)
	for _, s := range []string{
		"", "op_", "op", "sbx_" + good[3:], good + "a", good[:len(good)-1],
		strings.ToUpper(good), "op_" + strings.Repeat("0", 26), "op_" + strings.Repeat("a", 25) + "/",
		"op_" + strings.Repeat("a", 25) + "b", // non-canonical last character
	} {
		if Valid(Operation, s) {
			t.Errorf("Valid(%q) = true", s)
		}
	}
}

func FuzzValid(f *testing.F) {
	f.Add(New(Sandbox))
	f.Add("sbx_")
	f.Add("sbx_\x00")
	f.Fuzz(func(t *testing.T, s string) {
		if Valid(Sandbox, s) {
			if len(s) != len("sbx_")+bodyLen || !strings.HasPrefix(s, "sbx_") {
				t.Fatalf("accepted malformed %q", s)
			}
		}
	})
}
