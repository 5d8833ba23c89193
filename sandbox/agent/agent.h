/*
 * What the agent's two files share: the protocol's frame types and the frame writer
 * (troupe-agent.c), and the egress listener's entry points (egress.c).
 *
 * Frames, both ways: u32 length (of what follows), u8 type, u32 id, payload; big-endian. A
 * request's id is chosen by the service; an egress connection's id by the agent (EGRESS_ID_BASE
 * and up), so the two never meet.
 */
#ifndef TROUPE_AGENT_H
#define TROUPE_AGENT_H
#include <poll.h>
#include <stddef.h>
#include <stdint.h>

enum request {
  REQ_HELLO = 1,       /* -> HELLO (version, claim). Ends commands and connections left by an earlier connection. */
  REQ_CLAIM = 2,       /* key -> OK. Records whose sandbox this is (for listing after a restart). */
  REQ_EXEC = 3,        /* u32 timeout_ms, u32 max_output, u32 window, u8 flags, command -> OUT*, EXIT */
  REQ_STDIN = 4,       /* bytes for the command's stdin */
  REQ_STDIN_CLOSE = 5, /* close the command's stdin once what was sent is written */
  REQ_SIGNAL = 6,      /* u8 signal -> OK | ERR: to the command's process group */
  REQ_CREDIT = 7,      /* u32 bytes: the service has passed on that much output */
  REQ_KILL_ALL = 8,    /* -> OK once every other process of the sandbox is dead */
  REQ_READ = 9,        /* u32 max_bytes, path -> FILE | ERR */
  REQ_WRITE = 10,      /* u8 flags, u32 mode, u16 path length, path, data -> OK | ERR */
  REQ_LIST = 11,       /* u32 max_entries, path -> LISTING | ERR */
  REQ_NET_SEND = 12,   /* (connection id) bytes for the connection, within what NET_WRITTEN has credited */
  REQ_NET_CREDIT = 13, /* (connection id) u32 bytes: the service has passed on that much of NET_DATA */
  REQ_NET_END = 14,    /* (connection id) u8 how: 0 shut our sending side once written, 1 close now */
};

enum reply {
  REP_HELLO = 64,
  REP_OK = 65,
  REP_ERR = 66,       /* i32 errno, message */
  REP_OUT = 67,       /* u8 stream (1 stdout, 2 stderr), bytes */
  REP_EXIT = 68,      /* i32 exit code, i32 signal, u8 flags (1 timed out, 2 truncated) */
  REP_FILE = 69,      /* u64 size, u8 truncated, bytes */
  REP_LISTING = 70,   /* u8 truncated, then per entry: u8 type, u64 size, i64 mtime ms, u16 name length, name */
  REP_NET_OPEN = 71,  /* (connection id) a command connected to the egress port */
  REP_NET_DATA = 72,  /* (connection id) bytes the command sent, within the window */
  REP_NET_WRITTEN = 73, /* (connection id) u32 bytes of NET_SEND written to the command */
  REP_NET_END = 74,   /* (connection id) u8 how: 0 the command has sent all it will, 1 the connection is gone */
};

#define EGRESS_ID_BASE 0x80000000u
#define EGRESS_MAX_CONNS 32

uint64_t now_ms(void);
void put32(uint8_t *p, uint32_t v);
uint32_t get32(const uint8_t *p);
void close_fd(int *fd);
void reply(uint8_t type, uint32_t id, const void *a, size_t alen, const void *b, size_t blen);

/* egress.c: the proxy port on the container's loopback, whose connections travel as frames. */
void egress_listen(void);
int egress_poll_add(struct pollfd *fds, int n);
void egress_poll_done(const struct pollfd *fds, int from, int to);
void egress_request(uint8_t type, uint32_t id, const uint8_t *p, size_t len);
void egress_drop_all(void);

#endif
