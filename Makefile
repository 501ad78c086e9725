# idemledger: `make help` lists the targets.
SHELL := /usr/bin/env bash
BUF := bin/buf
PKGS := ./...

.PHONY: help build run test test-short lint breaking generate checkgenerate fuzz bench buf

help: ## List the targets.
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-14s %s\n", $$1, $$2}'

build: ## Build every package and command.
	go build $(PKGS)

run: ## Start ledgerd on its embedded default store (dev mode, loopback).
	go run ./cmd/ledgerd

test: ## Run every test with the race detector (starts a throwaway PostgreSQL when it can), and the deploy/ manifests' tests.
	go test -race -count=1 $(PKGS)
	cd deploy/test && go test -count=1 ./...

test-short: ## Run the tests that need no PostgreSQL.
	go test -race -short $(PKGS)

lint: buf ## gofmt, go mod tidy -diff, go vet and buf lint.
	@out=$$(gofmt -l $$(git ls-files '*.go' | grep -v '^gen/')); if [ -n "$$out" ]; then echo "gofmt would change:"; echo "$$out"; exit 1; fi
	go mod tidy -diff
	go vet $(PKGS)
	cd deploy/test && go mod tidy -diff && go vet ./...
	$(BUF) lint

breaking: buf ## Check proto/ for breaking changes against main.
	$(BUF) breaking --against '.git#branch=main'

generate: buf ## Regenerate gen/ from proto/ with buf and the pinned local plugins.
	$(BUF) generate

checkgenerate: generate ## Regenerate and fail if gen/ differs from what is committed.
	@if [ -n "$$(git status --porcelain -- gen)" ]; then git status --porcelain -- gen; git diff -- gen | head -40; echo "gen/ is stale: run make generate and commit"; exit 1; fi

fuzz: ## Run each fuzz target for FUZZTIME (default 20s).
	@set -e; for pkg in $$(go list $(PKGS)); do \
	  for f in $$(go test -list '^Fuzz' $$pkg | grep '^Fuzz' || true); do \
	    echo "== $$pkg $$f"; go test -run '^$$' -fuzz "^$$f$$" -fuzztime $${FUZZTIME:-20s} $$pkg; \
	  done; done

bench: ## Run the benchmarks (compare runs with benchstat).
	go test -run '^$$' -bench . -benchmem $(PKGS)

buf: $(BUF)
$(BUF): tools/buf/go.mod tools/buf/go.sum
	cd tools/buf && go build -o ../../$(BUF) github.com/bufbuild/buf/cmd/buf
