// Package proto is the wire protocol between SPACE and its guest agent: one
// byte stream (virtio-serial, a unix socket, a pipe) carrying length-prefixed
// frames. Every frame holds a JSON header and an optional binary blob, so
// bulk data (output, file contents) travels raw. Calls carry ids chosen by
// the caller and may be answered in any order, so many run concurrently.
//
// Frame layout (big endian):
//
//	u32 length of everything after this field (≤ MaxFrame)
//	u8  type (Hello, Call, Reply)
//	u32 id
//	u32 length of the JSON header
//	... JSON header
//	... blob (the rest)
//
// The host opens with Hello{Versions}; the agent answers Hello{Version,
// Ready}. Then the host sends Calls and the agent Replies with the same id.
package proto

import (
	"bufio"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sync"
)

// Version is the protocol version this build speaks.
const Version = 1

// MaxFrame bounds one frame (header + blob).
const MaxFrame = 4<<20 + 64<<10

// MaxBlob is the largest blob a sender puts in one frame.
const MaxBlob = 4 << 20

// Type is a frame type.
type Type uint8

// The frame types.
const (
	TypeHello Type = 1
	TypeCall  Type = 2
	TypeReply Type = 3
)

// Frame is one decoded frame.
type Frame struct {
	Type   Type
	ID     uint32
	Header []byte // JSON
	Blob   []byte

	pooled *[]byte // the buffer Header and Blob are in, when it is the pool's
}

// Release hands the buffer of a frame read by a Reader with Pool set back
// for the next large frame; Header and Blob must not be used after, and a
// frame is released at most once. A frame never released is collected as
// any other memory.
func (f *Frame) Release() {
	if f.pooled != nil {
		framePool.Put(f.pooled)
		f.pooled = nil
	}
}

// framePool holds the buffers of large frames (output, file contents)
// handed back by Release: a stream of them reuses a few buffers instead of
// allocating (and faulting in, and collecting) one per frame. It holds only
// what was handed back, so a large frame no one releases costs its own
// size, as without a pool.
var framePool sync.Pool // of *[]byte

// frameBuf is a buffer of n bytes for a frame: a handed-back one when the
// pool has one large enough, else a new one of exactly n.
func frameBuf(n int) *[]byte {
	if p, _ := framePool.Get().(*[]byte); p != nil && cap(*p) >= n {
		*p = (*p)[:n]
		return p
	}
	b := make([]byte, n)
	return &b
}

// poolFrom is the smallest frame taken from the pool.
const poolFrom = 64 << 10

// ErrFrame reports a malformed frame; the connection cannot continue.
var ErrFrame = errors.New("malformed agent frame")

// Reader reads frames from a stream.
type Reader struct {
	r   *bufio.Reader
	hdr [13]byte
	// Pool takes large frames' buffers from a pool; their reader hands
	// each back with Frame.Release when done with it.
	Pool bool
}

// NewReader returns a frame reader on r.
func NewReader(r io.Reader) *Reader { return &Reader{r: bufio.NewReaderSize(r, 64<<10)} }

// Read reads one frame. It never allocates more than MaxFrame for it.
func (fr *Reader) Read() (Frame, error) {
	if _, err := io.ReadFull(fr.r, fr.hdr[:4]); err != nil {
		return Frame{}, err
	}
	n := binary.BigEndian.Uint32(fr.hdr[:4])
	if n < 9 || n > MaxFrame {
		return Frame{}, fmt.Errorf("%w: length %d", ErrFrame, n)
	}
	if !fr.Pool || n < poolFrom {
		return fr.read(make([]byte, n))
	}
	pooled := frameBuf(int(n))
	f, err := fr.read(*pooled)
	if err != nil {
		framePool.Put(pooled)
		return Frame{}, err
	}
	f.pooled = pooled
	return f, nil
}

func (fr *Reader) read(buf []byte) (Frame, error) {
	if _, err := io.ReadFull(fr.r, buf); err != nil {
		if errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		return Frame{}, err
	}
	return Parse(buf)
}

// Parse decodes the body of a frame (everything after the length field).
func Parse(buf []byte) (Frame, error) {
	if len(buf) < 9 {
		return Frame{}, fmt.Errorf("%w: short frame", ErrFrame)
	}
	f := Frame{Type: Type(buf[0]), ID: binary.BigEndian.Uint32(buf[1:5])}
	if f.Type < TypeHello || f.Type > TypeReply {
		return Frame{}, fmt.Errorf("%w: unknown type %d", ErrFrame, f.Type)
	}
	hl := binary.BigEndian.Uint32(buf[5:9])
	if uint64(hl) > uint64(len(buf)-9) {
		return Frame{}, fmt.Errorf("%w: header length %d beyond frame", ErrFrame, hl)
	}
	f.Header = buf[9 : 9+hl]
	f.Blob = buf[9+hl:]
	if len(f.Header) == 0 || !json.Valid(f.Header) {
		return Frame{}, fmt.Errorf("%w: header is not JSON", ErrFrame)
	}
	return f, nil
}

// Writer writes frames to a stream; safe for concurrent use.
type Writer struct {
	mu sync.Mutex // serialises whole frames
	w  io.Writer
}

// NewWriter returns a frame writer on w.
func NewWriter(w io.Writer) *Writer { return &Writer{w: w} }

// Write sends one frame whose header is v encoded as JSON.
func (fw *Writer) Write(t Type, id uint32, v any, blob []byte) error {
	h, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("encode frame header: %w", err)
	}
	n := 9 + len(h) + len(blob)
	if n > MaxFrame {
		return fmt.Errorf("frame of %d bytes exceeds %d", n, MaxFrame)
	}
	var pre [13]byte
	binary.BigEndian.PutUint32(pre[0:4], uint32(n))
	pre[4] = byte(t)
	binary.BigEndian.PutUint32(pre[5:9], id)
	binary.BigEndian.PutUint32(pre[9:13], uint32(len(h)))
	fw.mu.Lock()
	defer fw.mu.Unlock()
	// One write per frame where possible (small frames), so a frame is never
	// interleaved and syscalls stay few.
	if len(blob) <= 32<<10 {
		buf := make([]byte, 0, 13+len(h)+len(blob))
		buf = append(append(append(buf, pre[:]...), h...), blob...)
		_, err = fw.w.Write(buf)
		return err
	}
	if _, err := fw.w.Write(append(pre[:], h...)); err != nil {
		return err
	}
	_, err = fw.w.Write(blob)
	return err
}

// Hello is exchanged first in each direction.
type Hello struct {
	// Versions the host speaks (host → agent).
	Versions []int `json:"versions,omitempty"`
	// Version chosen by the agent (agent → host); 0 means none in common.
	Version int `json:"version,omitempty"`
	// Agent identifies the agent build.
	Agent string `json:"agent,omitempty"`
	// Ready is true once the agent can run processes and file calls.
	Ready bool `json:"ready,omitempty"`
	// Nonce (host → agent) is this connection's challenge (the agent echoes
	// it, so a stale answer on a lasting channel is told apart); Proof (agent →
	// host) is Prove(key, Nonce) with the agent's per-boot key, which the
	// host handed it in Bind (host → agent) on the first connection after
	// boot, before any other process in the sandbox existed. A process in
	// the sandbox that dials the host's socket cannot prove it.
	Nonce string `json:"nonce,omitempty"`
	Bind  string `json:"bind,omitempty"`
	Proof string `json:"proof,omitempty"`
	// Redials (agent → host): on SIGCONT the agent looks at its connection
	// and dials the host again if it is gone (agent.ServeUnix). A host
	// that closed the connection without the agent hearing of it (a gVisor
	// checkpoint that leaves the sandbox running) can then get it back.
	Redials bool `json:"redials,omitempty"`
}

// Prove is the proof of holding key for a connection's nonce: hex
// HMAC-SHA256(key, "space-agent\x00" + nonce).
func Prove(key []byte, nonce string) string {
	m := hmac.New(sha256.New, key)
	m.Write([]byte("space-agent\x00" + nonce))
	return hex.EncodeToString(m.Sum(nil))
}

// Call is the header of a call frame.
type Call struct {
	Method string          `json:"method"`
	Params json.RawMessage `json:"params,omitempty"`
}

// Reply is the header of a reply frame.
type Reply struct {
	Result json.RawMessage `json:"result,omitempty"`
	Error  *Error          `json:"error,omitempty"`
}

// Error is a failed call. Code is one of the API's error codes.
type Error struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

func (e *Error) Error() string { return e.Code + ": " + e.Message }

// Error codes the agent uses.
const (
	CodeInvalidArgument    = "invalid_argument"
	CodeNotFound           = "not_found"
	CodeFailedPrecondition = "failed_precondition"
	CodeAlreadyExists      = "conflict"
	CodePermissionDenied   = "permission_denied"
	CodeResourceExhausted  = "resource_exhausted"
	CodeInternal           = "internal"
	CodeUnimplemented      = "unimplemented"
)

// Errorf returns an *Error.
func Errorf(code, format string, args ...any) *Error {
	return &Error{Code: code, Message: fmt.Sprintf(format, args...)}
}
