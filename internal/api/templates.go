package api

import (
	"context"
	"errors"
	"io"
	"mime"
	"net/http"
	"os"
	"syscall"

	"github.com/spacesandbox/space/internal/auth"
	"github.com/spacesandbox/space/internal/edge"
	"github.com/spacesandbox/space/internal/errdefs"
	"github.com/spacesandbox/space/internal/sandbox"
	"github.com/spacesandbox/space/internal/templates"
)

// TemplateBuilder builds and imports templates (the template store).
type TemplateBuilder interface {
	TemplateLister
	BuildSpec(ctx context.Context, spec templates.Spec, progress io.Writer) (templates.Template, error)
	ImportOCI(ctx context.Context, archive, name, tag string, progress io.Writer) (templates.Template, error)
	// ScratchDir is where uploads wait for their build.
	ScratchDir() string
}

// MaxImageUpload bounds an uploaded image archive.
const MaxImageUpload int64 = 16 << 30

// createTemplate builds a template from a JSON spec, or imports an image
// archive (Content-Type application/x-tar, ?name=&tag=). Both run as an
// operation of kind build.
func (s *Server) createTemplate(w http.ResponseWriter, r *http.Request, p params) error {
	if s.builder == nil {
		return errdefs.New(errdefs.Unavailable, "this server has no template store")
	}
	mt, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type"))
	if mt == "application/x-tar" {
		return s.importTemplate(w, r)
	}
	return s.mutate(w, r, func(body []byte, i *idem) (response, error) {
		if _, err := query(r); err != nil {
			return response{}, err
		}
		var spec templates.Spec
		if err := decodeJSON(r.Header.Get("Content-Type"), body, &spec); err != nil {
			return response{}, err
		}
		if err := spec.Validate(); err != nil {
			return response{}, err
		}
		if err := s.templateVisible(r.Context(), auth.Project(r.Context()), templateName(spec.Base)); err != nil {
			return response{}, err
		}
		if _, err := s.builder.Get(spec.Base); err != nil {
			return response{}, err
		}
		if err := s.claimName(r.Context(), spec.Name); err != nil {
			return response{}, err
		}
		ref := spec.Name + ":" + spec.Tag
		build := func(_ *sandbox.Sandbox, op *sandbox.Operation) any { return operationResponse{Operation: op} }
		op, err := s.engine.StartBuild(r.Context(), auth.Project(r.Context()), ref, i.render(http.StatusAccepted, operationLocation, build), func(ctx context.Context) error {
			_, err := s.builder.BuildSpec(ctx, spec, io.Discard)
			return err
		})
		if err != nil {
			return response{}, err
		}
		b, err := edge.Marshal(build(nil, op))
		return response{status: http.StatusAccepted, body: b, location: operationLocation(nil, op)}, err
	})
}

// importTemplate streams an image archive to disk and imports it in the
// background. The upload is not held in memory.
func (s *Server) importTemplate(w http.ResponseWriter, r *http.Request) error {
	q, err := query(r, "name", "tag")
	if err != nil {
		return err
	}
	name, tag := q.Get("name"), q.Get("tag")
	if tag == "" {
		tag = "latest"
	}
	if _, _, err := templates.ParseRef(name + ":" + tag); err != nil || name == "" {
		return errdefs.New(errdefs.InvalidArgument, "name and tag query parameters must name the template, like ?name=mine&tag=v1")
	}
	if err := s.claimName(r.Context(), name); err != nil {
		return err
	}
	f, err := os.CreateTemp(s.builder.ScratchDir(), "upload-*.tar")
	if err != nil {
		return err
	}
	keep := false
	defer func() {
		if !keep {
			os.Remove(f.Name())
		}
	}()
	_, err = io.Copy(f, http.MaxBytesReader(w, r.Body, MaxImageUpload))
	f.Close()
	var tooBig *http.MaxBytesError
	if errors.As(err, &tooBig) {
		return errdefs.New(errdefs.TooLarge, "image archive exceeds %d bytes", MaxImageUpload)
	}
	if err != nil && (errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT)) {
		return err // the server's disk, not the client: 507
	}
	if err != nil {
		return errdefs.Wrap(errdefs.InvalidArgument, err, "reading the upload failed")
	}
	archive := f.Name()
	op, err := s.engine.StartBuild(r.Context(), auth.Project(r.Context()), name+":"+tag, nil, func(ctx context.Context) error {
		defer os.Remove(archive)
		_, err := s.builder.ImportOCI(ctx, archive, name, tag, io.Discard)
		return err
	})
	if err != nil {
		return err
	}
	keep = true
	b, err := edge.Marshal(operationResponse{Operation: op})
	if err != nil {
		return err
	}
	writeResponse(w, response{status: http.StatusAccepted, body: b, location: operationLocation(nil, op)}, false)
	return nil
}
