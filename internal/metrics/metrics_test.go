package metrics

import (
	"io"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// Requests with made-up methods and statuses (an unauthenticated client
// can send any) must not grow the metrics (issue #14, item 6).
func TestRequestLabelsAreBounded(t *testing.T) {
	m := New()
	for i := 0; i < 200; i++ {
		m.ObserveRequest("api", "unmatched", strings.Repeat("X", 20<<10)+string(rune('A'+i%26)), 400, time.Millisecond)
		m.ObserveRequest("api", "unmatched", "GET", 1000+i, time.Millisecond)
	}
	rec := httptest.NewRecorder()
	m.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	body, _ := io.ReadAll(rec.Body)
	if len(body) > 64<<10 {
		t.Fatalf("metrics grew to %d bytes", len(body))
	}
	if !strings.Contains(string(body), `method="other"`) || !strings.Contains(string(body), `code="other"`) {
		t.Fatalf("unknown methods and codes are not folded into \"other\":\n%s", body)
	}
}
