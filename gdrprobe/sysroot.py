"""Read facts from /sys and /proc under an injectable root.

Every reader in gdrprobe goes through a :class:`SysRoot` so that a captured tree of
another machine can be read exactly like the live one, and so that the capture command
knows which paths the readers touch. Also how sysfs names a PCI function, the one spelling
of a bus id gdrprobe keeps, and the PCI ids that make a function a GPU.
"""

from __future__ import annotations

import os
import posixpath
import re

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


class SysRoot:
    """A file-system root ("/" for the live machine) that remembers what was read."""

    def __init__(self, root: str = "/"):
        self.root = os.path.abspath(root)
        self.touched: set[str] = set()
        # Paths that exist but this user may not read: "unknown, run as root", never "absent".
        self.denied: set[str] = set()

    def host_path(self, path: str) -> str:
        """Map an absolute machine path ("/sys/...") to a path under the root."""
        return os.path.join(self.root, path.lstrip("/"))

    def open(self, path: str):
        """The one place a file under the root is opened (a test root denies access here)."""
        return open(self.host_path(path), "rb")

    def read_bytes(self, path: str, limit: int = 4096) -> bytes | None:
        """Up to ``limit`` raw bytes of a file (PCI config space), or None when it is absent
        or unreadable; a refused read is remembered in :attr:`denied`."""
        self.touched.add(path)
        try:
            with self.open(path) as handle:
                return handle.read(limit)
        except PermissionError:
            self.denied.add(path)
            return None
        except OSError:
            return None

    def read(self, path: str) -> str | None:
        """The stripped text of a file, or None when it is absent or unreadable."""
        data = self.read_bytes(path, 1 << 20)
        return None if data is None else data.decode("utf-8", "replace").strip()

    def is_denied(self, path: str) -> bool:
        """True when the file exists but this user may not read it."""
        return path in self.denied

    def listdir(self, path: str) -> list[str]:
        """Sorted entries of a directory; empty when it is absent."""
        self.touched.add(path)
        try:
            return sorted(os.listdir(self.host_path(path)))
        except OSError:
            return []

    def exists(self, path: str) -> bool:
        self.touched.add(path)
        return os.path.lexists(self.host_path(path))

    def readlink(self, path: str) -> str | None:
        self.touched.add(path)
        try:
            return os.readlink(self.host_path(path))
        except OSError:
            return None

    def realpath(self, path: str) -> str:
        """Resolve symbolic links as the machine would, staying inside the root."""
        parts = [p for p in path.split("/") if p]
        resolved = "/"
        for depth, part in enumerate(parts):
            candidate = posixpath.join(resolved, part)
            target = self.readlink(candidate)
            if target is None:
                resolved = candidate
                continue
            joined = target if target.startswith("/") else posixpath.join(resolved, target)
            rest = "/".join(parts[depth + 1:])
            return self.realpath(posixpath.normpath(posixpath.join(joined, rest)))
        return resolved
