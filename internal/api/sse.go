package api

import (
	"bufio"
	"encoding/json"
	"strconv"
	"strings"

	"github.com/spacesandbox/space/internal/b64"
)

// MaxEventID is the largest event id that still carries a chunk's position
// (api.md: after 2^33 − 1 chunks, ids no longer do).
const MaxEventID = 1<<33 - 1

// lastEventID is a parsed Last-Event-ID header.
type lastEventID struct {
	after  uint64 // resume after this chunk
	resync bool   // the id carries no position: replay what is retained
}

// parseLastEventID reads a Last-Event-ID exactly as a client received it.
// Empty means from the start. Anything that is not an id we issued (not a
// decimal, too long, beyond MaxEventID, or MaxEventID itself, which no longer
// names a position) asks for a resync.
func parseLastEventID(v string) lastEventID {
	if v == "" {
		return lastEventID{}
	}
	if len(v) > 20 || strings.TrimSpace(v) != v {
		return lastEventID{resync: true}
	}
	n, err := strconv.ParseUint(v, 10, 64)
	if err != nil || n >= MaxEventID || (len(v) > 1 && v[0] == '0') {
		return lastEventID{resync: true}
	}
	return lastEventID{after: n}
}

// eventID renders a chunk's sequence number as an event id.
func eventID(seq uint64) string {
	if seq >= MaxEventID {
		return strconv.FormatUint(MaxEventID, 10)
	}
	return strconv.FormatUint(seq, 10)
}

// sseWriter writes Server-Sent Events.
type sseWriter struct {
	w   *bufio.Writer
	b64 []byte
}

func (s *sseWriter) event(id, name string, data []byte) {
	if id != "" {
		s.w.WriteString("id: ")
		s.w.WriteString(id)
		s.w.WriteByte('\n')
	}
	s.w.WriteString("event: ")
	s.w.WriteString(name)
	s.w.WriteString("\ndata: ")
	s.w.Write(data)
	s.w.WriteString("\n\n")
}

// output writes one output event with its bytes base64-encoded.
func (s *sseWriter) output(seq uint64, stream string, data []byte) {
	n := b64.EncodedLen(len(data))
	if cap(s.b64) < n {
		s.b64 = make([]byte, n)
	}
	buf := s.b64[:n]
	b64.Encode(buf, data)
	s.w.WriteString("id: ")
	s.w.WriteString(eventID(seq))
	s.w.WriteString("\nevent: output\ndata: {\"stream\":\"")
	s.w.WriteString(stream) // stdout or stderr: never needs escaping
	s.w.WriteString("\",\"data\":\"")
	s.w.Write(buf)
	s.w.WriteString("\"}\n\n")
}

func (s *sseWriter) jsonEvent(id, name string, v any) {
	b, _ := json.Marshal(v)
	s.event(id, name, b)
}

func (s *sseWriter) ping() { s.w.WriteString(": ping\n\n") }
