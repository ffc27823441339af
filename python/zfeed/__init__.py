"""zfeed: feed Zarr weather and climate data to model training at the speed of the hardware.

The Zarr engine is C++ (``zfeed._core``); this module gives it a NumPy-shaped face::

    import zfeed
    arr = zfeed.create("era5.zarr/t2m", shape=(744, 33, 49), chunks=(1, 33, 49),
                       dtype="float32", compressor="zstd:3",
                       dimension_names=["time", "latitude", "longitude"])
    arr[0] = field
    zfeed.open("era5.zarr")["t2m"][::24, :, :].mean()
"""

import os as _os
import sys as _sys


def _load_core():
    """Imports the C++ module. Where ecCodes' PyPI wheels are already loaded (cfgrib, eccodes: as
    xarray does when it lists its engines), they bring their own copies of system libraries
    (OpenLDAP) that the module's libnetcdf -> libcurl also loads; the two copies then mix and the
    process crashes at exit. Binding the module's dependencies to themselves (RTLD_DEEPBIND)
    avoids it; only then, since DEEPBIND would bypass an LD_PRELOADed allocator."""
    if not any(name in _sys.modules for name in ("eccodes", "gribapi", "eccodeslib", "eckitlib", "cfgrib")):
        from . import _core
        return _core
    flags = _sys.getdlopenflags()
    _sys.setdlopenflags(flags | getattr(_os, "RTLD_DEEPBIND", 0))
    try:
        from . import _core
    finally:
        _sys.setdlopenflags(flags)
    return _core


def _load_libstdcxx_first():
    """Loads the system libstdc++ into the global scope before the module. The module links
    nvCOMP, whose PyPI library exports a static copy of parts of libstdc++ (string streams,
    locale); where the module's loading relocated libstdc++ with that copy in reach, libstdc++'s
    own calls went to it, and a later `import torch` died in free() ("invalid pointer", seen on
    an H200 image). Loaded first and globally, libstdc++ binds to itself, as when torch is
    imported first."""
    if not _sys.platform.startswith("linux"):
        return
    import ctypes
    try:
        ctypes.CDLL("libstdc++.so.6", mode=_os.RTLD_GLOBAL)
    except OSError:  # another C++ runtime (musl, clang's): nothing to order
        pass


_load_libstdcxx_first()
_load_core()
from ._core import NodeNotFoundError, UnsupportedError, ZarrError  # noqa: E402
from ._core import build_info, cuda_status, gds_status  # noqa: E402
from .array import Array, Group, create, create_group, open, open_array, open_group, memory_store, stage
from .loader import Loader, node_layout

__all__ = [
    "Array",
    "Group",
    "Loader",
    "NodeNotFoundError",
    "UnsupportedError",
    "ZarrError",
    "build_info",
    "create",
    "cuda_status",
    "create_group",
    "gds_status",
    "memory_store",
    "node_layout",
    "open",
    "open_array",
    "open_group",
    "stage",
]
__version__ = build_info()["version"]  # pyproject.toml's, compiled into the library


def __getattr__(name: str):
    """zfeed.torch (to_torch, ZarrIterableDataset) imports torch, so `import zfeed` leaves it out;
    it is imported on first use, as `zfeed.torch.to_torch(batch)` after a plain `import zfeed`."""
    if name == "torch":
        import importlib

        return importlib.import_module(".torch", __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
