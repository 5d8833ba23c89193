# Troupe. `make run` sets everything up and starts the stack; `make test` sets everything up and
# runs every test. Both work on a fresh Debian machine with Node and make.
SHELL := /bin/bash
.DEFAULT_GOAL := build

# Node >= 22 is required. An older system Node gets Node 24 LTS from the npm registry's `node`
# package, installed into .toolchain/ and used for every step below (npm included).
SYSTEM_NODE_MAJOR := $(shell node -p 'process.versions.node.split(".")[0]' 2>/dev/null || echo 0)
ifeq ($(shell test $(SYSTEM_NODE_MAJOR) -ge 22 && echo yes),yes)
TOOLCHAIN_NODE :=
else
TOOLCHAIN_NODE := .toolchain/node_modules/.bin/node
export PATH := $(CURDIR)/.toolchain/node_modules/.bin:$(PATH)
endif

SANDBOX_IMAGE ?= troupe-sandbox:busybox
B ?=
TROUPE := node dist/services/cli/main.js

# How both tiers of make test run node's test runner. --test-force-exit: a test file whose tests
# have all ended exits, so a timer a failed test leaves behind costs that test, not the whole run;
# test/helpers/whole-report.ts keeps that exit from dropping verdicts or the report (nodejs/node#64833);
# --require, not --import, loads it into the runner as well as into each file.
NODE_TEST := node --test --test-force-exit --require ./dist/test/helpers/whole-report.js
UNIT_TIER := $(NODE_TEST) --test-timeout=60000 'dist/test/unit/*.test.js'

.PHONY: build run test test-unit readme-settings lint kubectl images bench soak soak-long toolchain host postgres sandbox-image sandbox-image-if-missing sandbox-image-debian sandbox-image-mcp sandbox-image-mcp-if-missing python-client openssl chromium jemalloc clean

toolchain: $(TOOLCHAIN_NODE)
.toolchain/node_modules/.bin/node:
	@echo "System Node is $(SYSTEM_NODE_MAJOR); installing Node 24 into .toolchain/"
	npm install --prefix .toolchain --no-save --no-audit --no-fund node@24
	@test -x $@ && $@ --version

# `npm install --no-save` rather than `npm ci`: the registry these machines reach lacks the
# non-linux-x64 builds of @lancedb/lancedb 0.39 (optional dependencies), so the lock cannot list
# them and `npm ci` would refuse it. Versions still come from package-lock.json.
node_modules/.installed: package-lock.json package.json | toolchain
	npm install --no-save --no-audit --no-fund
	@touch $@

services/shared/gen/.generated: node_modules/.installed buf.yaml buf.gen.yaml $(shell find proto -name '*.proto')
	npx buf generate
	@touch $@

# dist/ is made anew: tsc compiles every file each time anyway, and a source moved or removed must
# not leave its old output behind (a stale test would still run).
build: node_modules/.installed services/shared/gen/.generated
	rm -rf dist
	npx tsc -p tsconfig.json
	node dist/services/shared/schemas/compile.js
	cp -r services/gateway/console dist/services/gateway/
	@# package.json's bin: `npx troupe` runs it as a program, and tsc writes it without +x.
	chmod +x dist/services/cli/main.js

# biome (biome.json): formatting at 120 columns and the recommended lint rules, less four that
# the code breaks on purpose (non-null assertions, assignments in expressions, control characters
# in the sanitisers' patterns, comma sequences in one-line handlers).
# dependency-cruiser holds the imports to .dependency-cruiser.cjs: no cycle (type imports
# included), no service reaching into another's files, shared below every service; and no
# folder under services/ holds more than 25 source files (test/lint/folders.ts). It reads the
# sources with swc, as TypeScript 7.0 has no API for it; its note that no TypeScript compiler it
# can use was found says only that.
lint: build kubectl
	npx biome check
	npx depcruise --config .dependency-cruiser.cjs services
	node dist/test/lint/folders.js services
	npx buf lint
	node dist/test/k8s/validate.js k8s/overlays/dev k8s/overlays/prod k8s/adapters/slack k8s/adapters/telegram
	@if git rev-parse --verify -q main >/dev/null; then \
	  npx buf breaking --against '.git#branch=main'; \
	else echo "lint: no main branch here; buf breaking skipped"; fi

# kubectl renders the Kubernetes overlays for `make lint` (Debian's kubernetes-client is enough:
# the overlays avoid what its older kustomize lacks).
kubectl:
	@command -v kubectl >/dev/null || (apt-get update -qq && apt-get install -y -qq kubernetes-client >/dev/null && echo "installed kubernetes-client")

# The images for Kubernetes (k8s/): Troupe's, built in a multi-stage Dockerfile from the sources,
# with the sandbox image inside as a tarball for the sandbox pod to load. Needs the node base image
# from a registry the engine can pull from.
TROUPE_IMAGE ?= troupe:0.1.0
NODE_IMAGE ?= node:24-bookworm-slim
images: sandbox-image-if-missing
	@mkdir -p .images && docker save -o .images/sandbox-image.tar $(SANDBOX_IMAGE) && chmod 0644 .images/sandbox-image.tar
	docker build -f k8s/Dockerfile --build-arg NODE_IMAGE=$(NODE_IMAGE) -t $(TROUPE_IMAGE) .

# The machine side of the sandbox: Docker engine running, runsc registered.
host:
	bash sandbox/host-setup.sh

# Debian's PostgreSQL server, for the store tests, the cluster tests and `troupe up --store postgres`
# (each starts its own throwaway server on a free port; the package's own cluster is not used).
postgres:
	@ls /usr/lib/postgresql/*/bin/postgres >/dev/null 2>&1 || \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null && echo "installed postgresql")

# The sandbox images carry the in-container agent (sandbox/agent), built static here; the image's
# troupe.agent label is a hash of the agent's source and the Dockerfile, so an image made from older
# sources counts as missing.
SANDBOX_SOURCES_HASH = $(shell cat sandbox/agent/*.[ch] sandbox/Dockerfile | sha256sum | cut -c1-16)
AGENT_BUILD = gcc -static -O2 -Wall -o "$$ctx/troupe-agent" sandbox/agent/troupe-agent.c sandbox/agent/egress.c

sandbox-image: host
	@set -e; ctx=$$(mktemp -d); trap 'rm -rf "$$ctx"' EXIT; \
	  $(AGENT_BUILD); cp sandbox/Dockerfile "$$ctx/"; cp "$$(command -v busybox)" "$$ctx/busybox"; \
	  docker build -q --label troupe.agent=$(SANDBOX_SOURCES_HASH) -t $(SANDBOX_IMAGE) "$$ctx" >/dev/null; echo "built $(SANDBOX_IMAGE)"

sandbox-image-if-missing: host
	@test "$$(docker image inspect -f '{{index .Config.Labels "troupe.agent"}}' $(SANDBOX_IMAGE) 2>/dev/null)" = "$(SANDBOX_SOURCES_HASH)" \
	  || $(MAKE) --no-print-directory sandbox-image

# The richer image (python3): a Debian root filesystem made with debootstrap from Debian's archive.
sandbox-image-debian: host
	@command -v debootstrap >/dev/null || (apt-get update -qq && apt-get install -y -qq debootstrap)
	@set -e; ctx=$$(mktemp -d); trap 'rm -rf "$$ctx"' EXIT; \
	  debootstrap --variant=minbase --include=python3 bookworm "$$ctx/root" >/dev/null; \
	  tar -C "$$ctx/root" -cf "$$ctx/rootfs.tar" .; cp sandbox/Dockerfile.debian "$$ctx/Dockerfile"; $(AGENT_BUILD); \
	  docker build -q -t troupe-sandbox:debian "$$ctx" >/dev/null; echo "built troupe-sandbox:debian"

# The MCP image (sandbox/Dockerfile.mcp): Debian's Node.js and Python from debootstrap, and the
# MCP servers MCP_SERVERS names installed from npm into /opt/mcp, for stdio servers run in a
# session's sandbox (docs/mcp.md). Its troupe.agent label also covers the server list, so a
# changed list makes it again; make test builds it when missing (test/mcp.test.ts uses it).
MCP_SANDBOX_IMAGE ?= troupe-sandbox:mcp
MCP_SERVERS ?= @modelcontextprotocol/server-everything@2026.8.31 @modelcontextprotocol/server-filesystem@2026.8.31
MCP_IMAGE_HASH = $(shell (cat sandbox/agent/*.[ch] sandbox/Dockerfile.mcp; echo $(MCP_SERVERS)) | sha256sum | cut -c1-16)
sandbox-image-mcp: host
	@command -v debootstrap >/dev/null || (apt-get update -qq && apt-get install -y -qq debootstrap >/dev/null)
	@set -e; ctx=$$(mktemp -d); trap 'rm -rf "$$ctx"' EXIT; \
	  debootstrap --variant=minbase --include=nodejs,python3 bookworm "$$ctx/root" >/dev/null; \
	  tar -C "$$ctx/root" -cf "$$ctx/rootfs.tar" .; rm -rf "$$ctx/root"; \
	  mkdir -p "$$ctx/mcp" && echo '{"private":true}' > "$$ctx/mcp/package.json"; \
	  npm install --prefix "$$ctx/mcp" --omit=dev --no-audit --no-fund --no-package-lock $(MCP_SERVERS) >/dev/null; \
	  cp sandbox/Dockerfile.mcp "$$ctx/Dockerfile"; $(AGENT_BUILD); \
	  docker build -q --label troupe.agent=$(MCP_IMAGE_HASH) -t $(MCP_SANDBOX_IMAGE) "$$ctx" >/dev/null; echo "built $(MCP_SANDBOX_IMAGE)"

sandbox-image-mcp-if-missing: host
	@test "$$(docker image inspect -f '{{index .Config.Labels "troupe.agent"}}' $(MCP_SANDBOX_IMAGE) 2>/dev/null)" = "$(MCP_IMAGE_HASH)" \
	  || $(MAKE) --no-print-directory sandbox-image-mcp

# The Python example client (examples/python): Debian's grpcio and protoc, stubs made from proto/.
# Debian's own python3, not whichever one comes first on PATH: the packages are installed for it.
PYTHON := /usr/bin/python3
python-client:
	@if ! $(PYTHON) -c 'import grpc, google.protobuf' 2>/dev/null || ! command -v protoc >/dev/null || ! command -v grpc_python_plugin >/dev/null; then \
	  apt-get update -qq && apt-get install -y -qq python3-grpcio python3-protobuf protobuf-compiler protobuf-compiler-grpc >/dev/null; fi
	@rm -rf .gen/python && mkdir -p .gen/python
	protoc -I proto --python_out=.gen/python --grpc_python_out=.gen/python --plugin=protoc-gen-grpc_python=$$(command -v grpc_python_plugin) proto/troupe/v1/*.proto

run: build jemalloc
	@$(MAKE) --no-print-directory sandbox-image-if-missing || echo "run: no sandbox available; tools will report errors until Docker runs (see docs/sandbox.md)"
	$(TROUPE) up

# The README's configuration table, from services/shared/config/settings.ts.
readme-settings: build
	node -e 'const fs=require("fs");import("./dist/services/shared/config/settings.js").then(({settingsTable})=>{const r=fs.readFileSync("docs/settings.md","utf8");const a="<!-- settings:start -->\n",b="<!-- settings:end -->";fs.writeFileSync("docs/settings.md",r.slice(0,r.indexOf(a)+a.length)+settingsTable()+r.slice(r.indexOf(b)))})'

# jemalloc, which `troupe up` starts the services with where it is installed (TROUPE_ALLOCATOR;
# services/cli/allocator.ts says why, and alone knows where the library lies). dpkg is asked
# whether the package is in, so no list of library paths is kept here as well.
jemalloc:
	@dpkg-query -W -f='$${Status}' libjemalloc2 2>/dev/null | grep -q "ok installed" || \
	  (apt-get update -qq && apt-get install -y -qq libjemalloc2 >/dev/null && echo "installed libjemalloc2")

# openssl makes the TLS tests' certificates (Debian has it wherever ca-certificates is; not always).
openssl:
	@command -v openssl >/dev/null || (apt-get update -qq && apt-get install -y -qq openssl >/dev/null && echo "installed openssl")

# Debian's Chromium, for the web console's test (test/console.test.ts drives it with puppeteer-core).
chromium:
	@command -v chromium >/dev/null || (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null && echo "installed chromium")

# The in-process tier (test/unit): the session actor over the in-memory store, the loop with a
# scripted model client, parsers and stores on files, protocol clients against loopback servers.
# No Troupe service is started and no Docker is needed.
test-unit: build openssl
	$(UNIT_TIER)

# Every test: the in-process tier first, then the end-to-end tier of real processes, the soaks
# included (test/soak: 500 sessions of random traffic while the runner is killed three times,
# about 3 minutes, SOAK_SESSIONS=N and SOAK_KILLS=N change it; and the cluster soak on
# PostgreSQL, CLUSTER_SESSIONS=N and CLUSTER_DISRUPTIONS=N). Then no sandbox container made
# during the run may be left (test/leftovers.ts).
test: build lint sandbox-image-if-missing sandbox-image-mcp-if-missing python-client postgres openssl chromium jemalloc
	$(UNIT_TIER)
	since=$$(date +%s%3N); \
	$(NODE_TEST) --test-concurrency=1 --test-timeout=600000 'dist/test/*.test.js' 'dist/test/soak/*.test.js'; \
	status=$$?; node dist/test/leftovers.js --since $$since || status=1; exit $$status

# The soak alone.
soak: build sandbox-image-if-missing
	node --test --test-timeout=600000 dist/test/soak/soak.test.js

# The long soak: an hour of mixed traffic under troupe up (SOAK_LONG_SECONDS to change it);
# make test runs the same for 60 s.
soak-long: build sandbox-image-if-missing jemalloc
	SOAK_LONG_SECONDS=$${SOAK_LONG_SECONDS:-3600} node --test --test-timeout=0 dist/test/soak/long.test.js

bench: build sandbox-image-if-missing postgres jemalloc
	@if [ -n "$(B)" ]; then node dist/bench/$(B).js; else for b in dist/bench/*.js; do node $$b || exit 1; done; fi

clean:
	rm -rf dist services/shared/gen node_modules/.installed .gen
