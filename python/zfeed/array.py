"""Arrays and groups: NumPy indexing over the C++ engine."""

from __future__ import annotations

import builtins
import json
import math
import os
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np

from . import _core, _selection
from ._core import ZarrError

try:  # bfloat16 has no NumPy dtype of its own; ml_dtypes (a tensorstore and jax dependency) has one.
    import ml_dtypes

    _BFLOAT16 = np.dtype(ml_dtypes.bfloat16)
except ImportError:  # pragma: no cover - ml_dtypes is a dependency of the package
    _BFLOAT16 = None

_NUMPY_DTYPES = {
    "bool": np.dtype(bool),
    "int8": np.dtype("int8"),
    "int16": np.dtype("int16"),
    "int32": np.dtype("int32"),
    "int64": np.dtype("int64"),
    "uint8": np.dtype("uint8"),
    "uint16": np.dtype("uint16"),
    "uint32": np.dtype("uint32"),
    "uint64": np.dtype("uint64"),
    "float16": np.dtype("float16"),
    "float32": np.dtype("float32"),
    "float64": np.dtype("float64"),
    "complex64": np.dtype("complex64"),
    "complex128": np.dtype("complex128"),
}
if _BFLOAT16 is not None:
    _NUMPY_DTYPES["bfloat16"] = _BFLOAT16


def _numpy_dtype(name: str) -> np.dtype:
    try:
        return _NUMPY_DTYPES[name]
    except KeyError:
        raise ZarrError(f"data type {name} has no NumPy equivalent here") from None


def _zarr_dtype_name(dtype: Any) -> str:
    if isinstance(dtype, str) and dtype in _NUMPY_DTYPES:
        return dtype
    dt = np.dtype(dtype)
    for name, candidate in _NUMPY_DTYPES.items():
        if candidate == dt:
            return name
    raise ZarrError(f"unsupported data type {dtype!r}")


def memory_store():
    """A fresh in-memory store (for tests and scratch work)."""
    return _core.memory_store()


def _store(path_or_store, create: bool = False):
    if isinstance(path_or_store, _core.Store):
        return path_or_store
    return _core.open_store(os.fspath(path_or_store), create)


def _split_path(path_or_store, path: str | None):
    """'store.zarr/group/array' paths are fine when the store root is the first existing Zarr node;
    an explicit `path` inside the store is the clearer form."""
    return _store(path_or_store), (path or "")


# ---------------------------------------------------------------------------------------------
# Indexing


class _Index:
    """A basic NumPy index resolved against a shape: per-dimension start, stop, step (positive),
    which dimensions are dropped (integers) and which are reversed (negative steps)."""

    def __init__(self, key, shape: Sequence[int]):
        key = _selection.expand(key, len(shape))
        self.starts, self.stops, self.steps = [], [], []
        self.dropped, self.reversed = [], []
        for dim, (k, n) in enumerate(zip(key, shape)):
            if isinstance(k, (bool, np.bool_)):
                raise IndexError("boolean indices are not supported")
            if isinstance(k, (int, np.integer)):
                i = int(k)
                if i < -n or i >= n:
                    raise IndexError(f"index {i} is out of bounds for axis {dim} with size {n}")
                i %= n
                self.starts.append(i)
                self.stops.append(i + 1)
                self.steps.append(1)
                self.dropped.append(dim)
            elif isinstance(k, slice):
                start, stop, step = k.indices(n)
                count = len(range(start, stop, step))
                if step > 0:
                    self.starts.append(start)
                    self.stops.append(start + (count - 1) * step + 1 if count else start)
                    self.steps.append(step)
                else:
                    if count:
                        first = start + (count - 1) * step
                        self.starts.append(first)
                        self.stops.append(start + 1)
                    else:
                        self.starts.append(0)
                        self.stops.append(0)
                    self.steps.append(-step)
                    self.reversed.append(dim)
            elif _selection.is_array_index(k):
                raise IndexError(
                    f"index arrays (axis {dim}) select through arr[...], arr.oindex[...] and arr.vindex[...]; "
                    "read(out=) and read_many take integers, slices (with steps) and '...'"
                )
            else:
                raise IndexError(
                    f"unsupported index {k!r} for axis {dim}: zfeed takes integers, slices (with steps), '...' "
                    "and integer or boolean arrays"
                )
        self.counts = [len(range(a, b, s)) for a, b, s in zip(self.starts, self.stops, self.steps)]
        self.result_shape = tuple(c for d, c in enumerate(self.counts) if d not in self.dropped)


class Array:
    """A Zarr array (v3 or v2). ``arr[...]`` reads into NumPy, ``arr[...] = values`` writes (unless
    opened with ``mode="r"``: ``read_only``)."""

    def __init__(self, core: _core.Array, read_only: bool = False):
        self._core = core
        self._dtype = _numpy_dtype(core.data_type)
        self._read_only = bool(read_only)

    # -- description ----------------------------------------------------------------------------
    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self._core.shape)

    @property
    def ndim(self) -> int:
        return len(self._core.shape)

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.size * self._dtype.itemsize

    @property
    def dtype(self) -> np.dtype:
        return self._dtype

    @property
    def chunks(self) -> tuple[int, ...]:
        """The shape of the unit of reading: the inner chunk where the array is sharded."""
        return tuple(self._core.read_chunk_shape)

    @property
    def shards(self) -> tuple[int, ...] | None:
        return tuple(self._core.chunk_shape) if self._core.is_sharded else None

    @property
    def zarr_format(self) -> int:
        return self._core.zarr_format

    @property
    def path(self) -> str:
        return self._core.path

    @property
    def name(self) -> str:
        return "/" + self._core.path

    @property
    def dimension_names(self) -> tuple[str | None, ...] | None:
        names = self._core.dimension_names()
        return tuple(names) if names is not None else None

    @property
    def fill_value(self):
        value = json.loads(self._core.fill_value_json())
        if value is None:
            return None
        if isinstance(value, list):
            return complex(_json_float(value[0]), _json_float(value[1]))
        if isinstance(value, str):
            return self._dtype.type(_json_float(value))
        return self._dtype.type(value)

    @property
    def codecs(self) -> list[dict]:
        return json.loads(self._core.codecs_json())

    @property
    def metadata(self) -> dict:
        return json.loads(self._core.metadata_json())

    @property
    def read_only(self) -> bool:
        """Whether the array was opened with ``mode="r"``: writes and attribute changes raise."""
        return self._read_only

    def __reduce__(self):
        return _reduce_node(self, "array")

    def _check_writable(self) -> None:
        if self._read_only:
            raise ZarrError(f"array {_location(self._core)} is read-only (opened with mode='r'); open it with "
                            "mode='r+' to write")

    @property
    def attrs(self) -> "Attributes":
        """The attributes, a dict whose changes are written at once; ``arr.attrs = {...}`` replaces
        them all."""
        return Attributes(self._core, read_only=self._read_only, name=f"array {_location(self._core)}")

    @attrs.setter
    def attrs(self, value) -> None:
        _set_attributes(self, value)

    def info(self) -> dict:
        """What the array holds; ``stored_bytes`` and ``objects_present`` are None where the store
        cannot list its keys (plain HTTP)."""
        stored, present, total = self._core.storage_info()
        return {
            "shape": self.shape,
            "dtype": str(self._dtype),
            "chunks": self.chunks,
            "shards": self.shards,
            "codecs": self._core.codecs_description,
            "stored_bytes": stored,
            "decoded_bytes": self.nbytes,
            "compression_ratio": (self.nbytes / stored) if stored else None,
            "objects_present": present,
            "objects_total": total,
        }

    def __repr__(self) -> str:
        shards = f", shards={self.shards}" if self.shards else ""
        dims = f", dims={self.dimension_names}" if self.dimension_names else ""
        return (
            f"<zfeed.Array {self.name} shape={self.shape} dtype={self._dtype}{dims} chunks={self.chunks}{shards} "
            f"codecs=[{self._core.inner_codecs_description}] zarr_format={self.zarr_format}>"
        )

    def __len__(self) -> int:
        if not self.shape:
            raise TypeError("len() of a 0-d array")
        return self.shape[0]

    # -- data -----------------------------------------------------------------------------------
    def __getitem__(self, key) -> np.ndarray:
        """NumPy indexing: integers, slices (any step), '...', and integer or boolean arrays with
        NumPy's meaning (one array selects along its axis, arrays on every axis select points, a
        boolean mask of the array's shape selects its True elements). Arrays read chunk by chunk:
        only chunks holding a selected element are read, each once."""
        expanded = _selection.expand(key, self.ndim)
        if any(_selection.is_array_index(k) for k in expanded):
            if _selection.numpy_kind(expanded, self.shape) == "orthogonal":
                selection = _selection.Orthogonal(expanded, self.shape, self.chunks, flat_only=False)
                return _numpy_layout(selection, _selection.read_orthogonal(self, selection))
            return _selection.read_points(self, _selection.Points(expanded, self.shape, self.chunks))
        index = _Index(expanded, self.shape)
        out = np.empty(index.counts, dtype=self._dtype)
        if out.size:
            self._core.read(index.starts, index.stops, index.steps, _raw(out))
        if index.reversed:
            out = np.ascontiguousarray(np.flip(out, axis=index.reversed))
        result = out.reshape(index.result_shape)
        if result.ndim == 0:
            return result[()]
        return result

    def read_many(self, keys, outs=None) -> list[np.ndarray]:
        """Reads several selections in one parallel pass (faster than one after another when each
        is small, such as single chunks): ``arr.read_many([np.s_[3], np.s_[17, :10]])``. With
        ``outs``, each result goes into the given array (see ``read``)."""
        indexes = [_Index(key, self.shape) for key in keys]
        if outs is None:
            buffers = [np.empty(index.counts, dtype=self._dtype) for index in indexes]
        else:
            if len(outs) != len(indexes):
                raise ValueError(f"read_many: {len(keys)} selections but {len(outs)} outputs")
            buffers = [self._check_out(index, out) for index, out in zip(indexes, outs)]
        self._core.read_many([[i.starts, i.stops, i.steps] for i in indexes], [_raw(b) for b in buffers])
        if outs is not None:
            return list(outs)
        results = []
        for index, out in zip(indexes, buffers):
            if index.reversed:
                out = np.ascontiguousarray(np.flip(out, axis=index.reversed))
            out = out.reshape(index.result_shape)
            results.append(out[()] if out.ndim == 0 else out)
        return results

    def read(self, key=Ellipsis, out: np.ndarray | None = None) -> np.ndarray:
        """``arr[key]``, or with ``out`` the values go straight into that array (C-contiguous, of
        this array's dtype and the selection's shape) with no allocation: the way to reuse batch
        buffers, since first touching fresh memory costs as much as decoding on some machines."""
        if out is None:
            return self[key]
        expanded = _selection.expand(key, self.ndim)
        if any(_selection.is_array_index(k) for k in expanded):
            # One index array along its axis: the values go to their places in `out` as they would
            # in a fresh result.
            if _selection.numpy_kind(expanded, self.shape) != "orthogonal":
                raise IndexError("read(out=) takes one index array (a selection along one axis); read points without out")
            selection = _selection.Orthogonal(expanded, self.shape, self.chunks)
            if _moved_axes(selection):
                raise IndexError("read(out=): integers apart from the index array move its axis first (NumPy's rule); "
                                 "read without out")
            _selection.read_orthogonal(self, selection, out=self._check_out(selection, out))
            return out
        index = _Index(expanded, self.shape)
        buffer = self._check_out(index, out)
        if buffer.size:
            self._core.read(index.starts, index.stops, index.steps, _raw(buffer))
        return out

    def _check_out(self, index: "_Index | _selection.Orthogonal", out: np.ndarray) -> np.ndarray:
        if not isinstance(out, np.ndarray) or out.dtype != self._dtype:
            raise TypeError(f"out must be a numpy array of dtype {self._dtype}")
        if tuple(out.shape) not in (tuple(index.result_shape), tuple(index.counts)):
            raise ValueError(f"out has shape {out.shape}, the selection has shape {index.result_shape}")
        if not out.flags.c_contiguous or not out.flags.writeable:
            raise ValueError("out must be C-contiguous and writeable")
        if index.reversed:
            raise ValueError("out= does not take negative steps; read without out and flip")
        return out.reshape(index.counts)

    def __setitem__(self, key, value) -> None:
        """NumPy assignment: the values broadcast to the selection (leading length-1 axes beyond
        its dimensions dropped, as NumPy drops them) and are cast as NumPy casts them, except that
        floats do not go into integers (a Python integer out of an integer dtype's range raises
        OverflowError, as in NumPy 2)."""
        self._check_writable()
        expanded = _selection.expand(key, self.ndim)
        if any(_selection.is_array_index(k) for k in expanded):
            values = self._cast_for_write(value)
            if _selection.numpy_kind(expanded, self.shape) == "orthogonal":
                selection = _selection.Orthogonal(expanded, self.shape, self.chunks, flat_only=False)
                return _selection.write_orthogonal(self, selection, _from_numpy_layout(selection, values))
            return _selection.write_points(self, _selection.Points(expanded, self.shape, self.chunks), values)
        index = _Index(expanded, self.shape)
        values = self._cast_for_write(value)
        if not (self.ndim and len(index.dropped) == self.ndim):
            # NumPy sets one element (an integer on every axis) from a scalar only, never from a
            # sequence of one.
            values = _selection.drop_leading_ones(values, len(index.result_shape))
        values = np.broadcast_to(values, index.result_shape).reshape(index.counts)
        if index.reversed:
            values = np.flip(values, axis=index.reversed)
        values = np.ascontiguousarray(values)
        if values.size:
            self._core.write(index.starts, index.stops, index.steps, _raw(values))

    def _cast_for_write(self, value) -> np.ndarray:
        target = self._dtype
        values = np.asarray(value)
        if values.dtype == target:
            return values
        if target.kind in "iu" and values.dtype.kind == "f" and not isinstance(value, (np.ndarray, np.generic)):
            # NumPy makes a list of Python integers float64 where one is past int64 ([2**64 - 1, 1]),
            # losing digits: a list of integers is taken as integers (NumPy assignment does so too).
            exact = np.asarray(value, dtype=object)
            if exact.size and all(isinstance(x, (int, np.integer)) for x in exact.flat):
                values = exact
        kinds = values.dtype.kind + target.kind
        if target.kind in "iu" and values.dtype.kind in "iuO" and values.size and \
                not isinstance(value, (np.ndarray, np.generic)):
            # Python integers (NumPy 2's rule): one outside the dtype's range raises, it does not
            # wrap around (arr[0] = -1 on uint8 is an error, not 255). NumPy integers cast as
            # NumPy casts them.
            info = np.iinfo(target)
            for bound in (values.min(), values.max()):
                if isinstance(bound, (int, np.integer)) and not info.min <= bound <= info.max:
                    raise OverflowError(f"Python integer {int(bound)} out of bounds for {target}")
        # Within one kind, between signed and unsigned integers (arr[...] = 1 on uint8) and from
        # integers to bool (nonzero is True) cast as NumPy assignment does; across other kinds
        # (float into int) only where NumPy calls it safe.
        same_kind = values.dtype.kind == target.kind or kinds in ("iu", "ui", "ib", "ub")
        if values.dtype.kind == "O" and target.kind in "iu":
            return np.asarray(value, dtype=target)  # Python integers beyond int64 and uint64, in range
        return values.astype(target, casting="unsafe" if same_kind else "same_kind")

    @property
    def oindex(self) -> "_OrthogonalIndexer":
        """Orthogonal selection, as zarr-python's: per axis an integer, a slice, or a 1-D integer
        array or boolean mask, each axis selected on its own (``arr.oindex[[0, 9], :, [2, 3]]``
        has shape (2, n1, 2)). Reads and writes."""
        return _OrthogonalIndexer(self)

    @property
    def vindex(self) -> "_PointsIndexer":
        """Points selection, as zarr-python's: integer arrays broadcast together, one element per
        point (``arr.vindex[[0, 9], [2, 3]]`` has shape (2,)), or a boolean mask of the array's
        shape; slices may stand for other axes, laid out as NumPy lays them out. Reads and writes."""
        return _PointsIndexer(self)

    def __array__(self, dtype=None, copy=None):
        """The whole array, read (a 0-d array for a 0-d Array). ``copy`` (NumPy 2): every read
        makes a new array that nothing else holds, so ``copy=False`` is honoured as it is."""
        data = np.asarray(self[...])  # a 0-d read is a NumPy scalar; __array__ must give an ndarray
        return data if dtype is None else data.astype(dtype, copy=False)


class _OrthogonalIndexer:
    __slots__ = ("_array",)

    def __init__(self, array: Array):
        self._array = array

    def _selection(self, key) -> _selection.Orthogonal:
        a = self._array
        return _selection.Orthogonal(_selection.expand(key, a.ndim), a.shape, a.chunks)

    def __getitem__(self, key) -> np.ndarray:
        selection = self._selection(key)
        result = _selection.read_orthogonal(self._array, selection).reshape(selection.result_shape)
        return result[()] if result.ndim == 0 else result

    def __setitem__(self, key, value) -> None:
        self._array._check_writable()
        selection = self._selection(key)
        values = _selection.drop_leading_ones(self._array._cast_for_write(value), len(selection.result_shape))
        values = np.broadcast_to(values, selection.result_shape)
        _selection.write_orthogonal(self._array, selection, values.reshape(selection.counts))


class _PointsIndexer:
    __slots__ = ("_array",)

    def __init__(self, array: Array):
        self._array = array

    def _selection(self, key) -> _selection.Points:
        a = self._array
        key = key if isinstance(key, tuple) else (key,)
        if any(k is Ellipsis or k is None for k in key):
            raise IndexError("vindex takes an integer array for every axis, or a boolean mask of the array's shape")
        return _selection.Points(tuple(_selection.scalar_index(k) for k in key), a.shape, a.chunks)

    def __getitem__(self, key) -> np.ndarray:
        if not _has_index_array(key):
            return self._array[key]
        return _selection.read_points(self._array, self._selection(key))

    def __setitem__(self, key, value) -> None:
        if not _has_index_array(key):
            self._array[key] = value
            return
        self._array._check_writable()
        _selection.write_points(self._array, self._selection(key), self._array._cast_for_write(value))


def _has_index_array(key) -> bool:
    return any(_selection.is_array_index(k) for k in (key if isinstance(key, tuple) else (key,)))


def _numpy_layout(selection: _selection.Orthogonal, values: np.ndarray) -> np.ndarray:
    """An orthogonal read with one index array (values in `counts` order) as NumPy lays it out:
    integer axes dropped, the array's own shape in place of its axis, and that moved to the front
    where integers and the array are not side by side (NumPy treats integers beside an array as
    indices broadcast with it)."""
    values = values.reshape(_numpy_shape(selection))
    moved = _moved_axes(selection)
    if moved:
        values = np.moveaxis(values, moved[0], moved[1])
    return values[()] if values.ndim == 0 else values


def _from_numpy_layout(selection: _selection.Orthogonal, values: np.ndarray) -> np.ndarray:
    """Values to write, broadcast to NumPy's layout of the selection, in `counts` order."""
    shape = _numpy_shape(selection)
    values = _selection.drop_leading_ones(values, len(shape))
    moved = _moved_axes(selection)
    if moved:
        moved_shape = np.moveaxis(np.empty(shape, dtype=np.bool_), moved[0], moved[1]).shape
        values = np.moveaxis(np.broadcast_to(values, moved_shape), moved[1], moved[0])
    return np.broadcast_to(values, shape).reshape(selection.counts)


def _numpy_shape(selection: _selection.Orthogonal) -> list[int]:
    """The `counts` of a selection with one index array, integer axes dropped and the array's own
    shape in place of its axis (before NumPy moves that to the front, _moved_axes)."""
    (axis,) = selection.arrays
    shape: list[int] = []
    for d, count in enumerate(selection.counts):
        if d == axis:
            shape.extend(selection.array_shapes[axis])
        elif d not in selection.dropped:
            shape.append(count)
    return shape


def _moved_axes(selection: _selection.Orthogonal) -> tuple[list[int], list[int]] | None:
    """(from, to) of the index array's axes where NumPy moves them to the front, else None."""
    (axis,) = selection.arrays
    advanced = sorted(selection.dropped + [axis])
    side_by_side = advanced == list(range(advanced[0], advanced[-1] + 1))
    # An ellipsis between them, even one that covers no axis, sets them apart (NumPy's rule).
    if side_by_side and not (selection.gap is not None and advanced[0] < selection.gap <= advanced[-1]):
        return None
    position = sum(1 for d in range(axis) if d not in selection.dropped)
    count = len(selection.array_shapes[axis])
    return list(range(position, position + count)), list(range(count))


def _reopen(url: str, path: str, read_only: bool, kind: str):
    """A pickled Array or Group opened again (another process: a dask worker, a spawn worker)."""
    node = _wrap(_core.open_node(_core.open_store(url, False), path), read_only)
    expected = Array if kind == "array" else Group
    if not isinstance(node, expected):
        raise ZarrError(f"{url}/{path}: pickled as a Zarr {kind}, now holds another kind of node")
    return node


def _reduce_node(node, kind: str):
    """How an Array or Group pickles: by its store's URL and its path, opened again where it is
    unpickled (as zarr-python's arrays pickle); a memory store's nodes cannot, their values being
    in this process only."""
    url = node._core.store.url
    if url.startswith("memory://"):
        raise TypeError(f"cannot pickle a zfeed {kind} of a memory store (its values live in this "
                        "process only): write it to a directory or bucket first")
    return _reopen, (url, node._core.path, node._read_only, kind)


def _location(core) -> str:
    """Where a node is, for messages: its store's URL and its path in the store."""
    return f"{core.store.url.rstrip('/')}/{core.path}".rstrip("/")


def _raw(buffer: np.ndarray) -> np.ndarray:
    """The buffer as the binding accepts it: nanobind knows no bfloat16, so pass its bits."""
    if _BFLOAT16 is not None and buffer.dtype == _BFLOAT16:
        return buffer.view(np.uint16)
    return buffer


def _json_float(value) -> float:
    if isinstance(value, str):
        if value.startswith("0x"):
            bits = int(value, 16)
            width = (len(value) - 2) * 4
            kind = {16: np.float16, 32: np.float32, 64: np.float64}[width]
            return float(np.array([bits], dtype=f"uint{width}").view(kind)[0])
        return float({"NaN": "nan", "Infinity": "inf", "-Infinity": "-inf"}[value])
    return float(value)


class Attributes(dict):
    """A dict of the node's attributes (equal to a dict of the same items, and JSON as one); every
    change (``attrs[k] = v``, ``del``, ``update``, ``|=``, ``pop``, ``popitem``, ``setdefault``,
    ``clear``, ``put``) writes the metadata at once. A change the metadata cannot hold (a value
    JSON has no form for) raises and leaves the attributes as they were. Read-only where the node
    was opened with ``mode="r"``."""

    def __init__(self, core, read_only: bool = False, name: str = "node"):
        super().__init__(json.loads(core.attributes_json()))
        self._core = core
        self._read_only = read_only
        self._name = name

    def _change(self, method, *args, **kwargs):
        """Runs dict's ``method`` on the attributes and writes them; restores them if the write fails."""
        if self._read_only:
            raise ZarrError(f"the attributes of {self._name} are read-only (opened with mode='r'); "
                            "open it with mode='r+' to change them")
        before = dict(self)
        result = method(self, *args, **kwargs)
        try:
            self._core.set_attributes_json(json.dumps(dict(self)))
        except BaseException:
            dict.clear(self)
            dict.update(self, before)
            raise
        return result

    def __setitem__(self, key, value):
        self._change(dict.__setitem__, key, value)

    def __delitem__(self, key):
        self._change(dict.__delitem__, key)

    def __ior__(self, other):
        self._change(dict.__ior__, other)
        return self

    def update(self, *args, **kwargs):
        self._change(dict.update, *args, **kwargs)

    def pop(self, *args):
        return self._change(dict.pop, *args)

    def popitem(self):
        return self._change(dict.popitem)

    def setdefault(self, key, default=None):
        if key in self:
            return self[key]  # no change: nothing to write (also where read-only, as dict's)
        return self._change(dict.setdefault, key, default)

    def clear(self):
        self._change(dict.clear)

    def put(self, mapping: dict):
        """Replaces all the attributes with ``mapping``'s."""
        def replace(attributes, items):
            dict.clear(attributes)
            dict.update(attributes, items)

        self._change(replace, dict(mapping))


def _set_attributes(node, value) -> None:
    """``node.attrs = value``: replaces the attributes, unless ``value`` is the node's own
    (``node.attrs |= {...}`` assigns what ``|=`` changed and wrote already)."""
    if isinstance(value, Attributes) and value._core is node._core:
        return
    node.attrs.put(value)


class Group:
    """A Zarr group: ``group["name"]`` opens a member array or group (read-only, as the group, where
    it was opened with ``mode="r"``)."""

    def __init__(self, core: _core.Group, read_only: bool = False):
        self._core = core
        self._read_only = bool(read_only)

    @property
    def read_only(self) -> bool:
        """Whether the group was opened with ``mode="r"``: its members, attributes and new members
        cannot be written."""
        return self._read_only

    def __reduce__(self):
        return _reduce_node(self, "group")

    def _check_writable(self, what: str) -> None:
        if self._read_only:
            raise ZarrError(f"group {_location(self._core)} is read-only (opened with mode='r'): cannot {what}; "
                            "open it with mode='r+' to write")

    @property
    def path(self) -> str:
        return self._core.path

    @property
    def name(self) -> str:
        return "/" + self._core.path

    @property
    def zarr_format(self) -> int:
        return self._core.zarr_format

    @property
    def attrs(self) -> Attributes:
        """The attributes, a dict whose changes are written at once; ``group.attrs = {...}``
        replaces them all."""
        return Attributes(self._core, read_only=self._read_only, name=f"group {_location(self._core)}")

    @attrs.setter
    def attrs(self, value) -> None:
        _set_attributes(self, value)

    def keys(self) -> list[str]:
        return list(self._core.members())

    def __iter__(self):
        return iter(self.keys())

    def __len__(self):
        return len(self.keys())

    def __contains__(self, name: str) -> bool:
        return name in self.keys()

    def __getitem__(self, name: str):
        parts = [p for p in name.strip("/").split("/") if p]
        node: Any = self
        for part in parts:
            if not isinstance(node, Group):
                raise KeyError(name)
            try:
                node = _wrap(node._core.open_member(part), self._read_only)
            except _core.NodeNotFoundError:
                raise KeyError(name) from None
        return node

    def members(self):
        return [(name, self[name]) for name in self.keys()]

    def arrays(self):
        return [(name, node) for name, node in self.members() if isinstance(node, Array)]

    def groups(self):
        return [(name, node) for name, node in self.members() if isinstance(node, Group)]

    def create_array(self, name: str, **kwargs) -> Array:
        self._check_writable(f"create array {name!r}")
        return create(self._core.store, path=_join(self.path, name), zarr_format=kwargs.pop("zarr_format", self.zarr_format), **kwargs)

    def create_group(self, name: str, attributes: dict | None = None) -> "Group":
        self._check_writable(f"create group {name!r}")
        return create_group(self._core.store, path=_join(self.path, name), attributes=attributes, zarr_format=self.zarr_format)

    def consolidate(self) -> None:
        """Write consolidated metadata (v3: inline in zarr.json; v2: .zmetadata)."""
        self._check_writable("consolidate its metadata")
        self._core.consolidate()

    def tree(self) -> str:
        lines = [self.name]

        def walk(group: Group, indent: str):
            names = group.keys()
            for i, name in enumerate(names):
                last = i == len(names) - 1
                node = group[name]
                lines.append(f"{indent}{'└── ' if last else '├── '}{name}" + (f" {node.shape} {node.dtype}" if isinstance(node, Array) else ""))
                if isinstance(node, Group):
                    walk(node, indent + ("    " if last else "│   "))

        walk(self, "")
        return "\n".join(lines)

    def __repr__(self) -> str:
        return f"<zfeed.Group {self.name} members={self.keys()} zarr_format={self.zarr_format}>"


def _join(prefix: str, name: str) -> str:
    name = name.strip("/")
    return f"{prefix}/{name}" if prefix else name


def _wrap(node, read_only: bool = False):
    if isinstance(node, _core.Array):
        return Array(node, read_only)
    return Group(node, read_only)


# ---------------------------------------------------------------------------------------------
# Opening and creating

_MODES = ("r", "r+", "a", "w", "w-")


def _check_mode(mode, allowed: Sequence[str], what: str) -> None:
    if not isinstance(mode, str) or mode not in allowed:
        raise ZarrError(f"{what}: mode must be one of {', '.join(repr(m) for m in allowed)}, got {mode!r}")


def open(store, path: str | None = None, mode: str = "r+"):
    """Open the array or group at ``store`` (a directory, ``file://`` URL or store object),
    optionally at ``path`` inside it. ``mode``, as zarr-python's:

    - ``"r+"`` (the default): read and write; the node must exist.
    - ``"r"``: read only: writes (``arr[...] = v``, ``oindex``/``vindex`` writes), attribute
      changes and new members raise :class:`zfeed.ZarrError`.
    - ``"a"``: read and write; where nothing is at the path, an empty group is created there
      (zarr-python's default mode; zfeed's default leaves a mistyped path an error instead).
    - ``"w"``: create an empty group there, replacing whatever node was there (its members too).
    - ``"w-"``: create an empty group there; an error if a node is there already.

    Arrays are created with :func:`zfeed.create` (shape, dtype and chunks), so ``"a"``, ``"w"`` and
    ``"w-"`` create groups, as ``zarr.open`` does when given no shape."""
    _check_mode(mode, _MODES, "open")
    if mode in ("r", "r+"):
        s, p = _split_path(store, path)
        return _wrap(_core.open_node(s, p), read_only=mode == "r")
    s, p = _store(store, create=True), path or ""
    if mode == "w":
        return create_group(s, p, overwrite=True)
    try:
        node = _wrap(_core.open_node(s, p))
    except _core.NodeNotFoundError:
        return create_group(s, p)
    if mode == "w-":
        kind = "array" if isinstance(node, Array) else "group"
        raise ZarrError(f"open: mode='w-' creates a new group, but {_location(node._core)} is already a Zarr {kind} "
                        "(mode='w' replaces it, mode='r+' opens it)")
    return node


def open_array(store, path: str | None = None, mode: str = "r+") -> Array:
    """Open the array at ``store`` (optionally at ``path`` inside it): ``mode`` ``"r+"`` (the
    default) reads and writes, ``"r"`` only reads (see :func:`zfeed.open`); :func:`zfeed.create`
    makes arrays."""
    _check_mode(mode, ("r", "r+"), "open_array")
    s, p = _split_path(store, path)
    return Array(_core.Array.open(s, p), read_only=mode == "r")


def open_group(store, path: str | None = None, mode: str = "r+") -> Group:
    """Open the group at ``store`` (optionally at ``path`` inside it); ``mode`` as
    :func:`zfeed.open`'s, where ``"a"`` opens the group or creates an empty one."""
    _check_mode(mode, _MODES, "open_group")
    if mode not in ("r", "r+"):
        node = open(store, path, mode)
        if not isinstance(node, Group):
            raise ZarrError(f"open_group: {_location(node._core)} is an array, not a group")
        return node
    s, p = _split_path(store, path)
    return Group(_core.Group.open(s, p), read_only=mode == "r")


def stage(source, destination, threads: int | None = None, progress: bool = True, time_range=None,
          time_dim: str = "time") -> Path:
    """Copy the Zarr store at ``source`` (``s3://``, ``gs://``, ``https://`` or a path on a shared
    file system) to the local directory ``destination`` and return its path, so that training
    reads local files. Resumable (values present from an interrupted run are kept), and shared:
    the processes of a node that stage the same destination at once wait for one copy, so every
    rank may call it (on a cluster, give a node-local path: each node makes its own copy).
    ``time_range=(start, stop)``: only those time steps of the arrays whose first dimension is
    ``time_dim`` (the chunks that hold them; 1-D coordinates and everything else whole): a partial
    copy, which refuses reads of the chunks it does not hold (a loader on it keeps to its steps).
    ``progress`` prints a progress line to stderr; Ctrl-C stops the copy (a later call goes on
    from there)."""
    steps = None
    if time_range is not None:
        if isinstance(time_range, (slice, range)):
            time_range = (time_range.start, time_range.stop)
        if not isinstance(time_range, (tuple, list)) or len(time_range) != 2 or \
                not all(isinstance(x, (int, np.integer)) and not isinstance(x, bool) and x >= 0 for x in time_range):
            raise _core.ZarrError(f"stage: time_range is (start, stop) of time indices, got {time_range!r}")
        steps = (int(time_range[0]), int(time_range[1]))
    _core.stage(_store(source), os.fspath(destination), int(threads or 0),
                bool(progress), steps, str(time_dim))
    return Path(os.fspath(destination))


def create_group(store, path: str | None = None, attributes: dict | None = None, zarr_format: int = 3,
                 overwrite: bool = False) -> Group:
    s = _store(store, create=True)
    return Group(_core.Group.create(s, path or "", zarr_format, json.dumps(attributes or {}), overwrite))


def _compressor_codec(compressor) -> dict | None:
    """'zstd', 'zstd:3', 'gzip:6', 'blosc:lz4', 'blosc:zstd:5', 'none', None or a codec dict."""
    if compressor is None or compressor == "none":
        return None
    if isinstance(compressor, dict):
        return compressor
    name, _, rest = str(compressor).partition(":")
    if name == "zstd":
        return {"name": "zstd", "configuration": {"level": int(rest or 3), "checksum": False}}
    if name == "gzip":
        return {"name": "gzip", "configuration": {"level": int(rest or 5)}}
    if name == "blosc":
        cname, _, level = rest.partition(":")
        return {"name": "blosc", "configuration": {"cname": cname or "lz4", "clevel": int(level or 5), "shuffle": "shuffle", "blocksize": 0}}
    if name in ("zlib", "lz4"):
        key = "level" if name == "zlib" else "acceleration"
        return {"name": f"numcodecs.{name}", "configuration": {key: int(rest or 1)}}
    raise ZarrError(f"unknown compressor {compressor!r} (use zstd[:level], gzip[:level], blosc[:cname[:level]], zlib, lz4 or none)")


def _v2_compressor(codec: dict | None) -> dict | None:
    if codec is None:
        return None
    name, cfg = codec["name"], codec.get("configuration", {})
    if name == "zstd":
        # numcodecs leaves out checksum=False (its default), and tensorstore rejects the member.
        return {"id": "zstd", "level": cfg.get("level", 0), **({"checksum": True} if cfg.get("checksum") else {})}
    if name == "gzip":
        return {"id": "gzip", "level": cfg.get("level", 1)}
    if name == "blosc":
        shuffle = {"noshuffle": 0, "shuffle": 1, "bitshuffle": 2}.get(cfg.get("shuffle", "noshuffle"), cfg.get("shuffle"))
        return {"id": "blosc", "cname": cfg.get("cname", "lz4"), "clevel": cfg.get("clevel", 5), "shuffle": shuffle,
                "blocksize": cfg.get("blocksize", 0)}
    if name == "numcodecs.zlib":
        return {"id": "zlib", "level": cfg.get("level", 1)}
    if name == "numcodecs.lz4":
        return {"id": "lz4", "acceleration": cfg.get("acceleration", 1)}
    raise ZarrError(f"codec {name} has no Zarr v2 compressor form")


def _fill_json(fill_value, dtype: np.dtype):
    """The metadata's fill value; one that the data type cannot hold (1.5 for int32, 300 for
    int8, 1e39 for float32, "no" for bool) is an error, not rounded, wrapped or made inf."""
    if fill_value is None:
        return False if dtype.kind == "b" else [0.0, 0.0] if dtype.kind == "c" else 0

    def refuse(why: str):
        raise ZarrError(f"fill_value {fill_value!r} does not fit data type {dtype}: {why}")

    if dtype.kind in "biu":
        # Numbers only: int("3") or bool("no") would take a string's meaning loosely.
        if not isinstance(fill_value, (int, float, np.integer, np.floating, np.bool_)):
            refuse("give an integer" if dtype.kind != "b" else "give True or False")
        if isinstance(fill_value, (float, np.floating)) and not float(fill_value).is_integer():
            refuse("not an integer")
        value = int(fill_value)
        if dtype.kind == "b":
            if value not in (0, 1):
                refuse("give True or False")
            return bool(value)
        info = np.iinfo(dtype)
        if not info.min <= value <= info.max:
            refuse(f"outside [{info.min}, {info.max}]")
        return value
    # Floats take strings as float() does ("nan", "inf"); a finite value beyond the type's range
    # would become an infinity.
    part_dtype = np.dtype(f"float{dtype.itemsize * 4}") if dtype.kind == "c" else dtype
    value = complex(fill_value) if dtype.kind == "c" else float(fill_value)
    parts = (value.real, value.imag) if dtype.kind == "c" else (value,)
    for part in parts:
        with np.errstate(over="ignore"):
            if math.isfinite(part) and not np.isfinite(part_dtype.type(part)):
                refuse(f"beyond the range of {part_dtype}")
    return [_float_json(value.real), _float_json(value.imag)] if dtype.kind == "c" else _float_json(value)


def _float_json(value: float):
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "Infinity" if value > 0 else "-Infinity"
    return value


def create(store, shape: Sequence[int] | int, dtype="float32", chunks: Sequence[int] | None = None,
           shards: Sequence[int] | None = None, compressor: Any = "zstd:3", codecs: list | None = None,
           fill_value=None, dimension_names: Iterable[str | None] | None = None, attributes: dict | None = None,
           zarr_format: int = 3, chunk_key_encoding: str | None = None, order: str = "C",
           path: str | None = None, overwrite: bool = False, data=None) -> Array:
    """Create an array.

    ``chunks`` is the chunk shape (the inner chunk shape when ``shards`` is given); it defaults to
    the whole array. ``codecs`` (v3) replaces the default chain ``bytes`` + ``compressor``: give
    the full list of codecs of one chunk (inside a shard, where sharded). ``data``, if given, is
    written after creation.
    """
    if isinstance(shape, (int, np.integer)):
        shape = (int(shape),)
    shape = tuple(int(s) for s in shape)
    if any(s < 0 for s in shape):
        raise ZarrError(f"shape must not be negative, got {shape}")
    if chunks is None:
        chunks = tuple(max(1, s) for s in shape)
    if isinstance(chunks, (int, np.integer)):
        chunks = (int(chunks),) * len(shape)
    chunks = tuple(int(c) for c in chunks)
    if order not in ("C", "F"):
        raise ZarrError(f"order must be 'C' or 'F', got {order!r}")
    dtype_name = _zarr_dtype_name(dtype)
    np_dtype = _numpy_dtype(dtype_name)
    fill_json = _fill_json(fill_value, np_dtype)  # checked before the store is made
    s = _store(store, create=True)
    names = list(dimension_names) if dimension_names is not None else None
    codec = _compressor_codec(compressor)

    if zarr_format == 2:
        if shards is not None:
            raise ZarrError("Zarr v2 has no sharding")
        if codecs is not None:
            raise ZarrError("Zarr v2 takes a compressor, not a codec list")
        zarray = {
            "zarr_format": 2,
            "shape": list(shape),
            "chunks": list(chunks),
            "dtype": np_dtype.str if np_dtype.itemsize > 1 else "|" + np_dtype.str[1:],
            "compressor": _v2_compressor(codec),
            "fill_value": fill_json,
            "order": order,
            "filters": None,
            "dimension_separator": chunk_key_encoding or ".",
        }
        zattrs = dict(attributes or {})
        if names is not None:
            zattrs["_ARRAY_DIMENSIONS"] = names
        core = _core.Array.create(s, path or "", json.dumps(zarray), json.dumps(zattrs), overwrite)
    else:
        endian = {"name": "bytes", "configuration": {"endian": "little"}} if np_dtype.itemsize > 1 else {"name": "bytes"}
        if codecs is None:
            chain = [endian] + ([codec] if codec else [])
            if order == "F" and len(shape) > 1:
                chain = [{"name": "transpose", "configuration": {"order": list(range(len(shape)))[::-1]}}] + chain
        else:
            chain = list(codecs)
        if shards is not None:
            shards = tuple(int(x) for x in shards)
            chain = [{
                "name": "sharding_indexed",
                "configuration": {
                    "chunk_shape": list(chunks),
                    "codecs": chain,
                    "index_codecs": [{"name": "bytes", "configuration": {"endian": "little"}}, {"name": "crc32c"}],
                    "index_location": "end",
                },
            }]
            grid_chunks = shards
        else:
            grid_chunks = chunks
        separator = chunk_key_encoding or "/"
        meta = {
            "zarr_format": 3,
            "node_type": "array",
            "shape": list(shape),
            "data_type": dtype_name,
            "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": list(grid_chunks)}},
            "chunk_key_encoding": {"name": "default", "configuration": {"separator": separator}},
            "fill_value": fill_json,
            "codecs": chain,
            "attributes": dict(attributes or {}),
        }
        if names is not None:
            meta["dimension_names"] = names
        core = _core.Array.create(s, path or "", json.dumps(meta), "", overwrite)
    array = Array(core)
    if data is not None:
        array[...] = data
    return array
