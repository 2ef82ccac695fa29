package agent

import (
	"context"
	"encoding/json"

	"github.com/spacesandbox/space/internal/agent/proto"
)

// method runs one call: its raw params, the request's blob → result, blob.
type method func(a *Agent, ctx context.Context, params json.RawMessage, blob []byte) (any, []byte, error)

// call makes a method of fn: the params are decoded strictly into P first
// (a malformed one is invalid_argument and fn is not run). Methods that take
// no params use json.RawMessage.
func call[P any](fn func(a *Agent, ctx context.Context, p P, blob []byte) (any, []byte, error)) method {
	return func(a *Agent, ctx context.Context, params json.RawMessage, blob []byte) (any, []byte, error) {
		p, err := decode[P](params)
		if err != nil {
			return nil, nil, err
		}
		return fn(a, ctx, p, blob)
	}
}

// done is the answer of a call that returns nothing but its error.
func done(err error) (any, []byte, error) {
	if err != nil {
		return nil, nil, err
	}
	return proto.Empty{}, nil, nil
}

// reply is the answer of a call that returns a value without a blob.
func reply[T any](v T, err error) (any, []byte, error) {
	if err != nil {
		return nil, nil, err
	}
	return v, nil, nil
}

// methods is the agent's protocol: every method it serves.
var methods = map[string]method{
	proto.MethodInfo: call(func(a *Agent, _ context.Context, _ json.RawMessage, _ []byte) (any, []byte, error) {
		return a.info(), nil, nil
	}),
	proto.MethodConfigure: call(func(a *Agent, _ context.Context, p proto.Configure, entropy []byte) (any, []byte, error) {
		if err := configure(p, entropy); err != nil {
			return nil, nil, err
		}
		return a.info(), nil, nil
	}),
	proto.MethodWatchStart: call(func(a *Agent, _ context.Context, p proto.WatchRequest, _ []byte) (any, []byte, error) {
		return reply(a.watchStart(p))
	}),
	proto.MethodWatchRead: call(func(a *Agent, ctx context.Context, p proto.WatchRead, _ []byte) (any, []byte, error) {
		return reply(a.watchRead(ctx, p))
	}),
	proto.MethodWatchStop: call(func(a *Agent, _ context.Context, p proto.WatchHandle, _ []byte) (any, []byte, error) {
		return done(a.watchStop(p.ID))
	}),
	proto.MethodMetrics: call(func(a *Agent, _ context.Context, _ json.RawMessage, _ []byte) (any, []byte, error) {
		return reply(a.metrics())
	}),
	proto.MethodSync: call(func(*Agent, context.Context, json.RawMessage, []byte) (any, []byte, error) {
		syncFilesystems()
		return done(nil)
	}),

	proto.MethodProcCreate: call(func(a *Agent, _ context.Context, p proto.ProcessSpec, _ []byte) (any, []byte, error) {
		return reply(a.create(p))
	}),
	proto.MethodProcStart: call(func(a *Agent, _ context.Context, p proto.StartRequest, _ []byte) (any, []byte, error) {
		return reply(a.startFor(p))
	}),
	proto.MethodProcGet: call(func(a *Agent, _ context.Context, p proto.ProcessRef, _ []byte) (any, []byte, error) {
		proc, err := a.lookup(p.ID)
		if err != nil {
			return nil, nil, err
		}
		return proc.status(), nil, nil
	}),
	proto.MethodProcList: call(func(a *Agent, _ context.Context, _ json.RawMessage, _ []byte) (any, []byte, error) {
		return a.list(), nil, nil
	}),
	proto.MethodProcRead: call(func(a *Agent, ctx context.Context, p proto.ReadRequest, _ []byte) (any, []byte, error) {
		return a.read(ctx, p)
	}),
	proto.MethodProcSignal: call(func(a *Agent, ctx context.Context, p proto.SignalRequest, _ []byte) (any, []byte, error) {
		return done(a.signalProcess(ctx, p.ID, p.Signal))
	}),
	proto.MethodProcStdin: call(func(a *Agent, _ context.Context, p proto.ProcessRef, data []byte) (any, []byte, error) {
		return done(a.stdin(p.ID, data, false))
	}),
	proto.MethodProcClose: call(func(a *Agent, _ context.Context, p proto.ProcessRef, _ []byte) (any, []byte, error) {
		return done(a.stdin(p.ID, nil, true))
	}),
	proto.MethodProcResize: call(func(a *Agent, _ context.Context, p proto.ResizeRequest, _ []byte) (any, []byte, error) {
		return done(a.resize(p))
	}),
	proto.MethodProcHold: call(func(a *Agent, _ context.Context, h proto.HoldRequest, _ []byte) (any, []byte, error) {
		return done(a.hold(h))
	}),

	proto.MethodFileStat: call(func(a *Agent, _ context.Context, p proto.PathRequest, _ []byte) (any, []byte, error) {
		return reply(a.stat(p.Path))
	}),
	proto.MethodFileList: call(func(a *Agent, _ context.Context, p proto.ListRequest, _ []byte) (any, []byte, error) {
		return a.listDir(p)
	}),
	proto.MethodFileRead: call(func(a *Agent, _ context.Context, p proto.ReadFileRequest, _ []byte) (any, []byte, error) {
		return a.readFile(p)
	}),
	proto.MethodFileWriteBegin: call(func(a *Agent, _ context.Context, p proto.WriteBegin, _ []byte) (any, []byte, error) {
		return reply(a.writeBegin(p))
	}),
	proto.MethodFileWriteChunk: call(func(a *Agent, _ context.Context, p proto.WriteChunk, data []byte) (any, []byte, error) {
		return done(a.writeChunk(p, data))
	}),
	proto.MethodFileWriteCommit: call(func(a *Agent, _ context.Context, p proto.WriteHandle, _ []byte) (any, []byte, error) {
		return reply(a.writeCommit(p.Handle))
	}),
	proto.MethodFileWriteAbort: call(func(a *Agent, _ context.Context, p proto.WriteHandle, _ []byte) (any, []byte, error) {
		a.writeAbort(p.Handle)
		return done(nil)
	}),
	proto.MethodFileRemove: call(func(a *Agent, _ context.Context, p proto.RemoveRequest, _ []byte) (any, []byte, error) {
		return done(a.remove(p))
	}),
	proto.MethodFileMkdir: call(func(a *Agent, _ context.Context, p proto.MkdirRequest, _ []byte) (any, []byte, error) {
		return reply(a.mkdir(p))
	}),
	proto.MethodFileMove: call(func(a *Agent, _ context.Context, p proto.MoveRequest, _ []byte) (any, []byte, error) {
		return reply(a.move(p))
	}),
}

// dispatch runs one call and returns its result and blob.
func (a *Agent) dispatch(ctx context.Context, c proto.Call, blob []byte) (any, []byte, error) {
	m, ok := methods[c.Method]
	if !ok {
		return nil, nil, proto.Errorf(proto.CodeUnimplemented, "unknown method %q", c.Method)
	}
	res, out, err := m(a, ctx, c.Params, blob)
	a.trim.carried(len(blob) + len(out))
	return res, out, err
}
