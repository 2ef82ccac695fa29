package client

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
)

// WaitOperation long-polls; against a server from before ?wait= (which
// refuses the parameter) it polls until the operation is done.
func TestWaitOperationLongPollAndFallback(t *testing.T) {
	for _, old := range []bool{false, true} {
		var gets atomic.Int32
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			if wait := r.URL.Query().Get("wait"); (wait != "") == old || (wait != "" && wait != "25s") || r.URL.Path != "/v1/operations/op_x" {
				// The old server refuses ?wait=; the new one is only ever
				// asked with it (so every read is a long poll).
				w.WriteHeader(400)
				w.Write([]byte(`{"error":{"code":"invalid_argument","message":"unknown query parameter wait"}}`))
				return
			}
			state := "running"
			if gets.Add(1) >= 3 {
				state = "succeeded"
			}
			w.Write([]byte(`{"id":"op_x","kind":"pause","state":"` + state + `"}`))
		}))
		c, err := New(srv.URL, "t")
		if err != nil {
			t.Fatal(err)
		}
		op, err := c.WaitOperation(context.Background(), "op_x")
		srv.Close()
		if err != nil || op.State != "succeeded" || gets.Load() != 3 {
			t.Fatalf("old server %v: %+v %v after %d reads", old, op, err, gets.Load())
		}
	}
	c, _ := New("http://127.0.0.1:1", "t")
	if _, err := c.WaitOperation(context.Background(), ""); err == nil {
		t.Fatal("an empty id is no error")
	}
}
