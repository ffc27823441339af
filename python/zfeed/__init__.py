"""zfeed: feed Zarr weather and climate data to model training at the speed of the hardware.

The Zarr engine is C++ (``zfeed._core``); this module gives it a NumPy-shaped face::

    import zfeed
    arr = zfeed.create("era5.zarr/t2m", shape=(744, 33, 49), chunks=(1, 33, 49),
                       dtype="float32", compressor="zstd:3",
                       dimension_names=["time", "latitude", "longitude"])
    arr[0] = field
    zfeed.open("era5.zarr")["t2m"][::24, :, :].mean()
"""

from ._core import NodeNotFoundError, UnsupportedError, ZarrError
from .array import Array, Group, create, create_group, open, open_array, open_group, memory_store
from .loader import Loader

__all__ = [
    "Array",
    "Group",
    "Loader",
    "NodeNotFoundError",
    "UnsupportedError",
    "ZarrError",
    "create",
    "create_group",
    "memory_store",
    "open",
    "open_array",
    "open_group",
]
__version__ = "0.1.0"
