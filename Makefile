SHELL := /bin/bash
# Tandem's build. `make test` is what CI runs; `make demo` runs the main job.
GO        ?= go
# go.mod names the toolchain the project builds with (go1.26.10: the Go
# releases before it carry standard-library vulnerabilities that the code
# reaches, which `make vulncheck` reports). Debian's and go.dev's Go ship with
# GOTOOLCHAIN=local, which ignores that line; auto fetches the named release
# through the module proxy once. GOTOOLCHAIN=local make ... builds with the
# installed Go instead (vulncheck then fails on an older one).
export GOTOOLCHAIN ?= auto
# Packages whose tests exercise goroutines, sockets and processes run under -race.
RACE_PKGS  = ./comm/... ./graph/... ./ops/... ./ddp/... ./rpc/... ./rref/... ./autograd/... ./cmd/... ./data/... ./examples/... ./internal/rpctest/...
# Everything else (numerical packages whose tests are heavy under -race):
# every package of the module that the race list does not name.

# Each fuzz target's budget, in executions: a budget in seconds can end in a
# spurious "context deadline exceeded" failure when it runs out (a race in
# Go 1.26's fuzzing coordinator), a count cannot. 30000 runs take 1-8 s here.
FUZZTIME  ?= 30000x
# Build tag for the OpenBLAS path (internal/blas) when libopenblas-dev is
# installed; empty (pure-Go gonum BLAS) otherwise. Override with TAGS=.
TAGS      ?= $(shell printf '#include <cblas.h>\n' | $${CC:-cc} -E -x c - >/dev/null 2>&1 && \
               ldconfig -p 2>/dev/null | grep -q libopenblas && echo openblas)
TAGFLAG    = $(if $(TAGS),-tags $(TAGS))
GOTESTFLAGS ?= -count=1 -timeout 9m
# The flight recorder dumps every group that aborts (comm), and many tests
# abort groups on purpose: their dumps go to one folder, emptied before the
# tests, rather than a folder a process under $$TMPDIR.
TEST_FLIGHT_DIR ?= $(or $(TMPDIR),/tmp)/tandem-test-flight

# Tools `make test` runs, at pinned versions, built from the Go module proxy
# into bin/tools by the rules below (nothing else to install; `make tools`
# alone fetches them). Bump a version here to update its tool.
TOOLS_DIR            = $(CURDIR)/bin/tools
# honnef.co/go/tools (staticcheck 2026.2.2) and golang.org/x/vuln:
STATICCHECK_VERSION  = v0.8.2
GOVULNCHECK_VERSION  = v1.9.0
# govulncheck's database, offline: vuln.go.dev is out of reach here, but the
# reports it is built from are a Go module (golang.org/x/vulndb, data/osv/*.json),
# which the module proxy serves; its own cmd/indexdb turns them into the
# database layout govulncheck reads with -db file://. A pseudo-version pins
# the reports as of its date: to refresh, set it to the version that
# `go list -m golang.org/x/vulndb@latest` prints.
VULNDB_VERSION       = v0.0.0-20261105234957-e22db6528018
STATICCHECK          = $(TOOLS_DIR)/staticcheck-$(STATICCHECK_VERSION)
GOVULNCHECK          = $(TOOLS_DIR)/govulncheck-$(GOVULNCHECK_VERSION)
INDEXDB              = $(TOOLS_DIR)/indexdb-$(VULNDB_VERSION)
VULNDB               = $(TOOLS_DIR)/vulndb-$(VULNDB_VERSION)
# staticcheck checks every package but those named in STATICCHECK_SKIP
# (none today: keep it that way).
STATICCHECK_SKIP    ?=
STATICCHECK_PKGS     = $$($(GO) list ./... | grep -vxF -e _ $(addprefix -e github.com/tandemml/tandem/,$(STATICCHECK_SKIP)))

.PHONY: check-cuda demo-elastic all build vet fmt-check tidy-check staticcheck vulncheck tools test test-race test-plain test-blas test-purego fuzz demo demo-collectives bench clean

all: build

build:
	$(GO) build ./...

vet:
	$(GO) vet ./...

fmt-check:
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	if [ -n "$$out" ]; then echo "gofmt needed on:"; echo "$$out"; exit 1; fi

test: vet fmt-check tidy-check staticcheck vulncheck test-race test-plain test-blas test-purego fuzz

# go.mod and go.sum as `go mod tidy` would write them (a direct dependency
# marked indirect, a stale checksum, fail here).
tidy-check:
	$(GO) mod tidy -diff

tools: $(STATICCHECK) $(GOVULNCHECK) $(VULNDB)/index/db.json

# `go install pkg@version` builds each tool in its own module, outside this
# one: go.mod is left alone. The version is in the file's name, so a bumped
# version installs afresh.
$(STATICCHECK):
	mkdir -p $(TOOLS_DIR)/tmp-staticcheck
	GOBIN=$(TOOLS_DIR)/tmp-staticcheck $(GO) install honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION)
	mv $(TOOLS_DIR)/tmp-staticcheck/staticcheck $@ && rmdir $(TOOLS_DIR)/tmp-staticcheck

$(GOVULNCHECK):
	mkdir -p $(TOOLS_DIR)/tmp-govulncheck
	GOBIN=$(TOOLS_DIR)/tmp-govulncheck $(GO) install golang.org/x/vuln/cmd/govulncheck@$(GOVULNCHECK_VERSION)
	mv $(TOOLS_DIR)/tmp-govulncheck/govulncheck $@ && rmdir $(TOOLS_DIR)/tmp-govulncheck

$(INDEXDB):
	mkdir -p $(TOOLS_DIR)/tmp-indexdb
	GOBIN=$(TOOLS_DIR)/tmp-indexdb $(GO) install golang.org/x/vulndb/cmd/indexdb@$(VULNDB_VERSION)
	mv $(TOOLS_DIR)/tmp-indexdb/indexdb $@ && rmdir $(TOOLS_DIR)/tmp-indexdb

# The reports come from the module cache (`go mod download`, run outside this
# module so that go.sum is left alone); indexdb writes the database.
$(VULNDB)/index/db.json: | $(INDEXDB)
	src=$$(cd "$${TMPDIR:-/tmp}" && GOFLAGS= GOWORK=off GO111MODULE=on $(GO) mod download -json golang.org/x/vulndb@$(VULNDB_VERSION) | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$$/\1/p'); \
	  test -d "$$src/data/osv" || { echo "vulncheck: golang.org/x/vulndb@$(VULNDB_VERSION) has no data/osv"; exit 1; }; \
	  rm -rf $(VULNDB).tmp && $(INDEXDB) -vulns "$$src/data/osv" -out $(VULNDB).tmp && rm -rf $(VULNDB) && mv $(VULNDB).tmp $(VULNDB)

staticcheck: $(STATICCHECK)
	$(STATICCHECK) $(STATICCHECK_PKGS)

# govulncheck reports the vulnerabilities this module's code reaches, in its
# dependencies and in the standard library of the Go that runs it (the Go
# that builds the binaries). Standard-library findings are fixed by a newer
# Go: GOTOOLCHAIN=go1.X.Y make test fetches that release through the module
# proxy (golang.org/toolchain), as a `toolchain` line in go.mod would for
# every build.
vulncheck: $(GOVULNCHECK) $(VULNDB)/index/db.json
	@echo "vulncheck: $$($(GO) env GOVERSION), database golang.org/x/vulndb@$(VULNDB_VERSION)"
	$(GOVULNCHECK) -db file://$(VULNDB) ./...

test-race:
	rm -rf $(TEST_FLIGHT_DIR)
	TANDEM_FLIGHT_DIR=$(TEST_FLIGHT_DIR) $(GO) test -race $(GOTESTFLAGS) $$($(GO) list $(RACE_PKGS) 2>/dev/null)

test-plain:
	TANDEM_FLIGHT_DIR=$(TEST_FLIGHT_DIR) $(GO) test $(GOTESTFLAGS) $$($(GO) list ./... | grep -vxF -f <($(GO) list $(RACE_PKGS) 2>/dev/null))

# The numerical packages again over the optional C BLAS, when it is installed.
test-blas:
	@if [ -n "$(TAGS)" ]; then $(GO) test $(GOTESTFLAGS) $(TAGFLAG) ./internal/blas ./models ./optim; \
	else echo "test-blas: libopenblas-dev not installed; pure-Go BLAS only"; fi

# The portable loops that amd64 replaces with vector kernels: the
# optimizers', the element-wise ones of package vec and the layers using them.
test-purego:
	$(GO) test $(GOTESTFLAGS) -tags purego ./optim ./internal/vec ./models

# Short fuzz runs of the wire decoders (a few seconds each; see FUZZTIME).
fuzz:
	@grep -rl --include='*_test.go' '^func Fuzz' . | while read -r f; do \
	  dir=$$(dirname $$f); \
	  for fz in $$(grep -o '^func Fuzz[A-Za-z0-9_]*' $$f | sed 's/func //'); do \
	    echo "fuzz $$dir $$fz ($(FUZZTIME))"; \
	    $(GO) test -run='^$$' -fuzz="^$$fz$$" -fuzztime=$(FUZZTIME) $$dir || exit 1; \
	  done; \
	done

# The main job: a CNN trained on Fashion-MNIST with DDP over two processes.
# The data set comes from $$TANDEM_DATA or Debian's dataset-fashion-mnist,
# which is installed here when it is missing and apt can.
DEMO_EPOCHS ?= 5
# DEMO_TIMELINE=FILE also writes the ranks' DDP timeline of 20 steps there
# (Chrome-trace JSON) and its picture beside it; off by default.
DEMO_TIMELINE ?=
# Each rank serves its Prometheus metrics (collectives, DDP's step, forward,
# backward and communication times, store operations, restarts) at
# DEMO_METRICS_ADDR's host on a port of its own, and prints the address
# ("[r] ddp_fashion: rank r serves metrics at http://..."); port 0 picks
# free ports, a fixed PORT gives rank r PORT+r. Empty turns it off.
DEMO_METRICS_ADDR ?= 127.0.0.1:0
demo:
	$(GO) build $(TAGFLAG) -o bin/tandem ./cmd/tandem
	$(GO) build $(TAGFLAG) -o bin/ddp_fashion ./examples/ddp_fashion
	@bin/ddp_fashion -check-data >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "demo: installing Debian's dataset-fashion-mnist"; \
	    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq dataset-fashion-mnist) || true; \
	  fi; }
	bin/ddp_fashion -check-data
	bin/tandem run -nproc 2 $(if $(DEMO_METRICS_ADDR),-metrics-addr $(DEMO_METRICS_ADDR)) -- bin/ddp_fashion -epochs $(DEMO_EPOCHS) -out out/ddp_fashion $(if $(DEMO_TIMELINE),-timeline $(DEMO_TIMELINE))

# Elastic training: Fashion-MNIST over three members, one killed with
# SIGKILL at 30% and a new one added at 60% (examples/elastic/README.md).
demo-elastic:
	$(GO) build $(TAGFLAG) -o bin/elastic ./examples/elastic
	bin/elastic -demo

# The interim demo: the basic collectives over three launched processes.
demo-collectives:
	$(GO) run ./cmd/tandem run -nproc 3 -- $(GO) run ./examples/collectives

bench:
	$(GO) run $(TAGFLAG) ./cmd/tandem bench store -json
	$(GO) run $(TAGFLAG) ./cmd/tandem bench allreduce -nproc 2 -json
	$(GO) run $(TAGFLAG) ./cmd/tandem bench allreduce -nproc 4 -json
	$(GO) run $(TAGFLAG) ./cmd/tandem bench rpc -json
	$(GO) run $(TAGFLAG) ./cmd/tandem bench train -json -peer
	$(GO) run $(TAGFLAG) ./cmd/tandem bench ddp -nproc 2 -json

# The CUDA build (build tag tandemcuda; see comm/devstage): installs the
# toolkit's headers and libraries when run as root (scripts/install-cuda.sh),
# then vets every package and builds every test binary with the tag, so that
# the tag cannot rot on machines without a GPU. Test binaries are built and
# linked, not run: gorgonia.org/cu initialises the driver at start-up and
# exits without a GPU. The tag is not `cuda`: that one also turns on gorgonia's own CUDA
# engine, which needs cuDNN, which Debian does not ship.
CUDA_TAG    = tandemcuda
# CUDA 11.8's headers mark calls deprecated that gorgonia.org/cu still binds.
CUDA_CFLAGS = -O2 -g -Wno-deprecated-declarations
check-cuda:
	@if [ "$$(id -u)" = 0 ]; then scripts/install-cuda.sh; \
	elif ! printf '#include <cuda.h>\n#include <cublas_v2.h>\n' | $${CC:-cc} -E -x c - >/dev/null 2>&1; then \
	  echo "check-cuda: the CUDA headers are not installed; run: sudo scripts/install-cuda.sh"; exit 1; fi
	CGO_CFLAGS="$(CUDA_CFLAGS)" $(GO) vet -tags $(CUDA_TAG) ./...
	@# -exec true links every test binary and runs `true` in its place.
	CGO_CFLAGS="$(CUDA_CFLAGS)" $(GO) test -tags $(CUDA_TAG) -vet=off -count=1 -exec true ./... | \
	  awk '{print} $$1 == "ok" {n++} END {print "check-cuda: " n+0 " test binaries built with -tags $(CUDA_TAG)"}'; \
	  exit $${PIPESTATUS[0]}

clean:
	$(GO) clean -testcache
