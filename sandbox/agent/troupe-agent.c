/*
 * troupe-agent: the process that runs inside every sandbox container and starts the commands and
 * file operations the sandbox service asks for.
 *
 * Why it exists: a Docker API exec costs tens of milliseconds per command (create, start, hijack,
 * inspect), and file operations through it would need a shell per call. The service instead
 * attaches once to the container's stdin and stdout and speaks framed requests to this agent,
 * which forks the command itself: a command's round trip is then a pipe write and a fork.
 *
 * It is the container's PID 1, so orphaned processes come back to it to be reaped, and it runs as
 * root with three capabilities only (SETUID, SETGID, KILL; the service sets them): every command
 * and every file operation runs in a child that has become the sandbox user (65534) first. The
 * channel to the service (fds 0 and 1) is therefore held by a process of another user, which no
 * command can open through /proc/1/fd, signal or trace, under runc or gVisor alike (gVisor does
 * not honour PR_SET_DUMPABLE for /proc; a user boundary it does). It has no network and no
 * secret, and never interprets command output. Started as any other user (an older image, a
 * service that sets --user), it runs everything as that user, as before.
 *
 * Frames, both ways: u32 length (of what follows), u8 type, u32 request id, payload; integers
 * big-endian. Requests are listed in agent.h with their payloads; replies name the request id. After a HELLO the agent writes SYNC_MAGIC before its reply, so a service that attached in
 * the middle of an earlier frame can find where frames start.
 *
 * It also holds the sandbox's one way out, when the service grants one: a proxy port on the
 * container's loopback whose connections it carries to the service as frames (egress.c).
 *
 * Built static (`make sandbox-image`) so it runs in any image.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <grp.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "agent.h"

#define AGENT_VERSION "troupe-agent/1"
#define SYNC_MAGIC "\0TRPSYNC"
#define WORKSPACE "/workspace"
#define EGRESS_URL "http://127.0.0.1:3128"
#define MAX_FRAME (17u << 20)      /* a 16 MiB file write plus its header */
#define MAX_EXECS 64
#define EXIT_GRACE_MS 200          /* after a command exits, how long background holders of its pipes may keep them */
#define MAX_SYMLINK_HOPS 40
#define MAX_DEPTH 256
#define SANDBOX_UID 65534
#define SANDBOX_GID 65534
#define FILE_OP_TIMEOUT_MS 20000

enum { EXEC_STDIN = 1, EXEC_PROXY = 2 };
enum { WRITE_PARENTS = 1 };

struct exec {
  uint32_t id;
  pid_t pid;
  int in_fd, out_fd, err_fd;
  char *pending_in;        /* stdin not yet written (the pipe was full) */
  size_t pending_len, pending_off;
  int close_in;            /* close stdin once pending_in is written */
  uint64_t deadline;       /* ms, monotonic; 0 = none */
  uint64_t exited_at;      /* ms, 0 while running */
  int status;
  uint32_t window, unacked;
  uint64_t max_output, sent;
  int timed_out, truncated;
};

static struct exec execs[MAX_EXECS];
static int n_execs;
static int sigchld_pipe[2];
static char claim[256];
/* Where frames go: the service (stdout), or in a file operation's child, the pipe to the agent. */
static int channel = 1;
/* Started as root: commands and file operations run as the sandbox user, in children. */
static int privsep;

/* In a child about to run untrusted work: become the sandbox user for good. 0, or -1. */
static int become_sandbox_user(void) {
  if (!privsep) return 0;
  if (setgroups(0, NULL) < 0 || setgid(SANDBOX_GID) < 0 || setuid(SANDBOX_UID) < 0) return -1;
  return 0;
}

uint64_t now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

void put32(uint8_t *p, uint32_t v) { p[0] = v >> 24; p[1] = v >> 16; p[2] = v >> 8; p[3] = v; }
static void put64(uint8_t *p, uint64_t v) { put32(p, v >> 32); put32(p + 4, (uint32_t)v); }
uint32_t get32(const uint8_t *p) { return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3]; }

/* The service reads our stdout continuously, so a blocking write is the backpressure we want. */
static void write_all(int fd, const void *buf, size_t len) {
  const char *p = buf;
  while (len > 0) {
    ssize_t n = write(fd, p, len);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) _exit(3); /* the service is gone; the container ends with us */
    p += n;
    len -= n;
  }
}

/* One frame: header, then up to two payload parts (a fixed part and a data part). */
void reply(uint8_t type, uint32_t id, const void *a, size_t alen, const void *b, size_t blen) {
  uint8_t head[9];
  put32(head, (uint32_t)(5 + alen + blen));
  head[4] = type;
  put32(head + 5, id);
  write_all(channel, head, 9);
  if (alen) write_all(channel, a, alen);
  if (blen) write_all(channel, b, blen);
}

static void reply_err(uint32_t id, int err, const char *what) {
  uint8_t code[4];
  char msg[512];
  put32(code, (uint32_t)err);
  snprintf(msg, sizeof msg, "%s: %s", what, strerror(err));
  reply(REP_ERR, id, code, 4, msg, strlen(msg));
}

static void on_sigchld(int sig) {
  (void)sig;
  int saved = errno;
  (void)!write(sigchld_pipe[1], "c", 1);
  errno = saved;
}

static struct exec *find_exec(uint32_t id) {
  for (int i = 0; i < n_execs; i++)
    if (execs[i].id == id) return &execs[i];
  return NULL;
}

void close_fd(int *fd) {
  if (*fd >= 0) close(*fd);
  *fd = -1;
}

static void drop_exec(struct exec *e) {
  close_fd(&e->in_fd);
  close_fd(&e->out_fd);
  close_fd(&e->err_fd);
  free(e->pending_in);
  *e = execs[--n_execs];
}

/*
 * Ends every process of the sandbox but ours and init: all run as our user, so kill(-1) reaches
 * them all, however they forked, detached or masked signals. Repeated until nothing is left, so
 * a fork bomb racing the kill loses; no process has to start for it, so a full pid table cannot
 * stop it either.
 */
static void reap(void);
static void kill_all(void) {
  for (int round = 0; round < 1000; round++) {
    if (kill(-1, SIGKILL) < 0 && errno == ESRCH) return;
    struct timespec pause = {0, 1000000};
    nanosleep(&pause, NULL);
    reap(); /* the dead stay in the process table, and within kill's reach, until reaped */
  }
}

static void reap(void) {
  int status;
  pid_t pid;
  while ((pid = waitpid(-1, &status, WNOHANG)) > 0) {
    for (int i = 0; i < n_execs; i++) {
      if (execs[i].pid == pid) {
        execs[i].status = status;
        execs[i].exited_at = now_ms();
      }
    }
  }
}

/*
 * The container's pids controller files, opened once at start (cgroup v2, then v1) and read with
 * pread before each command: two reads instead of path lookups on every command, and none at all
 * where the files do not exist (gVisor shows neither, and its system calls are the dear ones).
 */
static int pids_max_fd = -1, pids_current_fd = -1;

static void open_pids_files(void) {
  static const char *dirs[] = {"/sys/fs/cgroup", "/sys/fs/cgroup/pids"};
  char path[64];
  for (size_t i = 0; i < sizeof dirs / sizeof *dirs; i++) {
    snprintf(path, sizeof path, "%s/pids.max", dirs[i]);
    int max = open(path, O_RDONLY | O_CLOEXEC);
    snprintf(path, sizeof path, "%s/pids.current", dirs[i]);
    int current = open(path, O_RDONLY | O_CLOEXEC);
    if (max >= 0 && current >= 0) {
      pids_max_fd = max, pids_current_fd = current;
      return;
    }
    if (max >= 0) close(max);
    if (current >= 0) close(current);
  }
}

/* A number from a cgroup file ("max" and anything unreadable: -1). */
static long cgroup_number(int fd) {
  char buf[32];
  ssize_t n = pread(fd, buf, sizeof buf - 1, 0);
  if (n <= 0) return -1;
  buf[n] = 0;
  char *end;
  long v = strtol(buf, &end, 10);
  return end == buf ? -1 : v;
}

/* How many more processes the container's pids limit allows, or -1 if it cannot be told. */
static long pids_left(void) {
  if (pids_max_fd < 0) return -1;
  long max = cgroup_number(pids_max_fd), current = cgroup_number(pids_current_fd);
  return max > 0 && current >= 0 ? max - current : -1;
}

/*
 * fork() for a command, first ending the processes earlier commands left behind if they hold
 * (nearly) every pid the sandbox may have. Background processes outlive their command, by design;
 * but once a fork bomb run in the background, say, fills the pids limit, no command can start,
 * or start a child, until the sandbox is released. So when no command of ours is running and
 * fewer than PIDS_RESERVE pids are left, or the fork fails for want of one, the leftovers are
 * ended as a timeout ends them. While a command runs they are left alone: they may be its own.
 */
#define PIDS_RESERVE 16
static pid_t fork_command(void) {
  if (n_execs == 0) {
    long left = pids_left();
    if (left >= 0 && left < PIDS_RESERVE) kill_all();
  }
  pid_t pid = fork();
  if (pid < 0 && errno == EAGAIN && n_execs == 0) {
    kill_all();
    pid = fork();
  }
  return pid;
}

static void start_exec(uint32_t id, const uint8_t *p, size_t len) {
  if (len < 13) return reply_err(id, EINVAL, "short exec request");
  if (n_execs == MAX_EXECS) return reply_err(id, EAGAIN, "too many commands running in this sandbox");
  if (find_exec(id)) return reply_err(id, EEXIST, "exec id in use");
  uint32_t timeout = get32(p), max_output = get32(p + 4), window = get32(p + 8);
  uint8_t flags = p[12];
  size_t clen = len - 13;
  char *command = malloc(clen + 1);
  if (!command) return reply_err(id, ENOMEM, "exec");
  memcpy(command, p + 13, clen);
  command[clen] = 0;

  int in[2] = {-1, -1}, out[2], err[2];
  if (pipe2(out, O_CLOEXEC) < 0) return free(command), reply_err(id, errno, "pipe");
  if (pipe2(err, O_CLOEXEC) < 0) return free(command), close(out[0]), close(out[1]), reply_err(id, errno, "pipe");
  if ((flags & EXEC_STDIN) && pipe2(in, O_CLOEXEC) < 0) {
    free(command), close(out[0]), close(out[1]), close(err[0]), close(err[1]);
    return reply_err(id, errno, "pipe");
  }
  pid_t pid = fork_command();
  if (pid == 0) {
    /* Its own session and process group, so a signal can reach the command and its children. */
    setsid();
    int devnull = open("/dev/null", O_RDONLY | O_CLOEXEC);
    dup2(in[0] >= 0 ? in[0] : devnull, 0);
    dup2(out[1], 1);
    dup2(err[1], 2);
    if (become_sandbox_user() < 0) {
      dprintf(2, "troupe-agent: cannot become the sandbox user: %s\n", strerror(errno));
      _exit(126);
    }
    /* Everything else the agent holds is close-on-exec, so the command sees only 0, 1 and 2. */
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    signal(SIGCHLD, SIG_DFL);
    signal(SIGPIPE, SIG_DFL);
    /* If memory runs out, the kernel should pick the command, not the agent. */
    int adj = open("/proc/self/oom_score_adj", O_WRONLY | O_CLOEXEC);
    if (adj >= 0) (void)!write(adj, "1000", 4), close(adj);
    if (chdir(WORKSPACE) < 0) _exit(126);
    umask(022);
    char *argv[] = {"sh", "-c", command, NULL};
    char *envp[] = {"PATH=/usr/local/bin:/usr/bin:/bin", "HOME=" WORKSPACE, NULL};
    /* Granted a way out: the standard variables name the egress port, for curl, wget, pip, npm. */
    char *proxied[] = {"PATH=/usr/local/bin:/usr/bin:/bin", "HOME=" WORKSPACE,
                       "http_proxy=" EGRESS_URL, "https_proxy=" EGRESS_URL, "HTTP_PROXY=" EGRESS_URL,
                       "HTTPS_PROXY=" EGRESS_URL, "no_proxy=localhost,127.0.0.1", "NO_PROXY=localhost,127.0.0.1",
                       NULL};
    execve("/bin/sh", argv, (flags & EXEC_PROXY) ? proxied : envp);
    dprintf(2, "troupe-agent: cannot run /bin/sh: %s\n", strerror(errno));
    _exit(127);
  }
  int fork_errno = errno;
  free(command);
  close(out[1]);
  close(err[1]);
  if (in[0] >= 0) close(in[0]);
  if (pid < 0) {
    close(out[0]), close(err[0]);
    if (in[1] >= 0) close(in[1]);
    return reply_err(id, fork_errno, "fork");
  }
  if (in[1] >= 0) fcntl(in[1], F_SETFL, O_NONBLOCK);
  fcntl(out[0], F_SETFL, O_NONBLOCK);
  fcntl(err[0], F_SETFL, O_NONBLOCK);
  struct exec *e = &execs[n_execs++];
  memset(e, 0, sizeof *e);
  e->id = id;
  e->pid = pid;
  e->in_fd = in[1];
  e->out_fd = out[0];
  e->err_fd = err[0];
  e->deadline = timeout ? now_ms() + timeout : 0;
  e->window = window ? window : 256 * 1024;
  e->max_output = max_output;
}

static void flush_stdin(struct exec *e) {
  while (e->in_fd >= 0 && e->pending_off < e->pending_len) {
    ssize_t n = write(e->in_fd, e->pending_in + e->pending_off, e->pending_len - e->pending_off);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno == EAGAIN) return;
    if (n < 0) { /* the command closed its stdin; the rest is not wanted */
      close_fd(&e->in_fd);
      break;
    }
    e->pending_off += n;
  }
  free(e->pending_in);
  e->pending_in = NULL;
  e->pending_len = e->pending_off = 0;
  if (e->close_in) close_fd(&e->in_fd);
}

static void queue_stdin(struct exec *e, const uint8_t *p, size_t len) {
  if (e->in_fd < 0 || len == 0) return;
  char *grown = realloc(e->pending_in, e->pending_len + len);
  if (!grown) return;
  memcpy(grown + e->pending_len, p, len);
  e->pending_in = grown;
  e->pending_len += len;
  flush_stdin(e);
}

/* Reads what a command wrote, within its credit; output past the cap is read and dropped. */
static void pump_output(struct exec *e, int *fd, uint8_t stream) {
  static char buf[64 * 1024];
  /* A bounded number of reads per wake-up, so a flood on one pipe cannot starve the rest. */
  for (int reads = 0; reads < 16; reads++) {
    size_t room = sizeof buf;
    if (e->sent < e->max_output && e->window - e->unacked < room) room = e->window - e->unacked;
    if (room == 0) return;
    ssize_t n = read(*fd, buf, room);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno == EAGAIN) return;
    if (n <= 0) {
      close_fd(fd);
      return;
    }
    uint64_t keep = e->sent >= e->max_output ? 0 : e->max_output - e->sent;
    if ((uint64_t)n > keep) e->truncated = 1;
    if (keep > (uint64_t)n) keep = n;
    if (keep) {
      reply(REP_OUT, e->id, &stream, 1, buf, keep);
      e->sent += keep;
      e->unacked += keep;
    }
  }
}

static int exec_finished(struct exec *e, uint64_t now) {
  if (!e->exited_at) return 0;
  if (e->out_fd < 0 && e->err_fd < 0) return 1;
  /* Background processes may hold the pipes open: stop waiting for them after a grace period,
   * but never while output is held back by the service's credit. */
  return now >= e->exited_at + EXIT_GRACE_MS && e->unacked < e->window;
}

static void finish_exec(struct exec *e) {
  uint8_t body[9];
  int code = WIFEXITED(e->status) ? WEXITSTATUS(e->status) : 128 + WTERMSIG(e->status);
  int sig = WIFSIGNALED(e->status) ? WTERMSIG(e->status) : 0;
  put32(body, (uint32_t)code);
  put32(body + 4, (uint32_t)sig);
  body[8] = (e->timed_out ? 1 : 0) | (e->truncated ? 2 : 0);
  reply(REP_EXIT, e->id, body, 9, NULL, 0);
  drop_exec(e);
}

/* ---- paths: every file operation stays inside the workspace ----
 *
 * A path is walked one component at a time from a descriptor of the workspace, never through a
 * path string the kernel resolves: symbolic links are read and followed by hand only while they
 * stay inside the workspace, and every open uses O_NOFOLLOW, so a link swapped in while we walk
 * is refused rather than followed. `..` never occurs in a request (the service refuses it) and
 * inside a link it cannot climb above the workspace.
 */
struct walk {
  int fds[MAX_DEPTH];
  int depth; /* fds[0] is the workspace */
};

static void walk_free(struct walk *w) {
  for (int i = 0; i <= w->depth; i++) close(w->fds[i]);
}

/*
 * Resolves `path` to its parent directory (left at w->fds[w->depth]) and its last component
 * (copied to leaf; "" for the workspace itself). With `parents`, missing directories are made.
 * Returns 0 or an errno; EXDEV means a link leads out of the workspace.
 */
static int resolve(const char *path, struct walk *w, char *leaf, size_t leaf_size, int parents) {
  char todo[8192];
  int hops = 0;
  w->depth = -1;
  if (strlen(path) >= sizeof todo / 2) return ENAMETOOLONG;
  strcpy(todo, path);
  w->fds[0] = open(WORKSPACE, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (w->fds[0] < 0) return errno;
  w->depth = 0;
  leaf[0] = 0;
  char *rest = todo;
  for (;;) {
    while (*rest == '/') rest++;
    if (!*rest) return 0;
    char *slash = strchr(rest, '/');
    size_t n = slash ? (size_t)(slash - rest) : strlen(rest);
    char name[256];
    if (n >= sizeof name) return ENAMETOOLONG;
    memcpy(name, rest, n);
    name[n] = 0;
    rest += n;
    int last = 1;
    for (char *q = rest; *q; q++)
      if (*q != '/') last = 0;
    if (!strcmp(name, ".")) continue;
    if (!strcmp(name, "..")) {
      if (w->depth == 0) return EXDEV;
      close(w->fds[w->depth--]);
      continue;
    }
    int dir = w->fds[w->depth];
    struct stat st;
    if (fstatat(dir, name, &st, AT_SYMLINK_NOFOLLOW) < 0) {
      if (errno != ENOENT) return errno;
      if (last) return snprintf(leaf, leaf_size, "%s", name), 0;
      if (!parents) return ENOENT;
      if (mkdirat(dir, name, 0755) < 0) return errno;
      st.st_mode = S_IFDIR;
    }
    if (S_ISLNK(st.st_mode)) {
      if (++hops > MAX_SYMLINK_HOPS) return ELOOP;
      char target[4096];
      ssize_t tn = readlinkat(dir, name, target, sizeof target - 1);
      if (tn < 0) return errno;
      target[tn] = 0;
      if (target[0] == '/') {
        /* Absolute: only as a path inside the workspace, walked again from its top. */
        size_t wl = strlen(WORKSPACE);
        if (strncmp(target, WORKSPACE, wl) || (target[wl] && target[wl] != '/')) return EXDEV;
        while (w->depth > 0) close(w->fds[w->depth--]);
        memmove(target, target + wl, strlen(target + wl) + 1);
      }
      /* Splice the link's target in front of what is left to walk. */
      size_t tl = strlen(target), rl = strlen(rest);
      if (tl + rl + 2 > sizeof todo) return ENAMETOOLONG;
      memmove(todo + tl + 1, rest, rl + 1);
      memcpy(todo, target, tl);
      todo[tl] = '/';
      rest = todo;
      continue;
    }
    if (last) return snprintf(leaf, leaf_size, "%s", name), 0;
    if (!S_ISDIR(st.st_mode)) return ENOTDIR;
    if (w->depth + 1 >= MAX_DEPTH) return ENAMETOOLONG;
    int fd = openat(dir, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) return errno; /* ELOOP: swapped for a link under us */
    w->fds[++w->depth] = fd;
  }
}

/* Reads a request of the form u32 limit, path; 0 or an errno. */
static int limit_and_path(const uint8_t *p, size_t len, uint32_t *limit, char *path, size_t size) {
  if (len < 4) return EINVAL;
  if (len - 4 >= size) return ENAMETOOLONG;
  *limit = get32(p);
  memcpy(path, p + 4, len - 4);
  path[len - 4] = 0;
  return 0;
}

static void read_file(uint32_t id, const uint8_t *p, size_t len) {
  uint32_t max;
  char path[4097], leaf[256];
  struct walk w = {.depth = -1};
  int err = limit_and_path(p, len, &max, path, sizeof path);
  if (!err) err = resolve(path, &w, leaf, sizeof leaf, 0);
  if (!err && !leaf[0]) err = EISDIR;
  int fd = -1;
  if (!err) {
    /* Non-blocking, so a FIFO planted in the workspace cannot hang the agent. */
    fd = openat(w.fds[w.depth], leaf, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) err = errno;
  }
  walk_free(&w);
  struct stat st;
  if (!err && fstat(fd, &st) < 0) err = errno;
  if (!err && !S_ISREG(st.st_mode)) err = S_ISDIR(st.st_mode) ? EISDIR : EINVAL;
  if (err) {
    if (fd >= 0) close(fd);
    return reply_err(id, err, "read");
  }
  uint64_t want = (uint64_t)st.st_size < max ? (uint64_t)st.st_size : max;
  char *buf = malloc(want ? want : 1);
  size_t got = 0;
  while (buf && got < want) {
    ssize_t n = read(fd, buf + got, want - got);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    got += n;
  }
  close(fd);
  if (!buf) return reply_err(id, ENOMEM, "read");
  uint8_t head[9];
  put64(head, (uint64_t)st.st_size);
  head[8] = (uint64_t)st.st_size > got;
  reply(REP_FILE, id, head, 9, buf, got);
  free(buf);
}

static void write_file(uint32_t id, const uint8_t *p, size_t len) {
  if (len < 7) return reply_err(id, EINVAL, "short write request");
  uint8_t flags = p[0];
  mode_t mode = get32(p + 1) & 0777;
  size_t plen = (size_t)p[5] << 8 | p[6];
  if (plen == 0 || 7 + plen > len) return reply_err(id, EINVAL, "write: bad path length");
  char path[4097], leaf[256];
  memcpy(path, p + 7, plen);
  path[plen] = 0;
  const uint8_t *data = p + 7 + plen;
  size_t dlen = len - 7 - plen;
  struct walk w;
  int err = resolve(path, &w, leaf, sizeof leaf, flags & WRITE_PARENTS);
  if (!err && !leaf[0]) err = EISDIR;
  if (err) {
    walk_free(&w);
    return reply_err(id, err, "write");
  }
  /* Written aside and renamed into place: readers never see half a file, and rename replaces a
   * link planted at the name rather than following it. */
  int dir = w.fds[w.depth];
  char tmp[64];
  snprintf(tmp, sizeof tmp, ".troupe-write-%u", id);
  int fd = openat(dir, tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, mode ? mode : 0644);
  if (fd < 0) {
    err = errno;
    walk_free(&w);
    return reply_err(id, err, "write");
  }
  size_t off = 0;
  while (off < dlen) {
    ssize_t n = write(fd, data + off, dlen - off);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      err = errno;
      break;
    }
    off += n;
  }
  if (mode) fchmod(fd, mode); /* the umask does not apply to what was asked for */
  if (close(fd) < 0 && !err) err = errno;
  if (!err && renameat(dir, tmp, dir, leaf) < 0) err = errno;
  if (err) unlinkat(dir, tmp, 0);
  walk_free(&w);
  if (err) return reply_err(id, err, "write");
  reply(REP_OK, id, NULL, 0, NULL, 0);
}

static void list_dir(uint32_t id, const uint8_t *p, size_t len) {
  uint32_t max;
  char path[4097], leaf[256];
  struct walk w = {.depth = -1};
  int err = limit_and_path(p, len, &max, path, sizeof path);
  if (!err) err = resolve(path, &w, leaf, sizeof leaf, 0);
  int fd = -1;
  if (!err) {
    fd = leaf[0] ? openat(w.fds[w.depth], leaf, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC) : dup(w.fds[w.depth]);
    if (fd < 0) err = errno;
  }
  walk_free(&w);
  if (err) return reply_err(id, err, "list");
  DIR *d = fdopendir(fd);
  if (!d) return close(fd), reply_err(id, errno, "list");
  size_t cap = 64 * 1024, used = 1;
  uint8_t *out = malloc(cap);
  if (out) out[0] = 0;
  uint32_t count = 0;
  struct dirent *ent;
  while (out && (ent = readdir(d))) {
    if (!strcmp(ent->d_name, ".") || !strcmp(ent->d_name, "..")) continue;
    if (count == max) {
      out[0] = 1;
      break;
    }
    struct stat st;
    if (fstatat(dirfd(d), ent->d_name, &st, AT_SYMLINK_NOFOLLOW) < 0) continue;
    size_t nlen = strlen(ent->d_name);
    if (used + 19 + nlen > cap) {
      uint8_t *grown = realloc(out, cap *= 2);
      if (!grown) break;
      out = grown;
    }
    uint8_t *q = out + used;
    q[0] = S_ISREG(st.st_mode) ? 1 : S_ISDIR(st.st_mode) ? 2 : S_ISLNK(st.st_mode) ? 3 : 4;
    put64(q + 1, (uint64_t)st.st_size);
    put64(q + 9, (uint64_t)st.st_mtim.tv_sec * 1000 + st.st_mtim.tv_nsec / 1000000);
    q[17] = nlen >> 8;
    q[18] = nlen & 0xff;
    memcpy(q + 19, ent->d_name, nlen);
    used += 19 + nlen;
    count++;
  }
  closedir(d);
  if (!out) return reply_err(id, ENOMEM, "list");
  reply(REP_LISTING, id, out, used, NULL, 0);
  free(out);
}

static void file_op(uint8_t type, uint32_t id, const uint8_t *p, size_t len) {
  if (type == REQ_READ) read_file(id, p, len);
  else if (type == REQ_WRITE) write_file(id, p, len);
  else list_dir(id, p, len);
}

/*
 * A file operation, run as the sandbox user: in a child that has dropped to it, whose one reply
 * frame comes back through a pipe and is checked (one whole frame, this request's id, a file
 * reply's type) before it is passed on. A child that says anything else, or takes longer than
 * FILE_OP_TIMEOUT_MS, is killed and the request answered with an error.
 */
static void as_sandbox_user(uint8_t type, uint32_t id, const uint8_t *p, size_t len) {
  if (!privsep) return file_op(type, id, p, len);
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) < 0) return reply_err(id, errno, "pipe");
  pid_t pid = fork_command();
  if (pid == 0) {
    close(fds[0]);
    int devnull = open("/dev/null", O_RDWR | O_CLOEXEC);
    dup2(devnull, 0), dup2(devnull, 1), dup2(devnull, 2); /* the service's channel is not the child's */
    if (become_sandbox_user() < 0) _exit(126);
    channel = fds[1];
    file_op(type, id, p, len);
    _exit(0);
  }
  int fork_errno = errno;
  close(fds[1]);
  if (pid < 0) return close(fds[0]), reply_err(id, fork_errno, "fork");
  size_t cap = 64 * 1024, have = 0;
  uint8_t *buf = malloc(cap);
  uint64_t deadline = now_ms() + FILE_OP_TIMEOUT_MS;
  int ok = buf != NULL;
  while (ok) {
    uint64_t now = now_ms();
    struct pollfd pfd = {.fd = fds[0], .events = POLLIN};
    int r = now >= deadline ? 0 : poll(&pfd, 1, (int)(deadline - now));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) { ok = 0; break; }
    if (have == cap) {
      if (cap >= 9 + (size_t)MAX_FRAME) { ok = 0; break; }
      uint8_t *grown = realloc(buf, cap * 2);
      if (!grown) { ok = 0; break; }
      buf = grown, cap *= 2;
    }
    ssize_t n = read(fds[0], buf + have, cap - have);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) { ok = 0; break; }
    if (n == 0) break;
    have += n;
  }
  close(fds[0]);
  kill(pid, SIGKILL); /* done or overdue: either way it has nothing more to do */
  ok = ok && have >= 9 && get32(buf) == have - 4 && get32(buf + 5) == id &&
       (buf[4] == REP_OK || buf[4] == REP_ERR || buf[4] == REP_FILE || buf[4] == REP_LISTING);
  if (ok) write_all(channel, buf, have);
  free(buf);
  if (!ok) reply_err(id, EIO, "file operation did not complete");
}

static void handle(uint8_t type, uint32_t id, const uint8_t *p, size_t len) {
  struct exec *e;
  switch (type) {
  case REQ_HELLO:
    /* A new connection: commands started for an earlier one have nobody to report to. */
    if (n_execs > 0) {
      kill_all();
      while (n_execs > 0) drop_exec(&execs[0]);
    }
    egress_drop_all();
    write_all(channel, SYNC_MAGIC, 8);
    {
      static const char version[] = AGENT_VERSION "\n";
      reply(REP_HELLO, id, version, sizeof version - 1, claim, strlen(claim));
    }
    break;
  case REQ_CLAIM:
    if (len >= sizeof claim) return reply_err(id, ENAMETOOLONG, "claim");
    memcpy(claim, p, len);
    claim[len] = 0;
    reply(REP_OK, id, NULL, 0, NULL, 0);
    break;
  case REQ_EXEC:
    start_exec(id, p, len);
    break;
  case REQ_STDIN:
    if ((e = find_exec(id))) queue_stdin(e, p, len);
    break;
  case REQ_STDIN_CLOSE:
    if ((e = find_exec(id))) {
      e->close_in = 1;
      flush_stdin(e);
    }
    break;
  case REQ_SIGNAL:
    if (!(e = find_exec(id)) || e->exited_at) return reply_err(id, ESRCH, "signal");
    if (len < 1 || kill(-e->pid, p[0]) < 0) return reply_err(id, len < 1 ? EINVAL : errno, "signal");
    reply(REP_OK, id, NULL, 0, NULL, 0);
    break;
  case REQ_CREDIT:
    if (len >= 4 && (e = find_exec(id))) e->unacked = get32(p) > e->unacked ? 0 : e->unacked - get32(p);
    break;
  case REQ_KILL_ALL:
    kill_all();
    reply(REP_OK, id, NULL, 0, NULL, 0);
    break;
  case REQ_READ:
  case REQ_WRITE:
  case REQ_LIST:
    as_sandbox_user(type, id, p, len);
    break;
  case REQ_NET_SEND:
  case REQ_NET_CREDIT:
  case REQ_NET_END:
    egress_request(type, id, p, len);
    break;
  default:
    reply_err(id, ENOSYS, "unknown request");
  }
}

int main(void) {
  privsep = geteuid() == 0;
  /* Orphans of commands come back to us to be reaped (we are PID 1; elsewhere this keeps them ours). */
  prctl(PR_SET_CHILD_SUBREAPER, 1);
  /* Commands run as our user: refuse them ptrace and /proc/<pid>/mem of this process. */
  prctl(PR_SET_DUMPABLE, 0);
  signal(SIGPIPE, SIG_IGN);
  if (pipe2(sigchld_pipe, O_CLOEXEC | O_NONBLOCK) < 0) return 1;
  struct sigaction sa = {0};
  sa.sa_handler = on_sigchld;
  sa.sa_flags = SA_RESTART | SA_NOCLDSTOP;
  sigaction(SIGCHLD, &sa, NULL);
  fcntl(0, F_SETFD, FD_CLOEXEC);
  fcntl(1, F_SETFD, FD_CLOEXEC);
  fcntl(2, F_SETFD, FD_CLOEXEC);
  open_pids_files();
  egress_listen();

  size_t cap = 64 * 1024, have = 0;
  uint8_t *in = malloc(cap);
  for (;;) {
    struct pollfd fds[2 + 3 * MAX_EXECS + 1 + EGRESS_MAX_CONNS];
    struct { struct exec *e; int which; } owner[2 + 3 * MAX_EXECS];
    int nfds = 0;
    fds[nfds++] = (struct pollfd){.fd = 0, .events = POLLIN};
    fds[nfds++] = (struct pollfd){.fd = sigchld_pipe[0], .events = POLLIN};
    uint64_t now = now_ms(), wake = 0;
    for (int i = 0; i < n_execs; i++) {
      struct exec *e = &execs[i];
      int room = e->unacked < e->window || e->sent >= e->max_output;
      if (e->out_fd >= 0 && room) owner[nfds].e = e, owner[nfds].which = 1, fds[nfds++] = (struct pollfd){.fd = e->out_fd, .events = POLLIN};
      if (e->err_fd >= 0 && room) owner[nfds].e = e, owner[nfds].which = 2, fds[nfds++] = (struct pollfd){.fd = e->err_fd, .events = POLLIN};
      if (e->in_fd >= 0 && e->pending_len) owner[nfds].e = e, owner[nfds].which = 0, fds[nfds++] = (struct pollfd){.fd = e->in_fd, .events = POLLOUT};
      uint64_t t = e->exited_at ? e->exited_at + EXIT_GRACE_MS : e->deadline;
      if (t && (!wake || t < wake)) wake = t;
    }
    int timeout = wake ? (wake > now ? (int)(wake - now) : 0) : -1;
    int exec_fds = nfds;
    nfds = egress_poll_add(fds, nfds);
    if (poll(fds, nfds, timeout) < 0 && errno != EINTR) return 2;

    if (fds[1].revents) {
      char drain[64];
      while (read(sigchld_pipe[0], drain, sizeof drain) > 0) {}
      reap();
    }
    egress_poll_done(fds, exec_fds, nfds);
    for (int i = 2; i < exec_fds; i++) {
      if (!fds[i].revents) continue;
      struct exec *e = owner[i].e;
      if (owner[i].which == 0) flush_stdin(e);
      else pump_output(e, owner[i].which == 1 ? &e->out_fd : &e->err_fd, (uint8_t)owner[i].which);
    }
    if (fds[0].revents) {
      if (have == cap) {
        uint8_t *grown = realloc(in, cap * 2);
        if (!grown) return 4;
        in = grown;
        cap *= 2;
      }
      ssize_t n = read(0, in + have, cap - have);
      if (n == 0) {
        /* The service closed our stdin for good: end everything. */
        kill_all();
        return 0;
      }
      if (n > 0) have += n;
      size_t off = 0;
      while (have - off >= 9) {
        uint32_t flen = get32(in + off);
        if (flen < 5 || flen > MAX_FRAME) return 5; /* not our protocol: stop rather than guess */
        if (have - off < 4 + (size_t)flen) {
          if (cap < 4 + (size_t)flen) {
            uint8_t *grown = realloc(in, 4 + (size_t)flen);
            if (!grown) return 4;
            in = grown;
            cap = 4 + (size_t)flen;
          }
          break;
        }
        handle(in[off + 4], get32(in + off + 5), in + off + 9, flen - 5);
        off += 4 + flen;
      }
      memmove(in, in + off, have - off);
      have -= off;
    }
    now = now_ms();
    for (int i = 0; i < n_execs; i++) {
      struct exec *e = &execs[i];
      if (!e->exited_at && e->deadline && now >= e->deadline) {
        e->timed_out = 1;
        kill_all();
        reap();
      }
    }
    for (int i = n_execs - 1; i >= 0; i--) {
      struct exec *e = &execs[i];
      /* Drain what is readable before reporting the end, so no output is lost. */
      if (e->exited_at && e->out_fd >= 0) pump_output(e, &e->out_fd, 1);
      if (e->exited_at && e->err_fd >= 0) pump_output(e, &e->err_fd, 2);
      if (exec_finished(e, now)) finish_exec(e);
    }
  }
}
