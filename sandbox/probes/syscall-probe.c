/*
 * syscall-probe: tries, from inside a sandbox, the system calls a container escape or a kernel
 * exploit starts with, and prints one line per call: its name, then "ok" if the kernel let it
 * through or the errno name that refused it. test/sandbox-attacks.test.ts compiles it static on
 * the host, writes it into a sandbox's workspace and runs it under runc and runsc; every line must
 * be a refusal.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/bpf.h>
#include <linux/perf_event.h>
#include <sched.h>
#include <stdio.h>
#include <string.h>
#include <sys/ptrace.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <sys/uio.h>
#include <unistd.h>

#ifndef SYS_io_uring_setup
#define SYS_io_uring_setup 425
#endif

static const char *errno_name(int e) {
  switch (e) {
  case EPERM: return "EPERM";
  case EACCES: return "EACCES";
  case ENOSYS: return "ENOSYS";
  case EINVAL: return "EINVAL";
  case EAFNOSUPPORT: return "EAFNOSUPPORT";
  case EROFS: return "EROFS";
  case ESRCH: return "ESRCH";
  case EFAULT: return "EFAULT";
  case ENOMEM: return "ENOMEM";
  case EOPNOTSUPP: return "EOPNOTSUPP";
  default: return "E?";
  }
}

/* Prints the outcome of one attempt: r is the call's result (negative: refused, errno set). */
static void report(const char *name, long r) {
  if (r >= 0) printf("%s ok\n", name);
  else printf("%s %s\n", name, errno_name(errno));
}

int main(void) {
  union bpf_attr battr;
  memset(&battr, 0, sizeof battr);
  battr.map_type = BPF_MAP_TYPE_ARRAY;
  battr.key_size = 4;
  battr.value_size = 4;
  battr.max_entries = 1;
  report("bpf", syscall(SYS_bpf, BPF_MAP_CREATE, &battr, sizeof battr));

  struct perf_event_attr pattr;
  memset(&pattr, 0, sizeof pattr);
  pattr.type = PERF_TYPE_SOFTWARE;
  pattr.size = sizeof pattr;
  pattr.config = PERF_COUNT_SW_CPU_CLOCK;
  report("perf_event_open", syscall(SYS_perf_event_open, &pattr, 0, -1, -1, 0));

  report("userfaultfd", syscall(SYS_userfaultfd, O_CLOEXEC));

  char params[120];
  memset(params, 0, sizeof params);
  report("io_uring_setup", syscall(SYS_io_uring_setup, 4, params));

  report("add_key", syscall(SYS_add_key, "user", "probe", "x", 1, -2 /* KEY_SPEC_PROCESS_KEYRING */));
  report("keyctl", syscall(SYS_keyctl, 0 /* KEYCTL_GET_KEYRING_ID */, -3 /* session keyring */, 1));

  report("unshare_newuser", unshare(CLONE_NEWUSER));

  report("ptrace_attach_1", ptrace(PTRACE_ATTACH, 1, 0, 0));

  char buf[16];
  struct iovec local = {buf, sizeof buf}, remote = {(void *)0x400000, sizeof buf};
  report("process_vm_readv_1", process_vm_readv(1, &local, 1, &remote, 1, 0));

  struct { unsigned int bytes; int type; unsigned char f[8]; } handle = {8, 1, {0}};
  report("open_by_handle_at", syscall(SYS_open_by_handle_at, AT_FDCWD, &handle, O_RDONLY));

  report("af_packet", socket(AF_PACKET, SOCK_RAW, 0));

  report("mknod_mem", mknod("/workspace/mem", S_IFCHR | 0600, makedev(1, 1)));
  return 0;
}
