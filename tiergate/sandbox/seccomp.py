"""The system-call filter every sandboxed command runs under: bubblewrap loads it (compiled
BPF, ``--seccomp FD``) just before it starts the command, after its own setup.

Built with libseccomp (through ``pyseccomp``, ctypes over ``libseccomp.so.2``). Everything
is allowed but what a job has no use for and the kernel's attack surface is made of:
mounting and namespaces, keyrings, tracing, BPF, modules, kexec, raw I/O, swap, reboot and
the like, which fail with ``EPERM``. ``clone`` and ``unshare`` are refused only with a
namespace flag; ``clone3``, whose flags the filter cannot read, fails with ``ENOSYS`` so that
the C library falls back to ``clone``. ``personality`` is refused when it would turn off
address randomisation or make data executable (its query, ``0xffffffff``, is refused with
it). Other architectures' system calls (a 32-bit program on x86_64) kill the process.

``socket`` and ``socketpair`` are refused for every address family but the four a job
uses: ``AF_UNIX`` (1), ``AF_INET`` (2), ``AF_INET6`` (10) and ``AF_NETLINK`` (16, which
``getaddrinfo``, ``ip`` and the like need). An allow-list, so that the families known for
unprivileged kernel bugs (among them ``AF_VSOCK`` 40, ``AF_KEY`` 15, ``AF_PACKET`` 17,
``AF_RDS`` 21, ``AF_PPPOX`` 24, ``AF_LLC`` 26, ``AF_CAN`` 29, ``AF_TIPC`` 30,
``AF_BLUETOOTH`` 31, ``AF_ALG`` 38, ``AF_KCM`` 41, ``AF_SMC`` 43, ``AF_XDP`` 44, the amateur
radio, ATM and other rarely used ones) and any the kernel adds later are refused alike:
every family below ``AF_MAX`` (46) but those four is compared on the low 32 bits the kernel
reads, and a domain of 46 or more is refused as a whole 64-bit value (so one with its upper
bits set is refused too). ``IPPROTO_SMC`` (256, the protocol argument), which reaches SMC
through ``AF_INET`` since Linux 6.11, is refused with them. ``io_uring``, which can open
sockets itself, is refused outright.

Where the filter cannot be built, :func:`probe_seccomp` (called by the worker at start
through :func:`~tiergate.sandbox.limits.probe_limits`) and every sandbox refuse, unless the
operator set ``jobs.sandbox.allow_no_seccomp``.
"""

from __future__ import annotations

import errno
import functools
import os
import tempfile
from typing import Any

from tiergate.jobsettings import SandboxSettings
from tiergate.sandbox.errors import SeccompUnavailable

# Refused outright, with EPERM. Names the running architecture lacks are skipped.
DENIED = (
    # filesystems and namespaces
    "mount",
    "umount",
    "umount2",
    "pivot_root",
    "chroot",
    "setns",
    "fsopen",
    "fsconfig",
    "fsmount",
    "fspick",
    "move_mount",
    "open_tree",
    "mount_setattr",
    "open_by_handle_at",
    "name_to_handle_at",
    # keyrings
    "keyctl",
    "add_key",
    "request_key",
    # tracing and other processes' memory
    "ptrace",
    "process_vm_readv",
    "process_vm_writev",
    "kcmp",
    "perf_event_open",
    "bpf",
    "userfaultfd",
    "lookup_dcookie",
    "io_uring_setup",
    "io_uring_enter",
    "io_uring_register",
    "pidfd_getfd",  # another process's file descriptors
    "process_madvise",  # advice on another process's memory
    "fanotify_init",  # filesystem event watches, open to any user since Linux 5.13
    # the kernel and the machine
    "kexec_load",
    "kexec_file_load",
    "init_module",
    "finit_module",
    "delete_module",
    "create_module",
    "query_module",
    "get_kernel_syms",
    "reboot",
    "swapon",
    "swapoff",
    "acct",
    "quotactl",
    "quotactl_fd",
    "iopl",
    "ioperm",
    "syslog",
    "settimeofday",
    "clock_settime",
    "clock_adjtime",
    "adjtimex",
    "sethostname",
    "setdomainname",
    "vhangup",
    "uselib",
    "_sysctl",
    "nfsservctl",
)

_CLONE_NEWNS = 0x00020000
_CLONE_NEWCGROUP = 0x02000000
_CLONE_NEWUTS = 0x04000000
_CLONE_NEWIPC = 0x08000000
_CLONE_NEWUSER = 0x10000000
_CLONE_NEWPID = 0x20000000
_CLONE_NEWNET = 0x40000000
_CLONE_NEWTIME = 0x00000080  # unshare only: in clone's flags these bits are the exit signal
NAMESPACE_FLAGS = (
    _CLONE_NEWNS,
    _CLONE_NEWCGROUP,
    _CLONE_NEWUTS,
    _CLONE_NEWIPC,
    _CLONE_NEWUSER,
    _CLONE_NEWPID,
    _CLONE_NEWNET,
)
# personality(2) flags that weaken exploit mitigations.
_PERSONALITY_FLAGS = (
    0x0040000,  # ADDR_NO_RANDOMIZE
    0x0400000,  # READ_IMPLIES_EXEC
    0x0200000,  # ADDR_COMPAT_LAYOUT
    0x0100000,  # MMAP_PAGE_ZERO
)
# Address families socket(2) and socketpair(2) may open; every other one is refused.
_AF_UNIX, _AF_INET, _AF_INET6, _AF_NETLINK = 1, 2, 10, 16
SOCKET_FAMILIES = (_AF_UNIX, _AF_INET, _AF_INET6, _AF_NETLINK)
_AF_MAX = 46  # families 0 to 45 are compared one by one, 46 and up refused together
_IPPROTO_SMC = 256
_S_IFMT, _S_IFCHR, _S_IFBLK = 0o170000, 0o020000, 0o060000
_TIOCSTI, _TIOCLINUX = 0x5412, 0x541C


def unavailable(reason: str) -> SeccompUnavailable:
    """The error for a filter that cannot be built, with what to do about it."""
    return SeccompUnavailable(
        f"the sandbox's system-call filter cannot be built: {reason}. Install libseccomp2 "
        "and the pyseccomp package, or set jobs.sandbox.allow_no_seccomp=true to run jobs "
        "WITHOUT it",
        reason=reason,
    )


def _binding() -> Any:
    try:
        import pyseccomp  # type: ignore[import-untyped]
    except (ImportError, OSError, RuntimeError) as exc:
        raise unavailable(f"no libseccomp binding: {exc}") from exc
    return pyseccomp


@functools.cache
def compiled() -> bytes:
    """The filter as BPF for the running architecture; :class:`SeccompUnavailable` if it
    cannot be built."""
    sc = _binding()
    eperm = sc.ERRNO(errno.EPERM)
    try:
        flt = sc.SyscallFilter(sc.ALLOW)
        flt.set_attr(sc.Attr.ACT_BADARCH, sc.KILL_PROCESS)
        for name in DENIED:
            if sc.resolve_syscall(sc.Arch.NATIVE, name) >= 0:
                flt.add_rule(eperm, name)
        for flag in NAMESPACE_FLAGS:
            flt.add_rule(eperm, "clone", sc.Arg(0, sc.MASKED_EQ, flag, flag))
        for flag in (*NAMESPACE_FLAGS, _CLONE_NEWTIME):
            flt.add_rule(eperm, "unshare", sc.Arg(0, sc.MASKED_EQ, flag, flag))
        flt.add_rule(sc.ERRNO(errno.ENOSYS), "clone3")
        for flag in _PERSONALITY_FLAGS:
            flt.add_rule(eperm, "personality", sc.Arg(0, sc.MASKED_EQ, flag, flag))
        for kind in (_S_IFCHR, _S_IFBLK):
            flt.add_rule(eperm, "mknod", sc.Arg(1, sc.MASKED_EQ, _S_IFMT, kind))
            flt.add_rule(eperm, "mknodat", sc.Arg(2, sc.MASKED_EQ, _S_IFMT, kind))
        for call in ("socket", "socketpair"):
            for family in range(_AF_MAX):
                if family not in SOCKET_FAMILIES:
                    flt.add_rule(eperm, call, sc.Arg(0, sc.MASKED_EQ, 0xFFFFFFFF, family))
            flt.add_rule(eperm, call, sc.Arg(0, sc.GE, _AF_MAX))
            flt.add_rule(eperm, call, sc.Arg(2, sc.MASKED_EQ, 0xFFFFFFFF, _IPPROTO_SMC))
        for request in (_TIOCSTI, _TIOCLINUX):
            flt.add_rule(eperm, "ioctl", sc.Arg(1, sc.MASKED_EQ, 0xFFFFFFFF, request))
        with tempfile.TemporaryFile() as out:
            flt.export_bpf(out)
            out.seek(0)
            return out.read()
    except OSError as exc:
        raise unavailable(f"libseccomp failed: {exc}") from exc


def program(settings: SandboxSettings) -> bytes | None:
    """The compiled filter; None when it cannot be built and the operator allowed that,
    :class:`SeccompUnavailable` when not allowed."""
    try:
        return compiled()
    except SeccompUnavailable:
        if settings.allow_no_seccomp:
            return None
        raise


def as_fd(bpf: bytes) -> int:
    """A new close-on-exec file descriptor at offset 0 holding ``bpf``, for bubblewrap's
    ``--seccomp`` (pass it with ``pass_fds``; the caller closes it)."""
    fd = os.memfd_create("tiergate-seccomp", os.MFD_CLOEXEC)
    try:
        view = memoryview(bpf)
        while view:
            view = view[os.write(fd, view) :]
        os.lseek(fd, 0, os.SEEK_SET)
    except OSError:
        os.close(fd)
        raise
    return fd


def probe_seccomp(settings: SandboxSettings) -> str:
    """What the worker says at start about the filter; :class:`SeccompUnavailable` unless
    the filter builds or ``allow_no_seccomp`` is set."""
    try:
        program = compiled()
    except SeccompUnavailable as exc:
        if settings.allow_no_seccomp:
            return f"seccomp OFF (jobs.sandbox.allow_no_seccomp=true): {exc.reason}"
        raise
    return f"seccomp filter ({len(program) // 8} BPF instructions)"
