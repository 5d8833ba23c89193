#!/usr/bin/env bash
# Makes sure this machine can run Troupe's sandboxes: a Docker engine that is running, gVisor's
# runsc registered as a runtime, a static busybox to build the default image from, and a C
# compiler with static libc for the in-sandbox agent (sandbox/agent).
# Installs Debian's docker.io, runsc, busybox-static, gcc and libc6-dev when missing (root needed), and
# starts dockerd in the background when no engine answers.
set -euo pipefail

log() { echo "host-setup: $*" >&2; }

missing=()
command -v dockerd >/dev/null 2>&1 || missing+=(docker.io)
command -v runsc >/dev/null 2>&1 || missing+=(runsc)
dpkg -s busybox-static >/dev/null 2>&1 || missing+=(busybox-static)
command -v gcc >/dev/null 2>&1 || missing+=(gcc)
dpkg -s libc6-dev >/dev/null 2>&1 || missing+=(libc6-dev)

if ((${#missing[@]} > 0)); then
  if [[ "$(id -u)" != 0 ]]; then
    log "missing: ${missing[*]}; run as root, or: sudo apt-get install -y ${missing[*]}"
    exit 1
  fi
  log "installing ${missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi

# Register runsc with the flags that work on these machines: ptrace platform, and no network
# (runsc refuses to start with networking in the root network namespace); and --oci-seccomp, so
# the container's seccomp filter (services/sandbox/seccomp.ts) holds inside gVisor too: without
# it runsc ignores the filter. An older registration is brought up to these flags.
daemon_json=/etc/docker/daemon.json
registered=1
if [[ "$(id -u)" == 0 ]]; then
  mkdir -p /etc/docker
  changed=$(node -e '
    const fs = require("fs"); const f = process.argv[1];
    let cfg = {}; try { cfg = JSON.parse(fs.readFileSync(f, "utf8")); } catch {}
    const want = { path: "/usr/bin/runsc", runtimeArgs: ["--platform=ptrace", "--network=none", "--oci-seccomp"] };
    if (JSON.stringify(cfg.runtimes?.runsc) === JSON.stringify(want)) { console.log("no"); process.exit(0); }
    cfg.runtimes = { ...(cfg.runtimes || {}), runsc: want };
    fs.writeFileSync(f, JSON.stringify(cfg, null, 2) + "\n");
    console.log("yes");
  ' "$daemon_json")
  if [[ $changed == yes ]]; then
    registered=0
    log "registered the runsc runtime in $daemon_json"
  fi
fi

if docker info >/dev/null 2>&1; then
  # A running engine re-reads its runtimes on SIGHUP.
  if [[ $registered == 0 ]]; then pkill -HUP dockerd || true; sleep 1; fi
else
  if [[ "$(id -u)" != 0 ]]; then
    log "no Docker engine answers and starting one needs root: start dockerd, or set DOCKER_HOST"
    exit 1
  fi
  log "starting dockerd in the background (log: /var/log/troupe-dockerd.log)"
  nohup dockerd >/var/log/troupe-dockerd.log 2>&1 &
  for _ in $(seq 1 60); do
    docker info >/dev/null 2>&1 && break
    sleep 0.5
  done
  docker info >/dev/null 2>&1 || { log "dockerd did not come up; see /var/log/troupe-dockerd.log"; exit 1; }
fi
docker info --format '{{json .Runtimes}}' | grep -q runsc || { log "the runsc runtime is not registered with the engine"; exit 1; }
log "Docker engine ready (runtimes: runc, runsc)"
