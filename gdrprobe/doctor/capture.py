"""Copy exactly what the doctor reads into a directory that ``--root`` can replay.

The doctor runs once against the source root with a recording :class:`SysRoot`; every
path it touched is then copied: symbolic links stay links (sysfs topology lives in
them), directories stay directories, and files are copied by reading them, because
sysfs reports 4096 bytes for attributes that hold a few. The environment (NCCL, RCCL, HSA, CUDA,
MLX5, UCX and KUBERNETES variables, HOME, and the variables that say where the job's libnccl
is: LD_LIBRARY_PATH, LD_PRELOAD, VIRTUAL_ENV, CONDA_PREFIX; NCCL's configuration files and
its topology file, with the links on the way to it, are among the files copied), the CUDA
driver's facts, NVML's facts, NCCL's DMA-BUF probe per NIC and what finding the job's
libnccl took besides files (--nccl, this interpreter's site-packages and executable, versions
and ELF dynamic sections read from libraries' bytes, which may lie past the first MiB a copy
keeps) and, on an AMD node, RCCL's kallsyms answer and HSA's DMA-BUF facts go to CAPTURE_DIR.

A capture is written into a new directory beside DEST and renamed into place, so it is never
merged with what DEST held: a reused bug-report directory would otherwise replay as a machine
that does not exist. DEST must be new or empty, or (``replace``) an earlier capture, which is
swapped for the new one in one step (renameat2 RENAME_EXCHANGE), so that a capture killed at
any point leaves the old capture or the new one at DEST. Where the kernel or the file system
cannot exchange, the old capture is renamed aside first, and the next capture into DEST puts
it back if the run was killed between the two renames. Every run holds a lock (flock) on the
hidden directories it writes; the next capture into DEST removes those no live run holds.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import json
import os
import posixpath
import re
import secrets
import shutil
from collections.abc import Mapping

from gdrprobe.doctor.facts.context import (ENVIRON_FILE, GIN_FACTS_FILE, NCCL_FACTS_FILE, NIC_FACTS_FILE,
                                           NVML_FACTS_FILE, DoctorContext)
from gdrprobe.doctor.runner import run_checks
from gdrprobe.errors import UsageError
from gdrprobe.files import NotRegularFile, read_regular
from gdrprobe.nccl import params
from gdrprobe.sysroot import MAX_LINK_HOPS, MAX_READ_BYTES, SysRoot

# NVSHMEM_ and OFI_NCCL_: GIN's and IBGDA's settings (gdrprobe.nccl.gin, gdrprobe.nccl.ibgda).
CAPTURED_ENV_PREFIXES = params.PREFIXES + ("HSA_", "CUDA_", "MLX5_", "UCX_", "KUBERNETES_", "NVSHMEM_",
                                           "OFI_NCCL_")
# HOME: where NCCL looks for ~/.nccl.conf; the rest: where the job's libnccl is found.
CAPTURED_ENV_NAMES = ("HOME", "LD_LIBRARY_PATH", "LD_PRELOAD", "VIRTUAL_ENV", "CONDA_PREFIX")
# renameat2(2): RENAME_EXCHANGE (include/uapi/linux/fs.h), Linux 3.15 and glibc 2.28; a
# kernel without the call says ENOSYS, a file system that cannot exchange EINVAL.
RENAME_EXCHANGE = 2
AT_FDCWD = -100
NO_EXCHANGE = (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP)
STAGING_TAG = 8              # hexadecimal digits naming a staging directory: .DEST.<tag>
OLD_SUFFIX = ".old"          # the earlier capture, renamed aside where there is no exchange
ROOT_FIX = ("pass a directory written by 'gdrprobe capture DEST', or the root of a machine's "
            "file system with its sys/ and proc/ (the default, /, is this machine)")


def captured_environ(environ: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in sorted(environ.items())
            if k.startswith(CAPTURED_ENV_PREFIXES) or k in CAPTURED_ENV_NAMES}


class _Copier:
    def __init__(self, source: SysRoot, dest: str):
        self.source = source
        self.dest = os.path.abspath(dest)

    def dest_path(self, path: str) -> str:
        return os.path.join(self.dest, path.lstrip("/"))

    def copy(self, path: str, hops: int = 0) -> None:
        """Recreate ``path`` and every link and directory on the way to it."""
        parts = [p for p in path.split("/") if p]
        current = "/"
        for depth, part in enumerate(parts):
            current = posixpath.join(current, part)
            source = self.source.host_path(current)
            if not os.path.lexists(source):
                return
            if os.path.islink(source):
                target = os.readlink(source)
                self._link(current, target)
                if hops < MAX_LINK_HOPS:
                    base = target if target.startswith("/") else posixpath.join(
                        posixpath.dirname(current), target)
                    rest = "/".join(parts[depth + 1:])
                    self.copy(posixpath.normpath(posixpath.join(base, rest)), hops + 1)
                return
            if os.path.isdir(source):
                os.makedirs(self.dest_path(current), exist_ok=True)
            elif depth == len(parts) - 1:
                self._file(current, source)

    def _special(self, path: str) -> None:
        """A device node, FIFO or socket becomes an empty file: its presence is the fact
        (/dev/infiniband/uverbs0); reading it could block or change something."""
        dest = self.dest_path(path)
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        open(dest, "wb").close()

    def copy_listing(self, path: str) -> None:
        """Keep a listed directory's links and subdirectories so listing it gives the same names.

        Plain files in it are not read: the doctor did not read them, and some sysfs files
        have side effects or block.
        """
        source = self.source.host_path(path)
        if os.path.islink(source) or not os.path.isdir(source):
            return
        for name in os.listdir(source):
            entry = os.path.join(source, name)
            if os.path.islink(entry):
                self._link(posixpath.join(path, name), os.readlink(entry))
            elif os.path.isdir(entry):
                os.makedirs(self.dest_path(posixpath.join(path, name)), exist_ok=True)
            elif not os.path.isfile(entry):
                self._special(posixpath.join(path, name))

    def _link(self, path: str, target: str) -> None:
        dest = self.dest_path(path)
        if not os.path.lexists(dest):
            os.makedirs(os.path.dirname(dest), exist_ok=True)
            os.symlink(target, dest)

    def _file(self, path: str, source: str) -> None:
        try:
            data = read_regular(source, MAX_READ_BYTES)
        except NotRegularFile:
            self._special(path)
            return
        except OSError:
            return
        dest = self.dest_path(path)
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        with open(dest, "wb") as handle:
            handle.write(data)


def _write_json(path: str, data) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as handle:
        json.dump(data, handle, indent=2, sort_keys=True)


def is_capture(path: str) -> bool:
    """Whether a directory holds a capture: the environment file every capture writes."""
    return os.path.isfile(os.path.join(path, ENVIRON_FILE.lstrip("/")))


def is_machine_root(path: str) -> bool:
    """Whether a directory is a machine's root: its sysfs and procfs mount points."""
    return all(os.path.isdir(os.path.join(path, name)) for name in ("sys", "proc"))


def check_root(root: str) -> None:
    """Refuse a --root the doctor could only misread: a directory that is neither a capture
    nor a machine root would be diagnosed as a machine with nothing mounted."""
    if not os.path.isdir(root):
        what = "is not a directory" if os.path.exists(root) else "does not exist"
        raise UsageError(f"--root {root} {what}", ROOT_FIX)
    if not (is_capture(root) or is_machine_root(root)):
        raise UsageError(f"--root {root} is neither a capture (no {ENVIRON_FILE.lstrip('/')}) "
                         "nor a machine's root (no sys/ and proc/)", ROOT_FIX)


def check_destination(dest: str, replace: bool) -> None:
    """DEST must be new or empty, or an earlier capture that replace=True allows replacing;
    anything else is refused before the doctor runs."""
    if not os.path.lexists(dest):
        return
    if os.path.islink(dest) or not os.path.isdir(dest):
        raise UsageError(f"{dest} exists and is not a directory",
                         "pass a new or empty directory")
    if not os.listdir(dest):
        return
    if not replace:
        raise UsageError(f"{dest} is not empty: a capture is never merged with other files "
                         "(they would replay as part of a machine that does not exist)",
                         "pass a new or empty directory, or --replace to replace the "
                         "earlier capture in it")
    if not is_capture(dest):
        raise UsageError(f"{dest} holds files that are not a gdrprobe capture "
                         f"(no {ENVIRON_FILE.lstrip('/')}); --replace replaces only a capture",
                         "pass a new or empty directory")


def capture(dest_dir: str, root: str = "/", environ: Mapping[str, str] | None = None,
            replace: bool = False, nccl: str | None = None) -> list[str]:
    """Capture what the doctor reads under ``root`` into ``dest_dir``; returns the paths copied.

    dest_dir must be new or empty; with ``replace``, an earlier capture there is replaced
    (only once the new one is complete). Nothing is ever merged."""
    check_root(root)
    dest_dir = os.path.abspath(dest_dir)
    recover(dest_dir)
    check_destination(dest_dir, replace)
    staging, lock = _staging_beside(dest_dir), None
    try:
        lock = _locked(staging, fcntl.LOCK_EX)
        copied = _capture_into(staging, root, environ, nccl)
        _move_into_place(staging, dest_dir)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    finally:
        _unlock(lock)
    return copied


def _staging_beside(dest: str) -> str:
    """A new directory beside dest to write the capture into (dest's parent is created)."""
    parent = os.path.dirname(dest)
    staging = os.path.join(parent, f".{os.path.basename(dest)}.{secrets.token_hex(STAGING_TAG // 2)}")
    try:
        os.makedirs(parent, exist_ok=True)
        os.mkdir(staging, 0o700)
    except OSError as error:
        raise UsageError(f"cannot write a capture into {dest}: {error.strerror or error} ({parent})",
                         "pass a DEST in a directory this user may write") from None
    return staging


def _locked(path: str, how: int) -> int | None:
    """A descriptor of the directory at path (never through a link) that holds its flock
    for as long as this process lives; None where the file system has no locks (then no
    run removes what another left). Raises BlockingIOError when LOCK_NB finds it held."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    try:
        fcntl.flock(fd, how)
    except OSError as error:
        os.close(fd)
        if error.errno in (errno.ENOLCK, errno.ENOTSUP, errno.EOPNOTSUPP):
            return None
        raise
    return fd


def _unlock(fd: int | None) -> None:
    if fd is not None:
        os.close(fd)


def _vacant(dest: str) -> bool:
    """Nothing at dest, or an empty directory (which a rename replaces)."""
    return not os.path.lexists(dest) or (os.path.isdir(dest) and not os.path.islink(dest)
                                         and not os.listdir(dest))


def _move_into_place(staging: str, dest: str) -> None:
    """Put the finished capture at dest: a rename onto a new or empty dest; an exchange
    with an earlier capture, removed after; where there is no exchange, the earlier
    capture renamed aside (locked, so that no other run takes it for a leftover), put
    back if the second rename fails, removed only after it."""
    if _vacant(dest):
        os.replace(staging, dest)
        return
    if _exchange(staging, dest):
        shutil.rmtree(staging, ignore_errors=True)    # the earlier capture, now there
        return
    old = staging + OLD_SUFFIX
    lock = _locked(dest, fcntl.LOCK_EX)
    try:
        os.rename(dest, old)
        try:
            os.rename(staging, dest)
        except BaseException:
            os.rename(old, dest)
            raise
        shutil.rmtree(old, ignore_errors=True)
    finally:
        _unlock(lock)


def _exchange(first: str, second: str) -> bool:
    """Swap two paths in one step; False where the kernel, the C library or the file system
    cannot (then nothing was changed)."""
    renameat2 = getattr(ctypes.CDLL(None, use_errno=True), "renameat2", None)
    if renameat2 is None:
        return False
    if renameat2(AT_FDCWD, os.fsencode(first), AT_FDCWD, os.fsencode(second), RENAME_EXCHANGE) == 0:
        return True
    code = ctypes.get_errno()
    if code in NO_EXCHANGE:
        return False
    raise OSError(code, os.strerror(code), first, None, second)


def recover(dest: str) -> None:
    """What killed captures left beside dest, that no live capture holds: an earlier
    capture renamed aside (no exchange) goes back to dest when dest is gone; every other
    hidden staging directory is removed. Only directories of this user, never a link."""
    parent, name = os.path.split(dest)
    pattern = re.compile(rf"\.{re.escape(name)}\.[0-9a-f]{{{STAGING_TAG}}}(?:{re.escape(OLD_SUFFIX)})?")
    try:
        leftovers = sorted(entry for entry in os.listdir(parent or ".") if pattern.fullmatch(entry))
    except OSError:
        return                                         # no parent yet: nothing left there
    for entry in leftovers:
        _recover_one(os.path.join(parent, entry), dest)


def _recover_one(path: str, dest: str) -> None:
    try:
        if os.lstat(path).st_uid != os.geteuid():
            return
        lock = _locked(path, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return                    # a link, not a directory, gone, or held by a live capture
    if lock is None:
        return                    # no locks here: it may be a live capture's
    try:
        if path.endswith(OLD_SUFFIX) and _vacant(dest):
            os.replace(path, dest)
        else:
            shutil.rmtree(path, ignore_errors=True)
    finally:
        _unlock(lock)


def _capture_into(dest_dir: str, root: str, environ: Mapping[str, str] | None,
                  nccl: str | None = None) -> list[str]:
    source = SysRoot(root)
    ctx = DoctorContext(source, environ, nccl)
    run_checks(ctx)
    copier = _Copier(source, dest_dir)
    touched = sorted(source.touched)
    for path in touched:
        copier.copy(path)
        copier.copy_listing(path)
    # The process environment only: NCCL's configuration files are copied like every file
    # the doctor read, so a replay merges them again and still says where each value came from.
    _write_json(copier.dest_path(ENVIRON_FILE), captured_environ(ctx.process_environ))
    _write_json(copier.dest_path(ctx.gpu_collector.FACTS_FILE), ctx.gpu_facts)
    _write_json(copier.dest_path(NVML_FACTS_FILE), ctx.nvml_facts)
    _write_json(copier.dest_path(NIC_FACTS_FILE), ctx.nic_facts)
    _write_json(copier.dest_path(NCCL_FACTS_FILE), ctx.nccl_search)
    if ctx.gin_facts:
        _write_json(copier.dest_path(GIN_FACTS_FILE), ctx.gin_facts)
    return [p for p in touched if os.path.lexists(copier.dest_path(p))]
