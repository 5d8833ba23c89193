/*
 * The sandbox's one way out: a TCP port on the container's own loopback (127.0.0.1:3128) that
 * commands use as an HTTP proxy. The container has no network interface; each connection
 * accepted here travels to the service as frames on the agent's channel, and the service
 * (services/sandbox/egress-proxy.ts) decides where, if anywhere, it goes. Nothing here reads
 * what the bytes say, so nothing a command sends can steer the agent.
 *
 * Bounded both ways, so no command can make the agent (PID 1) hold much: at most
 * EGRESS_MAX_CONNS connections (more are closed as they come); at most CONN_WINDOW bytes of a
 * connection sent to the service before it credits them; at most CONN_WINDOW bytes from the
 * service held for a command that does not read (the service keeps to that from NET_WRITTEN;
 * a connection it overfills is closed).
 *
 * The port is bound at start, before any command runs, so no command can take it first.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "agent.h"

#define EGRESS_PORT 3128
#define CONN_WINDOW (256 * 1024)
#define ACCEPTS_PER_WAKE 64

struct conn {
  uint32_t id;
  int fd;
  uint32_t unacked;  /* sent to the service, not yet credited */
  uint8_t *pending;  /* from the service, not yet written to the command */
  size_t pending_len, pending_off;
  int eof_sent;      /* the command's side ended, and the service was told */
  int shut_asked;    /* the service's side ended: shut ours once pending is written */
  int shut_done;
};

static struct conn conns[EGRESS_MAX_CONNS];
static int n_conns;
static int listen_fd = -1;
static uint32_t next_id = EGRESS_ID_BASE;
/* Which connection each poll slot was for this round: ids, since dropping one moves the rest. */
static uint32_t polled[EGRESS_MAX_CONNS];

void egress_listen(void) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return;
  struct sockaddr_in addr = {.sin_family = AF_INET, .sin_port = htons(EGRESS_PORT)};
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  int on = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof on);
  if (bind(fd, (struct sockaddr *)&addr, sizeof addr) < 0 || listen(fd, 16) < 0) {
    dprintf(2, "troupe-agent: no egress port: %s\n", strerror(errno));
    close(fd);
    return;
  }
  listen_fd = fd;
}

static struct conn *find(uint32_t id) {
  for (int i = 0; i < n_conns; i++)
    if (conns[i].id == id) return &conns[i];
  return NULL;
}

/* Closes a connection; `tell`: the service has not asked for it, so it hears NET_END 1. */
static void drop(struct conn *c, int tell) {
  if (tell) reply(REP_NET_END, c->id, "\1", 1, NULL, 0);
  close_fd(&c->fd);
  free(c->pending);
  *c = conns[--n_conns];
}

void egress_drop_all(void) {
  while (n_conns > 0) drop(&conns[0], 0);
}

static void accept_some(void) {
  for (int i = 0; i < ACCEPTS_PER_WAKE; i++) {
    int fd = accept4(listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) return;
    if (n_conns == EGRESS_MAX_CONNS) {
      close(fd);
      continue;
    }
    struct conn *c = &conns[n_conns++];
    memset(c, 0, sizeof *c);
    c->id = next_id++;
    if (next_id == 0) next_id = EGRESS_ID_BASE;
    c->fd = fd;
    reply(REP_NET_OPEN, c->id, NULL, 0, NULL, 0);
  }
}

/* Both sides have ended: the connection is done. 1 if it was dropped. */
static int finish_if_done(struct conn *c) {
  if (!c->eof_sent || !c->shut_done) return 0;
  drop(c, 1);
  return 1;
}

/* What the command sent, to the service, within the window. */
static void pump_in(struct conn *c) {
  static uint8_t buf[64 * 1024];
  for (int reads = 0; reads < 4 && c->unacked < CONN_WINDOW; reads++) {
    size_t room = CONN_WINDOW - c->unacked;
    if (room > sizeof buf) room = sizeof buf;
    ssize_t n = read(c->fd, buf, room);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno == EAGAIN) return;
    if (n < 0) return drop(c, 1);
    if (n == 0) {
      c->eof_sent = 1;
      reply(REP_NET_END, c->id, "\0", 1, NULL, 0);
      finish_if_done(c);
      return;
    }
    reply(REP_NET_DATA, c->id, buf, (size_t)n, NULL, 0);
    c->unacked += (uint32_t)n;
  }
}

/* What the service sent, to the command, as far as it reads. 0 if the connection was dropped. */
static int flush_out(struct conn *c) {
  while (c->pending_off < c->pending_len) {
    ssize_t n = write(c->fd, c->pending + c->pending_off, c->pending_len - c->pending_off);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno == EAGAIN) return 1;
    if (n < 0) return drop(c, 1), 0;
    c->pending_off += (size_t)n;
    uint8_t written[4];
    put32(written, (uint32_t)n);
    reply(REP_NET_WRITTEN, c->id, written, 4, NULL, 0);
  }
  free(c->pending);
  c->pending = NULL;
  c->pending_len = c->pending_off = 0;
  if (c->shut_asked && !c->shut_done) {
    shutdown(c->fd, SHUT_WR);
    c->shut_done = 1;
    if (finish_if_done(c)) return 0;
  }
  return 1;
}

static void queue_out(struct conn *c, const uint8_t *p, size_t len) {
  size_t live = c->pending_len - c->pending_off;
  if (c->shut_asked || live + len > CONN_WINDOW) return drop(c, 1); /* past the window: not the protocol */
  if (c->pending_off) memmove(c->pending, c->pending + c->pending_off, live);
  uint8_t *grown = realloc(c->pending, live + len);
  if (!grown) return drop(c, 1);
  memcpy(grown + live, p, len);
  c->pending = grown;
  c->pending_len = live + len;
  c->pending_off = 0;
  flush_out(c);
}

void egress_request(uint8_t type, uint32_t id, const uint8_t *p, size_t len) {
  struct conn *c = find(id);
  if (!c) return; /* gone already; the service has heard (or will hear) NET_END 1 */
  if (type == REQ_NET_SEND) queue_out(c, p, len);
  else if (type == REQ_NET_CREDIT && len >= 4) c->unacked = get32(p) > c->unacked ? 0 : c->unacked - get32(p);
  else if (type == REQ_NET_END && len >= 1 && p[0] == 1) drop(c, 0);
  else if (type == REQ_NET_END) {
    c->shut_asked = 1;
    flush_out(c);
  }
}

/* Adds the listening port and each connection that can move now to a poll set; returns its new size. */
int egress_poll_add(struct pollfd *fds, int n) {
  fds[n++] = (struct pollfd){.fd = listen_fd, .events = POLLIN};
  for (int i = 0; i < n_conns; i++) {
    struct conn *c = &conns[i];
    short events = 0;
    if (!c->eof_sent && c->unacked < CONN_WINDOW) events |= POLLIN;
    if (c->pending_off < c->pending_len) events |= POLLOUT;
    /* Nothing wanted: left out, or a hung-up peer would wake every poll. */
    fds[n++] = (struct pollfd){.fd = events ? c->fd : -1, .events = events};
    polled[i] = c->id;
  }
  return n;
}

/* Acts on what poll said of the slots egress_poll_add filled, fds[from] to fds[to - 1]. */
void egress_poll_done(const struct pollfd *fds, int from, int to) {
  if (fds[from].revents) accept_some();
  for (int i = from + 1; i < to; i++) {
    short ev = fds[i].revents;
    struct conn *c = ev ? find(polled[i - from - 1]) : NULL;
    if (!c) continue;
    if ((ev & (POLLOUT | POLLERR | POLLHUP)) && c->pending_off < c->pending_len && !flush_out(c)) continue;
    if ((ev & (POLLIN | POLLERR | POLLHUP)) && !c->eof_sent) pump_in(c);
  }
}
