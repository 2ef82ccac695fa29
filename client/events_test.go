package client

import (
	"bytes"
	"encoding/base64"
	"encoding/binary"
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
		ferr := decodeEvent(&fast, data, nil)
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
		if err := decodeEvent(&ev, []byte(in), nil); err != nil || ev.Stream != "stdout" || string(ev.Data) != "hello\n" {
			t.Errorf("%s: %+v %v", in, ev, err)
		}
	}
	ev := Event{Name: "output"}
	if err := decodeEvent(&ev, []byte(`{"stream":"stdout","data":"!!!!"}`), nil); err == nil {
		t.Errorf("bad base64 accepted: %+v", ev)
	}
}

// frame is one frame of the binary stream as the server writes it.
func frame(kind byte, id uint64, payload string) []byte {
	var hdr [frameHeader]byte
	hdr[0] = kind
	binary.BigEndian.PutUint64(hdr[1:9], id)
	binary.BigEndian.PutUint32(hdr[9:13], uint32(len(payload)))
	return append(hdr[:], payload...)
}

// The binary stream's reader: raw output with ids, keepalives skipped, the
// terminal event returned; truncated or malformed streams are errors.
func TestReadFrames(t *testing.T) {
	stream := bytes.Join([][]byte{
		frame(6, 0, ""), frame(1, 1, "hi\n"), frame(2, 2, "oops"), frame(3, 2, `{"message":"m"}`),
		frame(4, 0, `{"exit_code":3}`), frame(1, 9, "never read"),
	}, nil)
	var got []Event
	term, last, err := readFrames(bytes.NewReader(stream), "", func(ev Event) error { got = append(got, ev); return nil })
	if err != nil || term == nil || term.Name != "process_exited" || term.ExitCode == nil || *term.ExitCode != 3 || last != "2" {
		t.Fatalf("term %+v last %q err %v", term, last, err)
	}
	if len(got) != 4 || got[0].Stream != "stdout" || string(got[0].Data) != "hi\n" || got[0].ID != "1" ||
		got[1].Stream != "stderr" || string(got[1].Data) != "oops" || got[2].Name != "resync_required" {
		t.Fatalf("events %+v", got)
	}
	for _, bad := range [][]byte{stream[:20], frame(0, 0, ""), frame(9, 0, ""), frame(5, 0, "{"), append(frame(1, 1, "")[:9], 0xff, 0xff, 0xff, 0xff)} {
		if _, _, err := readFrames(bytes.NewReader(bad), "", func(Event) error { return nil }); err == nil {
			t.Fatalf("%x: no error", bad)
		}
	}
}

// No byte sequence makes the frame reader panic or return an event it did
// not read whole.
func FuzzReadFrames(f *testing.F) {
	f.Add(frame(1, 1, "hi"))
	f.Add(append(frame(2, 7, "x"), frame(4, 0, `{"exit_code":0}`)...))
	f.Add(frame(5, 0, `{"code":"internal","message":"m"}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		readFrames(bytes.NewReader(b), "", func(ev Event) error {
			if ev.Name == "output" && ev.Stream != "stdout" && ev.Stream != "stderr" {
				t.Fatalf("output event on stream %q", ev.Stream)
			}
			return nil
		})
	})
}
