# SPACE — the two commands a new user needs:
#   make serve   build and start SPACE with its defaults (as root: data in /var/lib/space)
#   make test    run every test (unit, conformance, end-to-end) with -race, then the fuzz smoke

GO ?= go
export PATH := $(PATH):/usr/local/go/bin

.PHONY: build serve test test-go fuzz-smoke vet

build:
	$(GO) build -o bin/space ./cmd/space

serve: build
	./bin/space serve

vet:
	$(GO) vet ./...
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { echo "gofmt needed:"; gofmt -l $$(git ls-files '*.go'); exit 1; }

test-go:
	$(GO) test -race -count=1 ./...

fuzz-smoke:
	./scripts/fuzz-smoke

test: vet test-go fuzz-smoke
