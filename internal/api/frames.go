package api

import (
	"bufio"
	"encoding/binary"
	"encoding/json"
	"mime"
	"strings"
)

// The data plane's binary event stream (api.md, "Binary stream"): a client
// that asks for Accept: application/octet-stream gets its session's events
// as frames instead of Server-Sent Events — output as raw bytes, without
// base64 or JSON. Every frame is a 13-byte header, big-endian — kind (1
// byte), event id (8 bytes; 0 when the event has none), payload length (4
// bytes) — then the payload: the output bytes for stdout and stderr, the
// same JSON object an SSE event's data carries for resync_required,
// process_exited and error, nothing for a keepalive.
const (
	FrameStdout    = 1
	FrameStderr    = 2
	FrameResync    = 3
	FrameExited    = 4
	FrameError     = 5
	FrameKeepalive = 6

	// FrameHeader is the size of a frame's header.
	FrameHeader = 13
	// FramedType is the binary stream's media type.
	FramedType = "application/octet-stream"
)

// eventWriter writes a session's events in one of the data plane's two
// encodings (sseWriter, frameWriter).
type eventWriter interface {
	output(seq uint64, stream string, data []byte)
	jsonEvent(id, name string, v any)
	ping()
}

// wantsFrames reports whether a client's Accept header prefers the binary
// stream: it names application/octet-stream before any text/event-stream.
func wantsFrames(accept string) bool {
	for _, part := range strings.Split(accept, ",") {
		mt, _, err := mime.ParseMediaType(strings.TrimSpace(part))
		if err != nil {
			continue
		}
		switch mt {
		case FramedType:
			return true
		case "text/event-stream", "*/*", "text/*":
			return false
		}
	}
	return false
}

// frameWriter writes the binary stream.
type frameWriter struct {
	w   *bufio.Writer
	hdr [FrameHeader]byte
}

func (f *frameWriter) frame(kind byte, id uint64, payload []byte) {
	f.hdr[0] = kind
	binary.BigEndian.PutUint64(f.hdr[1:9], id)
	binary.BigEndian.PutUint32(f.hdr[9:13], uint32(len(payload)))
	f.w.Write(f.hdr[:])
	f.w.Write(payload)
}

func (f *frameWriter) output(seq uint64, stream string, data []byte) {
	kind := byte(FrameStdout)
	if stream == "stderr" {
		kind = FrameStderr
	}
	f.frame(kind, seq, data)
}

func (f *frameWriter) jsonEvent(id, name string, v any) {
	kind := map[string]byte{"resync_required": FrameResync, "process_exited": FrameExited, "error": FrameError}[name]
	var seq uint64
	if id != "" {
		seq = parseLastEventID(id).after
	}
	b, _ := json.Marshal(v)
	f.frame(kind, seq, b)
}

func (f *frameWriter) ping() { f.frame(FrameKeepalive, 0, nil) }
