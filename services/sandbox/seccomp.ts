// The seccomp filter every sandbox runs under, passed to the engine with the container.
//
// Why our own: Docker's default profile (engine 20.10, Debian's) lets io_uring through, and the
// engine takes one profile per container, so it cannot be extended; runsc ignores a container's
// profile unless registered with --oci-seccomp (sandbox/host-setup.sh does). This profile allows
// by default and refuses, with EPERM, the calls an escape or a kernel exploit starts with and no
// tool needs: namespaces, keyrings, BPF, perf, userfaultfd, io_uring, tracing, handles, modules,
// mounts, clocks. The container also has no capabilities for commands (so most of these would
// fail anyway: this takes away the kernel code behind them). test/sandbox-attacks.test.ts runs a
// probe of these calls under runc and runsc.

const EPERM = 1;
const ENOSYS = 38;

/** Refused outright. */
const REFUSED = [
  // namespaces and containers
  "unshare",
  "setns",
  "mount",
  "umount",
  "umount2",
  "pivot_root",
  "chroot",
  "open_tree",
  "move_mount",
  "fsopen",
  "fsconfig",
  "fsmount",
  "fspick",
  "mount_setattr",
  // kernel keyrings
  "add_key",
  "request_key",
  "keyctl",
  // kernel attack surface reachable without capabilities
  "bpf",
  "perf_event_open",
  "userfaultfd",
  "io_uring_setup",
  "io_uring_enter",
  "io_uring_register",
  // other processes' memory, and file handles that bypass paths
  "ptrace",
  "process_vm_readv",
  "process_vm_writev",
  "kcmp",
  "pidfd_getfd",
  "open_by_handle_at",
  "name_to_handle_at",
  // modules, reboot, swap, accounting, quotas
  "init_module",
  "finit_module",
  "delete_module",
  "create_module",
  "kexec_load",
  "kexec_file_load",
  "reboot",
  "swapon",
  "swapoff",
  "acct",
  "quotactl",
  "quotactl_fd",
  // clocks and the kernel log
  "settimeofday",
  "clock_settime",
  "clock_adjtime",
  "adjtimex",
  "stime",
  "syslog",
  // obsolete or hardware-level
  "uselib",
  "ustat",
  "sysfs",
  "_sysctl",
  "personality",
  "lookup_dcookie",
  "nfsservctl",
  "vm86",
  "vm86old",
  "iopl",
  "ioperm",
  "get_kernel_syms",
  "query_module",
  "fanotify_init",
  "move_pages",
  "migrate_pages",
  "mbind",
  "set_mempolicy",
];

/** File types mknod may not make: character and block devices (FIFOs and plain files stay). */
const S_IFMT = 0o170000;
const DEVICE_TYPES = [0o020000, 0o060000];

/** clone flags that make a namespace: a clone asking for any of them is refused. */
const NAMESPACE_FLAGS = [
  0x00020000, 0x02000000, 0x04000000, 0x08000000, 0x10000000, 0x20000000, 0x40000000, 0x00000080,
];

interface Rule {
  names: string[];
  action: "SCMP_ACT_ERRNO";
  errnoRet: number;
  args?: { index: number; value: number; valueTwo: number; op: "SCMP_CMP_MASKED_EQ" }[];
}

export function sandboxSeccompProfile(): string {
  const syscalls: Rule[] = [
    { names: REFUSED, action: "SCMP_ACT_ERRNO", errnoRet: EPERM },
    // One rule per flag: rules of one call are alternatives, the args of one rule all hold.
    ...NAMESPACE_FLAGS.map(
      (flag): Rule => ({
        names: ["clone"],
        action: "SCMP_ACT_ERRNO",
        errnoRet: EPERM,
        args: [{ index: 0, value: flag, valueTwo: flag, op: "SCMP_CMP_MASKED_EQ" }],
      }),
    ),
    // Device nodes (gVisor would make one in its own tmpfs; runc refuses it for want of CAP_MKNOD).
    ...DEVICE_TYPES.flatMap((type): Rule[] => [
      {
        names: ["mknod"],
        action: "SCMP_ACT_ERRNO",
        errnoRet: EPERM,
        args: [{ index: 1, value: S_IFMT, valueTwo: type, op: "SCMP_CMP_MASKED_EQ" }],
      },
      {
        names: ["mknodat"],
        action: "SCMP_ACT_ERRNO",
        errnoRet: EPERM,
        args: [{ index: 2, value: S_IFMT, valueTwo: type, op: "SCMP_CMP_MASKED_EQ" }],
      },
    ]),
    // clone3 passes its flags in memory, out of a filter's reach: ENOSYS makes libc use clone.
    { names: ["clone3"], action: "SCMP_ACT_ERRNO", errnoRet: ENOSYS },
  ];
  return JSON.stringify({
    defaultAction: "SCMP_ACT_ALLOW",
    architectures: ["SCMP_ARCH_X86_64", "SCMP_ARCH_X86", "SCMP_ARCH_X32"],
    syscalls,
  });
}
