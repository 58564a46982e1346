"""Read facts from /sys and /proc under an injectable root.

Every reader in gdrprobe goes through a :class:`SysRoot` so that a captured tree of
another machine can be read exactly like the live one, and so that the capture command
knows which paths the readers touch. Also how sysfs names a PCI function, the one spelling
of a bus id gdrprobe keeps, and the PCI ids that make a function a GPU.
"""

from __future__ import annotations

import errno
import os
import posixpath
import re

from gdrprobe.files import NotRegularFile, open_regular

# domain:bus:device.function in lower-case hex, as sysfs names /sys/bus/pci/devices/*.
PCI_BUS_ID = re.compile(r"[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]")
_ANY_BUS_ID = re.compile(r"([0-9a-fA-F]+):([0-9a-fA-F]{2}):([0-9a-fA-F]{2})\.([0-7])")

PCI_DEVICES_DIR = "/sys/bus/pci/devices"
NVIDIA_VENDOR_ID = 0x10DE
GPU_CLASSES = (0x0300, 0x0302)   # VGA-compatible and 3D controller (class, subclass)
AMD_VENDOR_ID = 0x1002
# AMD's GPUs also show as a display controller (0x0380) and, Instinct MI300, a processing
# accelerator (0x1200).
AMD_GPU_CLASSES = (*GPU_CLASSES, 0x0380, 0x1200)


def is_pci_bus_id(name: str) -> bool:
    """Whether a name is a PCI function as sysfs spells it (0000:3b:00.0)."""
    return PCI_BUS_ID.fullmatch(name) is not None


def pci_bus_id(text: str) -> str:
    """A bus id as sysfs spells it, from CUDA's or NVML's ("00000000:3B:00.0" ->
    "0000:3b:00.0"); text that is no bus id comes back lower-cased."""
    match = _ANY_BUS_ID.fullmatch(text)
    if not match:
        return text.lower()
    domain, bus, device, function = match.groups()
    return f"{int(domain, 16):04x}:{bus.lower()}:{device.lower()}.{function}"


LINK_LOOP = "more than 40 symbolic links on the way (ELOOP)"
MAX_LINK_HOPS = 40    # symbolic links one path may pass through: the kernel's MAXSYMLINKS
MAX_READ_BYTES = 1 << 20   # the most read() reads of one file
class SysRoot:
    """A file-system root ("/" for the live machine) that remembers what was read.

    Every file is opened without blocking and read only when it is a regular file (sysfs and
    procfs attributes are), at most ``MAX_READ_BYTES`` through :meth:`read`. Under another
    root (a replayed capture) every symbolic link is resolved inside the root, absolute ones
    too, at most ``MAX_LINK_HOPS`` in one path, as the kernel resolves them on the machine;
    a link loop is an unreadable path (ELOOP), never a recursion."""

    def __init__(self, root: str = "/"):
        self.root = os.path.abspath(root)
        self.touched: set[str] = set()
        # Paths that exist but this user may not read: "unknown, run as root", never "absent".
        self.denied: set[str] = set()
        # Paths that could not be read for another reason than their absence: why not
        # ("a FIFO", "more than 40 symbolic links (ELOOP)").
        self.refused: dict[str, str] = {}
        self._directories: dict[str, tuple[str, int] | OSError] = {}   # a replay's, resolved

    @property
    def live(self) -> bool:
        return self.root == "/"

    def host_path(self, path: str) -> str:
        """Map an absolute machine path ("/sys/...") to a path under the root."""
        return os.path.join(self.root, path.lstrip("/"))

    def _reached(self, path: str) -> str:
        """The host path the machine's kernel would reach for path: the live path as is (the
        kernel resolves it), else its links resolved inside the root."""
        return self.host_path(path if self.live else self.realpath(path))

    def open(self, path: str):
        """The one place a file under the root is opened (a test root denies access here):
        a regular file only, opened without blocking."""
        return os.fdopen(open_regular(self._reached(path)), "rb")

    def try_open_device(self, path: str) -> None:
        """Open a device node read-write and close it, as a library that uses it opens it
        (libibverbs' verbs_open_device): OSError where this process may not. A replayed
        capture holds an empty regular file where the machine had the node (capture.py),
        and never a device of this machine is opened for it: anything else there is
        refused (EINVAL)."""
        if self.live:
            os.close(os.open(path, os.O_RDWR | os.O_CLOEXEC))
            return
        os.close(open_regular(self._reached(path), os.O_RDWR))

    def read_bytes(self, path: str, limit: int = 4096) -> bytes | None:
        """Up to ``limit`` raw bytes of a file (PCI config space), or None when it is absent,
        unreadable or no regular file; a refused read is remembered in :attr:`denied`, a
        file of another kind or a link loop in :attr:`refused`."""
        self.touched.add(path)
        try:
            with self.open(path) as handle:
                return handle.read(limit)
        except PermissionError:
            self.denied.add(path)
            return None
        except NotRegularFile as error:
            self.refused[path] = error.kind
            return None
        except OSError as error:
            if error.errno == errno.ELOOP:
                self.refused[path] = LINK_LOOP
            return None

    def read(self, path: str) -> str | None:
        """The stripped text of a file, or None when it is absent or unreadable."""
        data = self.read_bytes(path, MAX_READ_BYTES)
        return None if data is None else data.decode("utf-8", "replace").strip()

    def is_denied(self, path: str) -> bool:
        """True when the file exists but this user may not read it."""
        return path in self.denied

    def why_refused(self, path: str) -> str | None:
        """Why a file that is there was not read, other than permission: None if it was."""
        return self.refused.get(path)

    def listdir(self, path: str) -> list[str]:
        """Sorted entries of a directory; empty when it is absent."""
        self.touched.add(path)
        try:
            return sorted(os.listdir(self._reached(path)))
        except OSError:
            return []

    def exists(self, path: str) -> bool:
        """Whether something is at path (a dangling link too), as lstat sees it."""
        self.touched.add(path)
        try:
            parent, name = posixpath.split(path)
            where = path if self.live else posixpath.join(self.realpath(parent), name)
        except OSError:
            return False
        return os.path.lexists(self.host_path(where))

    def readlink(self, path: str) -> str | None:
        self.touched.add(path)
        try:
            parent, name = posixpath.split(path)
            where = path if self.live else posixpath.join(self.realpath(parent), name)
            return os.readlink(self.host_path(where))
        except OSError:
            return None

    def resolve(self, path: str) -> str:
        """:meth:`realpath`, or the path as given where a link loop stops the lookup: every
        read through it then fails (ELOOP), as it would on the machine."""
        try:
            return self.realpath(path)
        except OSError:
            return path

    def realpath(self, path: str) -> str:
        """Resolve symbolic links as the machine's kernel would, staying inside the root: a
        ``..`` after a link goes up from where the link led, and a path through more than
        ``MAX_LINK_HOPS`` links raises OSError(ELOOP), as the kernel's lookup fails. Under a
        replayed capture (a tree that does not change) each directory is resolved once."""
        parent, name = posixpath.split(path)
        if self.live or not name:
            return self._walk(path, "/", 0, path)[0]
        if parent not in self._directories:
            try:
                self._directories[parent] = self._walk(parent, "/", 0, parent)
            except OSError as error:
                self._directories[parent] = error
        known = self._directories[parent]
        if isinstance(known, OSError):
            raise OSError(known.errno, known.strerror, path)
        return self._walk(name, *known, path)[0]

    def _walk(self, path: str, resolved: str, hops: int, asked: str) -> tuple[str, int]:
        """(path resolved from ``resolved``, the links passed so far): the kernel's lookup,
        one component at a time, a link's target before what follows it."""
        pending = [part for part in reversed(path.split("/")) if part]
        while pending:
            part = pending.pop()
            if part == ".":
                continue
            if part == "..":
                resolved = posixpath.dirname(resolved)
                continue
            candidate = posixpath.join(resolved, part)
            self.touched.add(candidate)
            try:
                target = os.readlink(self.host_path(candidate))
            except OSError:
                resolved = candidate     # not a link (or not there): kept as it is
                continue
            hops += 1
            if hops > MAX_LINK_HOPS:
                raise OSError(errno.ELOOP, LINK_LOOP, asked)
            if target.startswith("/"):
                resolved = "/"
            pending.extend(part for part in reversed(target.split("/")) if part)
        return resolved, hops
