package ecw

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"connectrpc.com/connect"

	"github.com/spacesandbox/space/internal/commands"
	pb "github.com/spacesandbox/space/internal/ecw/gen/process"
	"github.com/spacesandbox/space/internal/ecw/gen/process/processconnect"
	"github.com/spacesandbox/space/internal/errdefs"
	"github.com/spacesandbox/space/internal/sandboxio"
)

// processService is envd's process.Process on SPACE command sessions.
type processService struct {
	processconnect.UnimplementedProcessHandler
	s *Server
}

var _ processconnect.ProcessHandler = (*processService)(nil)

func (p *processService) Start(ctx context.Context, req *connect.Request[pb.StartRequest], stream *connect.ServerStream[pb.StartResponse]) error {
	sc := sandboxFrom(ctx)
	cfg := req.Msg.GetProcess()
	if cfg == nil || cfg.GetCmd() == "" {
		return errdefs.New(errdefs.InvalidArgument, "process.cmd is required")
	}
	creq := commands.CreateRequest{
		Command: append([]string{cfg.GetCmd()}, cfg.GetArgs()...), Env: cfg.GetEnvs(), Stdin: req.Msg.GetStdin(),
		User: sc.user, Tag: req.Msg.GetTag(),
	}
	if cfg.Cwd != nil && cfg.GetCwd() != "" {
		cwd, err := resolvePath(ctx, sc, cfg.GetCwd())
		if err != nil {
			return err
		}
		creq.Cwd = cwd
	}
	if pty := req.Msg.GetPty(); pty != nil {
		creq.PTY = &commands.PTYRequest{Cols: uint16(pty.GetSize().GetCols()), Rows: uint16(pty.GetSize().GetRows())}
		creq.Stdin = true // a terminal always takes input (envd's does)
	}
	// The request's deadline (the SDK's command timeout) is the process's:
	// the agent kills it then, whether or not anyone still listens.
	if dl, ok := ctx.Deadline(); ok {
		creq.Timeout = time.Until(dl).Round(time.Millisecond).String()
	}
	sess, err := p.s.cfg.Commands.Create(ctx, sc.sb.ID, creq)
	if err != nil {
		return err
	}
	return p.follow(ctx, sc.sb.ID, sess.ProcessID, true, creq.PTY != nil, func(ev *pb.ProcessEvent) error {
		return stream.Send(&pb.StartResponse{Event: ev})
	})
}

func startEvent(pid int) *pb.ProcessEvent {
	return &pb.ProcessEvent{Event: &pb.ProcessEvent_Start{Start: &pb.ProcessEvent_StartEvent{Pid: uint32(pid)}}}
}

// follow streams a process's output as envd events until it ends; with
// start it starts the process and sends its start event first.
func (p *processService) follow(ctx context.Context, sandboxID, processID string, start, pty bool, send func(*pb.ProcessEvent) error) error {
	err := p.s.cfg.Commands.Follow(ctx, sandboxID, processID, 0, p.s.cfg.Keepalive, start, func(ev commands.Event) error {
		switch {
		case ev.Started != nil:
			return send(startEvent(ev.Started.PID))
		case ev.Resync:
			return nil
		case ev.Quiet:
			return send(&pb.ProcessEvent{Event: &pb.ProcessEvent_Keepalive{Keepalive: &pb.ProcessEvent_KeepAlive{}}})
		case ev.Exited != nil:
			return send(&pb.ProcessEvent{Event: &pb.ProcessEvent_End{End: endEvent(ev.Exited)}})
		}
		data := &pb.ProcessEvent_DataEvent{}
		switch {
		case pty:
			data.Output = &pb.ProcessEvent_DataEvent_Pty{Pty: ev.Data}
		case ev.Stream == sandboxio.Stderr:
			data.Output = &pb.ProcessEvent_DataEvent_Stderr{Stderr: ev.Data}
		default:
			data.Output = &pb.ProcessEvent_DataEvent_Stdout{Stdout: ev.Data}
		}
		return send(&pb.ProcessEvent{Event: &pb.ProcessEvent_Data{Data: data}})
	})
	if err != nil && ctx.Err() == nil && !errors.Is(err, errdefs.InvalidArgument) {
		// The sandbox stopped running under the stream (killed, timed out,
		// paused). envd's connection dies with its sandbox, and the SDKs
		// read exactly that — a connection cut, then a health check that
		// answers 502 — as "killed or reached its end of life": end it so.
		p.s.log.Info("E2B process stream cut: the sandbox stopped running", "sandbox_id", sandboxID, "process_id", processID, "err", err)
		panic(http.ErrAbortHandler)
	}
	return err
}

// endEvent is envd's end: exit code, and a status like Go's ProcessState.
func endEvent(ex *sandboxio.Process) *pb.ProcessEvent_EndEvent {
	end := &pb.ProcessEvent_EndEvent{Exited: true}
	code := -1
	if ex.ExitCode != nil {
		code = *ex.ExitCode
	}
	end.ExitCode = int32(code)
	switch {
	case ex.Signal != "":
		end.Status = "signal: " + ex.Signal
		end.Exited = false
	default:
		end.Status = fmt.Sprintf("exit status %d", code)
	}
	if ex.ErrorCode != "" {
		msg := ex.ErrorMessage
		end.Error = &msg
	}
	return end
}

// find resolves a selector (pid or tag) among the running processes.
func (p *processService) find(ctx context.Context, sel *pb.ProcessSelector) (sandboxio.Process, error) {
	sc := sandboxFrom(ctx)
	if sel == nil || sel.Selector == nil {
		return sandboxio.Process{}, errdefs.New(errdefs.InvalidArgument, "process selector (pid or tag) is required")
	}
	ps, err := sc.agent.Processes(ctx)
	if err != nil {
		return sandboxio.Process{}, err
	}
	for _, pr := range ps {
		switch s := sel.Selector.(type) {
		case *pb.ProcessSelector_Pid:
			if pr.PID != 0 && uint32(pr.PID) == s.Pid {
				return pr, nil
			}
		case *pb.ProcessSelector_Tag:
			if pr.Tag != "" && pr.Tag == s.Tag {
				return pr, nil
			}
		}
	}
	switch s := sel.Selector.(type) {
	case *pb.ProcessSelector_Pid:
		return sandboxio.Process{}, errdefs.New(errdefs.NotFound, "process with pid %d not found", s.Pid)
	case *pb.ProcessSelector_Tag:
		return sandboxio.Process{}, errdefs.New(errdefs.NotFound, "process with tag %q not found", s.Tag)
	}
	return sandboxio.Process{}, errdefs.New(errdefs.InvalidArgument, "unknown process selector")
}

// Connect follows a running process: the output the sandbox still retains
// first, then what comes.
func (p *processService) Connect(ctx context.Context, req *connect.Request[pb.ConnectRequest], stream *connect.ServerStream[pb.ConnectResponse]) error {
	pr, err := p.find(ctx, req.Msg.GetProcess())
	if err != nil {
		return err
	}
	if err := stream.Send(&pb.ConnectResponse{Event: startEvent(pr.PID)}); err != nil {
		return err
	}
	return p.follow(ctx, sandboxFrom(ctx).sb.ID, pr.ID, false, pr.PTY, func(ev *pb.ProcessEvent) error {
		return stream.Send(&pb.ConnectResponse{Event: ev})
	})
}

func (p *processService) List(ctx context.Context, _ *connect.Request[pb.ListRequest]) (*connect.Response[pb.ListResponse], error) {
	sc := sandboxFrom(ctx)
	ps, err := sc.agent.Processes(ctx)
	if err != nil {
		return nil, err
	}
	out := &pb.ListResponse{Processes: []*pb.ProcessInfo{}}
	for _, pr := range ps {
		cfg := &pb.ProcessConfig{Envs: map[string]string{}}
		if len(pr.Argv) > 0 {
			cfg.Cmd, cfg.Args = pr.Argv[0], pr.Argv[1:]
		}
		if pr.Cwd != "" {
			cwd := pr.Cwd
			cfg.Cwd = &cwd
		}
		info := &pb.ProcessInfo{Config: cfg, Pid: uint32(pr.PID)}
		if pr.Tag != "" {
			tag := pr.Tag
			info.Tag = &tag
		}
		out.Processes = append(out.Processes, info)
	}
	return connect.NewResponse(out), nil
}

func (p *processService) SendInput(ctx context.Context, req *connect.Request[pb.SendInputRequest]) (*connect.Response[pb.SendInputResponse], error) {
	pr, err := p.find(ctx, req.Msg.GetProcess())
	if err != nil {
		return nil, err
	}
	if err := p.input(ctx, pr.ID, req.Msg.GetInput()); err != nil {
		return nil, err
	}
	return connect.NewResponse(&pb.SendInputResponse{}), nil
}

func (p *processService) input(ctx context.Context, id string, in *pb.ProcessInput) error {
	var data []byte
	switch {
	case in == nil:
		return errdefs.New(errdefs.InvalidArgument, "input is required")
	case in.GetPty() != nil:
		data = in.GetPty()
	default:
		data = in.GetStdin()
	}
	if len(data) == 0 {
		return nil
	}
	return sandboxFrom(ctx).agent.Stdin(ctx, id, data)
}

func (p *processService) StreamInput(ctx context.Context, stream *connect.ClientStream[pb.StreamInputRequest]) (*connect.Response[pb.StreamInputResponse], error) {
	var id string
	for stream.Receive() {
		switch ev := stream.Msg().Event.(type) {
		case *pb.StreamInputRequest_Start:
			pr, err := p.find(ctx, ev.Start.GetProcess())
			if err != nil {
				return nil, err
			}
			id = pr.ID
		case *pb.StreamInputRequest_Data:
			if id == "" {
				return nil, errdefs.New(errdefs.InvalidArgument, "the first message must be start")
			}
			if err := p.input(ctx, id, ev.Data.GetInput()); err != nil {
				return nil, err
			}
		}
	}
	if err := stream.Err(); err != nil {
		return nil, err
	}
	return connect.NewResponse(&pb.StreamInputResponse{}), nil
}

func (p *processService) SendSignal(ctx context.Context, req *connect.Request[pb.SendSignalRequest]) (*connect.Response[pb.SendSignalResponse], error) {
	sig := map[pb.Signal]string{pb.Signal_SIGNAL_SIGKILL: "SIGKILL", pb.Signal_SIGNAL_SIGTERM: "SIGTERM"}[req.Msg.GetSignal()]
	if sig == "" {
		return nil, errdefs.New(errdefs.InvalidArgument, "signal must be SIGNAL_SIGTERM or SIGNAL_SIGKILL")
	}
	pr, err := p.find(ctx, req.Msg.GetProcess())
	if err != nil {
		return nil, err
	}
	if err := sandboxFrom(ctx).agent.Signal(ctx, pr.ID, sig); err != nil {
		return nil, err
	}
	return connect.NewResponse(&pb.SendSignalResponse{}), nil
}

func (p *processService) CloseStdin(ctx context.Context, req *connect.Request[pb.CloseStdinRequest]) (*connect.Response[pb.CloseStdinResponse], error) {
	pr, err := p.find(ctx, req.Msg.GetProcess())
	if err != nil {
		return nil, err
	}
	if err := sandboxFrom(ctx).agent.CloseStdin(ctx, pr.ID); err != nil {
		return nil, err
	}
	return connect.NewResponse(&pb.CloseStdinResponse{}), nil
}

func (p *processService) Update(ctx context.Context, req *connect.Request[pb.UpdateRequest]) (*connect.Response[pb.UpdateResponse], error) {
	pr, err := p.find(ctx, req.Msg.GetProcess())
	if err != nil {
		return nil, err
	}
	if pty := req.Msg.GetPty(); pty != nil {
		cols, rows := pty.GetSize().GetCols(), pty.GetSize().GetRows()
		if cols < 1 || rows < 1 || cols > 10000 || rows > 10000 {
			return nil, errdefs.New(errdefs.InvalidArgument, "pty size must be between 1 and 10000")
		}
		if err := sandboxFrom(ctx).agent.Resize(ctx, pr.ID, uint16(cols), uint16(rows)); err != nil {
			return nil, err
		}
	}
	return connect.NewResponse(&pb.UpdateResponse{}), nil
}
