# SPACE — the two commands a new user needs:
#   make serve   install dependencies, build, and start SPACE with its defaults (as root; data in /var/lib/space)
#   make test    run every test (unit, conformance, end-to-end on every runtime) with -race, then the fuzz smoke

GO ?= go
export PATH := $(PATH):/usr/local/go/bin
# In CI a runtime that cannot run fails its tests instead of skipping them.
ifneq ($(CI),)
export SPACE_REQUIRE_GVISOR ?= 1
export SPACE_REQUIRE_E2B_SDK ?= 1
export SPACE_REQUIRE_VM ?= 1
export SPACE_REQUIRE_POSTGRES ?= 1
export SPACE_REQUIRE_S3 ?= 1
export SPACE_REQUIRE_CHROMIUM ?= 1
# The gvisor end-to-end suites run on PostgreSQL and an S3 bucket; vm and
# the fake runtime stay on SQLite and the data directory.
export SPACE_E2E_BACKENDS ?= production
endif

.PHONY: deps build serve test test-go fuzz-smoke vet soak

deps:
	./scripts/install-deps

build:
	$(GO) build -o bin/space ./cmd/space
	CGO_ENABLED=0 $(GO) build -trimpath -buildvcs=false -o bin/space-agent ./cmd/space-agent

serve: deps build
	./bin/space serve

vet:
	$(GO) vet ./...
	$(GO) vet -tags spacefake ./...
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { echo "gofmt needed:"; gofmt -l $$(git ls-files '*.go'); exit 1; }

test-go:
	$(GO) test -race -count=1 -timeout 55m ./...

fuzz-smoke:
	./scripts/fuzz-smoke

test: vet test-go fuzz-smoke

# The long soak: 1,000 create/exec/write/suspend/wake/delete cycles from 8
# clients on gVisor (make test runs a short one), and 300 server kills.
soak:
	SPACE_SOAK_CYCLES=1000 $(GO) test -count=1 -timeout 3h -run 'TestSoak' -v ./e2e
	SPACE_FAULT_ITERATIONS=300 $(GO) test -count=1 -timeout 3h -run 'TestRealRuntimes/gvisor/FaultInjection' -v ./e2e
