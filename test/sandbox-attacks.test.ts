// The adversarial suite: what hostile code tries from inside a sandbox, run through the real
// service against both runtimes (runc and gVisor's runsc), each attack asserting its safe outcome.
// Numbers refer to the attack list in ../shared/reference/anchors-sandbox.md, section (b). The
// file API's (19-24) are in sandbox-api.test.ts; 14 and 16 need an egress allow-list, which does
// not exist (no network at all); the rest are written for the default busybox image.
import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { mkdtemp, readFile, rm } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { promisify } from "node:util";
import {
  Health,
  HealthCheckResponse_ServingStatus as Serving,
} from "../services/shared/gen/grpc/health/v1/health_pb.js";
import { SandboxService } from "../services/shared/gen/troupe/v1/sandbox_pb.js";
import { DEV_IDENTITY } from "../services/shared/auth/auth.js";
import { createClient } from "../services/shared/rpc.js";
import { exec, type ExecResult, type SandboxClient, sessionContainer } from "./helpers/sandbox.js";
import { startStack, type Stack } from "./helpers/stack.js";

const run = promisify(execFile);

/** The system calls sandbox/probes/syscall-probe.c tries, in its order. */
const PROBED = [
  "bpf",
  "perf_event_open",
  "userfaultfd",
  "io_uring_setup",
  "add_key",
  "keyctl",
  "unshare_newuser",
  "ptrace_attach_1",
  "process_vm_readv_1",
  "open_by_handle_at",
  "af_packet",
  "mknod_mem",
];

/** The probe, compiled static here (gcc from host-setup), as the bytes to write into a workspace. */
async function compileProbe(): Promise<Buffer> {
  const dir = await mkdtemp(path.join(os.tmpdir(), "troupe-probe-"));
  try {
    const out = path.join(dir, "syscall-probe");
    await run("gcc", ["-static", "-O2", "-o", out, path.join(process.cwd(), "sandbox", "probes", "syscall-probe.c")]);
    return await readFile(out);
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
}

/** Where sandbox/host-setup.sh has dockerd log when it starts the engine itself (as in CI). */
const ENGINE_LOG = "/var/log/troupe-dockerd.log";

/**
 * For a failure's message: the service's last warnings about sandboxes that ended or lost their
 * agent connection on their own, and the engine's last lines about each such container (a
 * runtime's panic lands there, not in our logs).
 */
async function deathReport(stack: Stack): Promise<string> {
  const lines = stack
    .logs()
    .split("\n")
    .filter((l) => /ended on its own|lost the agent connection/.test(l))
    .slice(-4);
  if (lines.length === 0) return "(the service reported no sandbox as ended or lost)";
  const engine = (await readFile(ENGINE_LOG, "utf8").catch(() => "")).split("\n");
  const ids = lines.map((l) => /"container":"([0-9a-f]{12})"/.exec(l)?.[1]).filter((id) => id !== undefined);
  const about = ids.map((id) => {
    const said = engine.filter((l) => l.includes(id) && !l.includes("loading plugin")).slice(-12);
    return `--- the engine's last lines about ${id} (${ENGINE_LOG}) ---\n${said.join("\n") || "(none)"}`;
  });
  return [`--- the service's warnings ---`, ...lines, ...about].join("\n");
}

type Sandbox = SandboxClient;
type Result = ExecResult;

interface Attack {
  n: number;
  name: string;
  /** Run as the untrusted command, in a sandbox of its own unless `shared`. */
  command: string;
  timeoutMs?: number;
  /** Only under this runtime (the safe outcome is enforced differently by the other). */
  only?: "runc" | "runsc";
  check(r: Result, runtime: string): void;
  /** A command run in the same sandbox afterwards, and what its output must be. */
  afterwards?: { command: string; expect: string };
  /**
   * Under this runtime the attack may end its own sandbox (exit 137, no output), and that is an
   * outcome its check accepts. For every other attack under runsc, a first attempt whose sandbox
   * died under it (exit 137, no output, no OOM, no timeout) is a known defect, not an outcome:
   * it is reported and tried once more in a fresh sandbox, which must then pass. See
   * docs/sandbox.md, "Open: a gVisor sandbox that stops under a command".
   */
  endsItsSandbox?: "runsc";
}

const ATTACKS: Attack[] = [
  {
    n: 1,
    name: "fork bomb: held at the pids limit, ended by the timeout",
    endsItsSandbox: "runsc",
    // The parent must outlast the bomb's first seconds without forking (nothing can fork once the
    // bomb fills the pids limit) and without spinning (a counted shell loop competes with 256
    // spinning processes for two cores and missed the timeout on a slower machine). So `sleep`
    // is forked before the bomb and the shell's builtin `wait` blocks on it; then builtins only:
    // the cgroup's counters, and a spin to the timeout. The bomb starts as one background child
    // (`f &`): ash forks each side of `f | f` from the shell that runs it, and once in CI the
    // first side's forks filled the limit before the parent's second fork, which ended the
    // parent ("can't fork", exit 2) in 0.3 s.
    command:
      "sleep 2 & s=$!; f(){ f | f & }; f & wait $s; for d in /sys/fs/cgroup /sys/fs/cgroup/pids; do if [ -r $d/pids.events ]; then read e < $d/pids.events; read m < $d/pids.max; echo pids $e of $m; fi; done; while :; do :; done",
    timeoutMs: 6000,
    check: (r, runtime) => {
      if (runtime === "runc") {
        // The container's pids controller counts the forks it refused at its limit.
        assert.ok(r.exit.timedOut, `the bomb ran to the timeout: exit ${r.exit.exitCode}: ${r.out.slice(-300)}`);
        const m = /pids max (\d+) of (\d+)/.exec(r.out);
        assert.ok(m, r.out.slice(-300));
        assert.equal(Number(m[2]), 256);
        assert.ok(Number(m[1]) > 0, "forks were refused at the limit");
      } else {
        // gVisor shows no cgroup files, and ends its whole sandbox at the host's pids limit
        // (fleet.ts, hostPidsLimit): the bomb takes its own sandbox down and nothing else.
        assert.ok(r.exit.timedOut || r.exit.exitCode === 137, `exit ${r.exit.exitCode}`);
      }
    },
  },
  {
    n: 3,
    name: "memory bomb: killed inside its cgroup, reported as out of memory",
    // biome-ignore lint/suspicious/noTemplateCurlyInString: ${#a} is the shell's, in the sandbox
    command: "a=$(head -c 700000000 /dev/zero | tr '\\0' x); echo ${#a}",
    // The shell fills its variable slowly (13 s to the limit on an idle 2-core machine, more under
    // load); the timeout only has to be longer than that, the cgroup ends it.
    timeoutMs: 40_000,
    check: (r, runtime) => {
      assert.doesNotMatch(r.out, /700000000/, "the allocation never succeeded");
      assert.equal(r.exit.exitCode, 137, `exit ${r.exit.exitCode}: ${r.out.slice(0, 200)}`);
      // runc's engine reports the kill; gVisor holds the process at its limit without reporting
      // it, so there the command ends at its timeout.
      if (runtime === "runc") assert.ok(r.exit.oomKilled, "reported as oom_killed");
      else assert.ok(r.exit.oomKilled || r.exit.timedOut);
    },
  },
  {
    n: 4,
    name: "fill /tmp: ENOSPC at the tmpfs size",
    command: "dd if=/dev/zero of=/tmp/big bs=1M count=200 2>&1; ls -l /tmp/big | awk '{print $5}'",
    check: (r) => {
      assert.match(r.out, /No space left on device/);
      assert.ok(Number(r.out.trim().split("\n").at(-1)) <= 64 * 1024 * 1024);
    },
  },
  {
    n: 5,
    name: "fill the workspace: ENOSPC at its size",
    command: "dd if=/dev/zero of=/workspace/big bs=1M count=400 2>&1; ls -l /workspace/big | awk '{print $5}'",
    check: (r) => {
      assert.match(r.out, /No space left on device/);
      assert.ok(Number(r.out.trim().split("\n").at(-1)) <= 256 * 1024 * 1024);
    },
  },
  {
    n: 6,
    name: "write the root filesystem: read-only",
    command:
      "echo x > /etc/passwd && echo WROTE-passwd; touch /bin/x && echo WROTE-bin; mkdir /newdir && echo WROTE-dir; grep -c '^x$' /etc/passwd; echo done",
    check: (r) => {
      // runc says EROFS; gVisor says EACCES. Either way nothing is written.
      assert.doesNotMatch(r.out, /WROTE/, r.out);
      assert.match(r.out, /^0$/m);
      assert.match(r.out, /done/);
    },
  },
  {
    n: 7,
    name: "/proc and /sys writes refused; /proc/kcore and /proc/keys show nothing",
    command:
      "echo b > /proc/sysrq-trigger && echo WROTE-sysrq; echo 1 > /proc/sys/kernel/panic && echo WROTE-panic; echo 1 > /sys/fs/cgroup/cgroup.procs && echo WROTE-cgroup; echo kcore $(head -c 16 /proc/kcore 2>/dev/null | wc -c); echo keys $(cat /proc/keys 2>/dev/null | wc -c); echo end",
    check: (r) => {
      assert.doesNotMatch(r.out, /WROTE/);
      assert.match(r.out, /^kcore 0$/m, "/proc/kcore reads as empty (masked) or not at all");
      assert.match(r.out, /^keys 0$/m, "no keyring of the host is listed");
    },
  },
  {
    n: 8,
    name: "mount, unshare, chroot, pivot_root: not permitted",
    command:
      "mkdir -p /tmp/m; mount -t tmpfs x /tmp/m && echo MOUNTED; unshare -Urm true && echo UNSHARED; unshare -m true && echo UNSHARED2; chroot /tmp true && echo CHROOTED; pivot_root /tmp /tmp/m && echo PIVOTED; echo end",
    check: (r) => {
      assert.doesNotMatch(r.out, /MOUNTED|UNSHARED|CHROOTED|PIVOTED/, r.out);
      assert.match(r.out, /end/);
    },
  },
  {
    n: 9,
    name: "entering another process's namespaces: not permitted",
    command: "nsenter -t 1 -m -p true && echo ENTERED; echo end",
    check: (r) => assert.doesNotMatch(r.out, /ENTERED/, r.out),
  },
  {
    n: 10,
    name: "raw sockets and network administration: not permitted",
    command:
      "ping -c 1 -W 1 127.0.0.1 >/dev/null 2>&1 && echo PINGED; ip link add x0 type dummy 2>/dev/null && echo LINKED; ip addr add 10.9.9.9/32 dev lo 2>/dev/null && echo ADDR; echo end",
    check: (r) => assert.doesNotMatch(r.out, /PINGED|LINKED|ADDR/, r.out),
  },
  {
    n: 11,
    name: "device nodes and kernel modules: not permitted",
    command:
      "mknod /tmp/mem c 1 1 2>/dev/null; head -c 16 /tmp/mem 2>/dev/null | wc -c; insmod /tmp/x.ko 2>/dev/null && echo INSMOD; ls /dev/mem 2>/dev/null && echo DEVMEM; echo end",
    check: (r) => {
      // runc refuses the node; gVisor makes it in its own tmpfs, but it leads to no memory.
      assert.match(r.out, /^0$/m, "nothing read through a /dev/mem node");
      assert.doesNotMatch(r.out, /INSMOD|DEVMEM/, r.out);
    },
  },
  {
    n: 12,
    name: "privilege escalation: no capabilities, no new privileges, su fails",
    command:
      "grep -E '^(CapEff|CapPrm|CapBnd|NoNewPrivs)' /proc/self/status; su -c id root </dev/null 2>&1 | tail -1; id -u",
    // Three processes run in turn; under CI load they once took more than the default 3 s.
    timeoutMs: 15_000,
    check: (r, runtime) => {
      assert.match(r.out, /CapEff:\s+0{16}/);
      assert.match(r.out, /CapPrm:\s+0{16}/);
      // gVisor's /proc does not show the flag (runsc applies it from the OCI spec).
      if (runtime === "runc") assert.match(r.out, /NoNewPrivs:\s+1/);
      assert.equal(r.out.trim().split("\n").at(-1), "65534");
      assert.doesNotMatch(r.out, /uid=0/);
    },
  },
  {
    n: 13,
    name: "egress with no network: nothing leaves",
    command:
      "wget -q -T 2 -O - http://1.1.1.1/ && echo FETCHED; nc -w 2 1.1.1.1 443 </dev/null && echo CONNECTED; nslookup example.com >/dev/null 2>&1 && echo RESOLVED; ls /sys/class/net; echo end",
    check: (r) => {
      assert.doesNotMatch(r.out, /FETCHED|CONNECTED|RESOLVED/, r.out);
      assert.match(r.out, /^lo$/m);
      assert.doesNotMatch(r.out, /eth0/);
    },
  },
  {
    n: 15,
    name: "metadata service, Docker bridge and private ranges: unreachable",
    command:
      "for h in 169.254.169.254 100.100.100.200 172.17.0.1 10.0.0.1 192.168.1.1; do wget -q -T 1 -O - http://$h/ >/dev/null 2>&1 && echo REACHED-$h; done; echo end",
    check: (r) => assert.doesNotMatch(r.out, /REACHED/, r.out),
  },
  {
    n: 17,
    name: "no Docker or containerd socket",
    command:
      "ls -la /var/run/docker.sock /run/docker.sock /run/containerd/containerd.sock 2>&1; env | grep -c DOCKER_HOST",
    check: (r) => {
      assert.equal(r.out.match(/No such file or directory/g)?.length, 3, r.out);
      assert.equal(r.out.trim().split("\n").at(-1), "0");
    },
  },
  {
    n: 18,
    name: "secrets: only the allowed environment, no keeper environment, no mounted credentials",
    command:
      "env | cut -d= -f1 | sort | tr '\\n' ' '; echo; tr '\\0' '\\n' 2>/dev/null < /proc/1/environ | cut -d= -f1 | sort | tr '\\n' ' '; echo; ls /run/secrets /var/run/secrets /workspace/.aws 2>&1 | grep -vc 'No such file'",
    check: (r) => {
      // The command's environment, and the init process's (unreadable under runc; under gVisor
      // readable, and just as bare): only the names the sandbox sets.
      const allowed = ["HOME", "PATH", "PWD", "SHLVL", "HOSTNAME", "_", ""];
      for (const line of r.out.split("\n").slice(0, 2)) {
        for (const name of line.trim().split(" ")) assert.ok(allowed.includes(name), `unexpected variable ${name}`);
      }
      assert.equal(r.out.trim().split("\n").at(-1), "0");
    },
  },
  {
    n: 25,
    name: "binary output is delivered byte for byte",
    command: "head -c 100000 /dev/urandom",
    check: (r) => {
      assert.equal(r.bytes, 100_000);
      assert.equal(r.exit.truncated, false);
    },
  },
  {
    n: 26,
    name: "output flood on both streams at once: cut at the cap, no deadlock",
    command:
      "yes aaaaaaaaaaaaaaa | head -c 8000000 & yes bbbbbbbbbbbbbb | head -c 8000000 >&2; wait; echo finished >&2",
    check: (r) => {
      const seen = `exit ${r.exit.exitCode}, oom ${r.exit.oomKilled}, ${r.bytes} bytes, ends ${JSON.stringify(r.out.slice(-40))}`;
      assert.ok(r.exit.truncated, seen);
      assert.equal(r.bytes, 1024 * 1024, seen);
      assert.equal(r.exit.timedOut, false);
    },
  },
  {
    n: 27,
    name: "timeout evasion: detached, double-forked and nohup'd descendants all die at the timeout",
    command:
      "setsid nohup sleep 1000 >/dev/null 2>&1 & (sleep 1001 &) ; sh -c 'sleep 1002 & exit'; echo started; sleep 300",
    timeoutMs: 1000,
    check: (r) => {
      assert.ok(r.exit.timedOut);
      assert.match(r.out, /started/);
    },
    afterwards: { command: "ps -o args | grep -c '[s]leep 100' || true", expect: "0\n" },
  },
  {
    n: 28,
    name: "signals ignored: killed at the timeout anyway",
    command: "trap '' TERM INT HUP; echo waiting; sleep 300",
    timeoutMs: 1000,
    check: (r) => {
      assert.ok(r.exit.timedOut);
      assert.ok(r.exit.durationMs < 5000, `${r.exit.durationMs} ms`);
    },
  },
  {
    n: 29,
    name: "zombie farm: orphans are reaped by the agent, PID 1",
    command: "for i in $(seq 40); do (sleep 0.1 &) ; done; sleep 1; ps -o stat | grep -c '^Z' || true",
    // Under runsc this pattern used to end the gVisor sandbox itself while docker-init was PID 1
    // (observed 2026-11-22); with the agent as PID 1 it passes there too.
    check: (r) => assert.equal(r.out.trim(), "0"),
  },
  {
    n: 30,
    name: "CPU burn: held to one CPU",
    // The quota as the container's cgroup states it (v2 cpu.max, or v1 quota and period).
    command:
      "cat /sys/fs/cgroup/cpu.max 2>/dev/null || echo $(cat /sys/fs/cgroup/cpu/cpu.cfs_quota_us) $(cat /sys/fs/cgroup/cpu/cpu.cfs_period_us)",
    only: "runc",
    check: (r) => assert.equal(r.out.trim(), "100000 100000"),
  },
  {
    n: 31,
    name: "file descriptors: the hard limit holds and cannot be raised",
    command: "ulimit -Hn; ulimit -n 100000 2>&1 && echo RAISED; ulimit -Sn",
    check: (r) => {
      const lines = r.out.trim().split("\n");
      assert.equal(lines[0], "1024");
      assert.doesNotMatch(r.out, /RAISED/);
      assert.equal(lines.at(-1), "1024");
    },
  },
  {
    n: 32,
    name: "clock, hostname and sysctl tampering: not permitted",
    // busybox date reports success even when setting the clock failed: the year afterwards tells.
    command:
      "date -s '2001-01-01 00:00:00' >/dev/null 2>&1; date +%Y; hostname evil 2>/dev/null && echo RENAMED; sysctl -w kernel.hostname=evil >/dev/null 2>&1 && echo SYSCTL; hostname",
    check: (r) => {
      assert.notEqual(r.out.split("\n")[0], "2001", "the clock did not move");
      assert.doesNotMatch(r.out, /RENAMED|SYSCTL|^evil$/m, r.out);
    },
  },
  {
    n: 36,
    name: "the agent's channel: PID 1's descriptors cannot be opened, PID 1 cannot be signalled; forged frames are only output",
    // The reproduction: forged 9-byte frames written to /proc/1/fd/1 made the service exit. The
    // agent is PID 1 and runs as another user than every command now.
    command:
      "for f in 0 1 2; do (printf x > /proc/1/fd/$f) 2>/dev/null && echo WROTE-$f; (timeout 1 head -c 1 /proc/1/fd/$f >/dev/null) 2>/dev/null && echo READ-$f; done; kill -9 1 2>/dev/null && echo KILLED; kill -STOP 1 2>/dev/null && echo STOPPED; echo listed $(ls /proc/1/fd 2>/dev/null | wc -l); printf 'F\\000\\000\\000\\005D\\000\\000\\000\\001\\377\\377\\377\\377\\n'; echo end",
    check: (r, runtime) => {
      assert.doesNotMatch(r.out, /WROTE|READ-|KILLED|STOPPED/, r.out);
      // runc hides even the list of PID 1's descriptors; gVisor lists their numbers (not their ends).
      if (runtime === "runc") assert.match(r.out, /^listed 0$/m);
      assert.match(r.out, /F\0\0\0\x05D\0\0\0\x01/, "a frame a command prints is its output, nothing more");
      assert.match(r.out, /end\n$/);
    },
  },
  {
    n: 37,
    name: "inode and /dev/shm floods end at their bounds",
    command:
      "cd /tmp && seq 1 12000 | xargs touch 2>/dev/null; echo tmp $(ls /tmp | wc -l); cd /dev/shm && seq 1 6000 | xargs touch 2>/dev/null; echo shm $(ls /dev/shm | wc -l); rm -f /dev/shm/*; dd if=/dev/zero of=/dev/shm/big bs=1M count=100 2>&1 | grep -c 'No space left'; rm -f /dev/shm/big /tmp/*; echo end",
    timeoutMs: 60_000,
    check: (r, runtime) => {
      const tmp = Number(/^tmp (\d+)$/m.exec(r.out)?.[1]);
      const shm = Number(/^shm (\d+)$/m.exec(r.out)?.[1]);
      // runc: the tmpfs inode bounds. gVisor ignores nr_inodes; its tmpfs is sandbox memory, under
      // the memory limit, so there the flood's own size is what it reaches.
      if (runtime === "runc") {
        assert.ok(tmp < 8192 && tmp > 8000, `tmp held ${tmp} files`);
        assert.ok(shm < 4096 && shm > 4000, `shm held ${shm} files`);
      } else assert.ok(tmp <= 12_000 && shm <= 6000, r.out);
      assert.match(r.out, /^1$/m, "/dev/shm fills at 16 MiB");
      assert.match(r.out, /end/);
    },
  },
  {
    n: 34,
    name: "no leaked file descriptors or host paths",
    command:
      "ls /proc/self/fd | tr '\\n' ' '; echo; readlink /proc/self/cwd; for f in /proc/self/fd/*; do readlink $f; done",
    check: (r) => {
      const fds = r.out.split("\n")[0].trim().split(" ");
      assert.ok(fds.length <= 4, `open fds: ${fds.join(",")}`);
      assert.equal(r.out.split("\n")[1], "/workspace");
      assert.doesNotMatch(r.out, /\/var\/lib\/docker|\/home\/|\/root\//);
    },
  },
];

/**
 * The release after an attack is its cleanup, not what it tests (the leftovers check at the end
 * of the run finds any container a release missed). Removing a gVisor sandbox that a bomb filled
 * can take the engine long on a loaded machine: over the 10 s default deadline once in CI, and
 * over 30 s once in about a dozen CI runs after the fork bomb (#1), against at most 7 s usually.
 * The runner gives a release 30 s and then leaves the sandbox to its idle timeout.
 */
const RELEASE = { timeoutMs: 90_000 };

/**
 * Releases an attack's sandbox. A release the engine has not finished within RELEASE is not the
 * attack's failure: the container is still being removed (docker says "removal already in
 * progress"), and the leftovers check at the end of the run fails it if it outlives the run.
 */
async function release(sandbox: Sandbox, sessionId: string): Promise<void> {
  await sandbox.releaseSandbox({ sessionId }, RELEASE).catch((err: { code?: number }) => {
    if (err.code !== 4) throw err;
    console.log(
      `# the release of ${sessionId} took over ${RELEASE.timeoutMs / 1000} s; the leftovers check watches it`,
    );
  });
}

for (const runtime of ["runc", "runsc"] as const) {
  describe(`sandbox attacks (${runtime})`, () => {
    let stack: Stack;
    let sandbox: Sandbox;
    let probe: Buffer;
    before(async () => {
      probe = await compileProbe();
      stack = await startStack({ services: ["sandbox"], env: { TROUPE_SANDBOX_RUNTIME: runtime } });
      sandbox = stack.client(SandboxService, stack.addr.sandbox, { as: DEV_IDENTITY });
    });
    after(async () => {
      sandbox?.close();
      await stack?.stop();
    });

    for (const attack of ATTACKS) {
      if (attack.only && attack.only !== runtime) continue;
      test(`#${attack.n} ${attack.name}`, async () => {
        let id = `atk-${runtime}-${attack.n}`;
        let r = await exec(sandbox, id, attack.command, { timeoutMs: attack.timeoutMs });
        if (
          runtime === "runsc" &&
          attack.endsItsSandbox !== runtime &&
          r.exit.exitCode === 137 &&
          r.bytes === 0 &&
          !r.exit.oomKilled &&
          !r.exit.timedOut
        ) {
          console.log(`# KNOWN DEFECT: #${attack.n} under ${runtime}: the sandbox died under the command; once more`);
          console.log(await deathReport(stack));
          await release(sandbox, id);
          id = `${id}-again`;
          r = await exec(sandbox, id, attack.command, { timeoutMs: attack.timeoutMs });
        }
        try {
          attack.check(r, runtime);
        } catch (err) {
          // What the service saw says whether the sandbox ended under the command (a lost agent
          // connection reports exit 137 untruncated) or the command misbehaved.
          const tail = stack
            .logs()
            .split("\n")
            .filter((l) => l.includes("sandbox:"))
            .slice(-8)
            .join("\n");
          throw new Error(
            `${(err as Error).message}\n--- the sandbox service's last lines ---\n${tail}\n${await deathReport(stack)}`,
          );
        }
        if (attack.afterwards)
          assert.equal((await exec(sandbox, id, attack.afterwards.command)).out, attack.afterwards.expect);
        // Whatever it tried, the sandbox still answers.
        const after = await exec(sandbox, id, "echo alive");
        assert.equal(after.out, "alive\n", `after #${attack.n}: ${after.out}`);
        await release(sandbox, id);
      });
    }

    test("#38 a static probe of the system calls escapes start with finds every one refused", async () => {
      const id = `atk-${runtime}-38`;
      await sandbox.writeFile({ sessionId: id, path: "syscall-probe", data: probe, mode: 0o755 });
      const r = await exec(sandbox, id, "./syscall-probe");
      const lines = r.out.trim().split("\n");
      assert.deepEqual(
        lines.map((l) => l.split(" ")[0]),
        PROBED,
        r.out,
      );
      for (const line of lines) assert.match(line, / (EPERM|ENOSYS)$/, `${runtime}: ${line}`);
      await release(sandbox, id);
    });

    test("#30 CPU burn, measured: three busy loops together get one CPU", async () => {
      const id = `atk-${runtime}-30-measured`;
      const burn = exec(sandbox, id, "for i in 1 2 3; do (while :; do :; done) & done; sleep 8", { timeoutMs: 8000 });
      await new Promise((r) => setTimeout(r, 2500));
      const name = sessionContainer(stack.dataDir, id);
      const { stdout } = await run("docker", ["stats", "--no-stream", "--format", "{{.CPUPerc}}", name]);
      const percent = Number.parseFloat(stdout);
      assert.ok(percent > 50 && percent < 135, `the burn used ${stdout.trim()} of a CPU`);
      await burn;
      await release(sandbox, id);
    });

    // Background processes outlive their command (docs/sandbox.md). Here they hold every pid of
    // the sandbox after their command has ended: a loop that forks sleepers until the limit, and
    // then keeps retrying, so that it takes any pid that comes free. The next command must still
    // start. runc only: under runsc the loop reaches the host's pids limit first, which ends the
    // gVisor sandbox itself (#1 there), so the next command gets a new one.
    if (runtime === "runc") {
      test("#1 a fork bomb's leftovers hold every pid after their command ended: the next command ends them and runs", async () => {
        const id = `atk-${runtime}-1-leftovers`;
        const started = await exec(sandbox, id, "(while :; do sleep 1000 & done) >/dev/null 2>&1 & echo started");
        assert.equal(started.out, "started\n");
        assert.equal(started.exit.exitCode, 0);
        // The loop fills the limit (256) in well under a second; nothing is run meanwhile, since
        // any command started while there is a pid left would only take it.
        await new Promise((r) => setTimeout(r, 3000));
        const after = await exec(sandbox, id, "sleep 0.1 && echo alive");
        assert.equal(after.out, "alive\n");
        // Without the agent ending them, the sleepers (1000 s) would still be there.
        const left = await exec(sandbox, id, "ps -o comm | grep -c '^sleep$' || true");
        assert.equal(left.out.trim(), "0", "the leftovers were ended");
        await release(sandbox, id);
      });
    }

    test("#33 a file written in one session's sandbox is not visible in another's", async () => {
      await exec(sandbox, `atk-${runtime}-33a`, "echo secret > /workspace/note; echo hidden > /tmp/note");
      const r = await exec(sandbox, `atk-${runtime}-33b`, "cat /workspace/note /tmp/note 2>&1");
      assert.equal(r.out.match(/No such file or directory/g)?.length, 2, r.out);
      await release(sandbox, `atk-${runtime}-33a`);
      await release(sandbox, `atk-${runtime}-33b`);
    });

    test("the service is still healthy after every attack", async () => {
      const health = createClient(Health, stack.addr.sandbox);
      assert.equal((await health.check({ service: "" })).status, Serving.SERVING);
      health.close();
    });
  });
}
