// Package ids makes and checks SPACE's resource identifiers: a typed prefix
// (sbx_, op_, proc_, tok_) followed by 26 characters of lowercase base32 from
// 128 random bits. Ids are never reused and never empty.
package ids

import (
	"crypto/rand"
	"encoding/base32"
	"fmt"
	"strings"
)

// Prefix names the kind of resource an id belongs to.
type Prefix string

// The id kinds.
const (
	Sandbox   Prefix = "sbx_"
	Operation Prefix = "op_"
	Process   Prefix = "proc_"
	Token     Prefix = "tok_"
	Snapshot  Prefix = "snap_"
	Node      Prefix = "node_"
)

const (
	alphabet = "abcdefghijklmnopqrstuvwxyz234567"
	bodyLen  = 26 // ceil(128 / 5)
)

var encoding = base32.NewEncoding(alphabet).WithPadding(base32.NoPadding)

// New returns a fresh random id with prefix p.
func New(p Prefix) string {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(fmt.Sprintf("ids: crypto/rand failed: %v", err)) // never happens on Linux ≥ 3.17
	}
	return string(p) + encoding.EncodeToString(b[:])
}

// Valid reports whether s is a well-formed id of kind p.
func Valid(p Prefix, s string) bool {
	body, ok := strings.CutPrefix(s, string(p))
	if !ok || len(body) != bodyLen {
		return false
	}
	for i := 0; i < len(body); i++ {
		if strings.IndexByte(alphabet, body[i]) < 0 {
			return false
		}
	}
	// The last character carries only 3 bits: reject non-canonical encodings so
	// one id has exactly one spelling.
	_, err := encoding.DecodeString(body)
	return err == nil && encoding.EncodeToString(mustDecode(body)) == body
}

func mustDecode(s string) []byte {
	b, _ := encoding.DecodeString(s)
	return b
}
