package client

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"testing"
)

// The fast path for output events and the general JSON path agree on every
// input: whatever the fast path accepts, JSON decodes the same way.
func FuzzDecodeEvent(f *testing.F) {
	f.Add([]byte(`{"stream":"stdout","data":"aGVsbG8K"}`))
	f.Add([]byte(`{"stream":"stderr","data":""}`))
	f.Add([]byte(`{"stream":"stdout","data":"aGVsbG8K","x":"y"}`))
	f.Add([]byte(`{"stream":"std\"out","data":"aGVsbG8K"}`))
	f.Add([]byte(`{"stream":"stdout","data":"aGVs\u0062G8K"}`))
	f.Add([]byte(`{"stream":"stdout","data":"!!"}`))
	f.Add([]byte("{\"stream\":\"stdout\",\"data\":\"aGVs\rbG8K\"}"))
	f.Fuzz(func(t *testing.T, data []byte) {
		fast := Event{Name: "output"}
		ferr := decodeEvent(&fast, data)
		var raw struct {
			Stream string `json:"stream"`
			Data   string `json:"data"`
		}
		jerr := json.Unmarshal(data, &raw)
		if ferr == nil && jerr != nil {
			t.Fatalf("accepted %q, which is not JSON: %v", data, jerr)
		}
		if ferr != nil || jerr != nil {
			return
		}
		want, err := base64.StdEncoding.DecodeString(raw.Data)
		if err != nil {
			t.Fatalf("accepted %q with bad base64: %v", data, err)
		}
		if fast.Stream != raw.Stream || !bytes.Equal(fast.Data, want) {
			t.Fatalf("%q: got %q %q, JSON says %q %q", data, fast.Stream, fast.Data, raw.Stream, want)
		}
	})
}

func TestDecodeEventFastAndGeneral(t *testing.T) {
	for _, in := range []string{
		`{"stream":"stdout","data":"aGVsbG8K"}`,
		`{"data":"aGVsbG8K","stream":"stdout"}`,
		`{"stream":"stdout","data":"aGVs\u0062G8K"}`,
	} {
		ev := Event{Name: "output"}
		if err := decodeEvent(&ev, []byte(in)); err != nil || ev.Stream != "stdout" || string(ev.Data) != "hello\n" {
			t.Errorf("%s: %+v %v", in, ev, err)
		}
	}
	ev := Event{Name: "output"}
	if err := decodeEvent(&ev, []byte(`{"stream":"stdout","data":"!!!!"}`)); err == nil {
		t.Errorf("bad base64 accepted: %+v", ev)
	}
}
