"""gdrprobe: prove, in-process, whether GPUDirect RDMA is engaged.

Importing the package is cheap: pyverbs, CUDA and numpy are loaded only by the
layers that need them, when they are first used.
"""

from gdrprobe.errors import ExitCode, GdrprobeError

__version__ = "0.1.0"

__all__ = ["ExitCode", "GdrprobeError", "__version__", "list_devices"]


def list_devices(device: str | None = None):
    """Inventory of the RDMA devices (see :mod:`gdrprobe.devices`)."""
    from gdrprobe.devices import list_devices as _list_devices

    return _list_devices(device)
