"""Selections beyond basic indexing: integer arrays and boolean masks.

Two kinds, as zarr-python names them:

- orthogonal (``arr.oindex[...]``): per axis an integer, a slice, or a 1-D array of indices (or a
  boolean mask of the axis), each axis selected on its own: ``oindex[[0, 5], :, [1, 2]]`` has shape
  (2, n1, 2). NumPy's ``arr[...]`` means the same where one axis has an array.
- points (``arr.vindex[...]``): integer arrays broadcast together, one element per point (NumPy's
  ``arr[[0, 5], [1, 2]]``; slices on other axes give a slice per point, laid out as NumPy does), or
  a boolean mask of the array's shape.

Both are read chunk by chunk: the selected indices are grouped by the read chunk that holds them,
each group is read as one box (from its first selected index to its last, so within one chunk)
with every box of a pass decoded in parallel, and the selected elements go from the boxes to their
places in the output (a box whose elements all go, in order, to one contiguous part of the output
is read straight into it). A chunk is decoded once per selection however many of its elements are
selected, and no chunk without a selected element is read. Writes go the same way: a box whose
elements are all selected is written as it is, any other box is read, changed and written back (as
zarr-python does with chunks).
"""

from __future__ import annotations

import itertools
import math
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

if TYPE_CHECKING:  # pragma: no cover
    from .array import Array

# Boxes read in one parallel pass: about this many bytes of them at a time.
_PASS_BYTES = 128 << 20


def is_array_index(k: Any) -> bool:
    """Whether an index component is an array of indices (or a mask) rather than a basic one."""
    if isinstance(k, (list, tuple)):
        return True
    if isinstance(k, np.ndarray):
        return k.ndim > 0
    if isinstance(k, (int, np.integer, slice, bool, np.bool_, str, bytes, float)) or k is None or k is Ellipsis:
        return False
    return hasattr(k, "__array__") and np.ndim(k) > 0


def scalar_index(k: Any) -> Any:
    """A 0-d integer array as the integer it holds (NumPy treats it so); anything else as it is."""
    if isinstance(k, np.ndarray) and k.ndim == 0 and k.dtype.kind in "iu":
        return int(k)
    return k


def drop_leading_ones(values: np.ndarray, ndim: int) -> np.ndarray:
    """Values to assign to a selection of ``ndim`` dimensions without their leading length-1 axes
    beyond those (NumPy's leeway: ``np.ones((1, 4))`` goes into a row of 4)."""
    while values.ndim > ndim and values.shape[0] == 1:
        values = values[0]
    return values


class Expanded(tuple):
    """expand's result. `gap`: the axis before which an ellipsis that covers no axis stood, else
    None: NumPy counts it as separating the index arrays and integers on either side (whose axes
    then move to the front of the result)."""

    gap: int | None = None


def expand(key: Any, ndim: int) -> tuple:
    """The key as a tuple of one component per axis (a boolean mask of k dimensions stays one
    component that covers k axes): the ellipsis expanded, missing trailing axes as full slices."""
    if not isinstance(key, tuple):
        key = (key,)
    key = tuple(scalar_index(k) for k in key)
    if any(k is None for k in key):
        raise IndexError("zfeed arrays do not support np.newaxis in an index")
    ellipses = sum(k is Ellipsis for k in key)
    if ellipses > 1:
        raise IndexError("an index can only have a single ellipsis ('...')")
    covered = sum(_axes_covered(k) for k in key if k is not Ellipsis)
    if covered > ndim:
        raise IndexError(f"too many indices: array is {ndim}-dimensional, but {covered} were indexed")
    if ellipses:
        i = next(i for i, k in enumerate(key) if k is Ellipsis)
        expanded = Expanded(key[:i] + (slice(None),) * (ndim - covered) + key[i + 1 :])
        if covered == ndim:
            expanded.gap = sum(_axes_covered(k) for k in key[:i])
        return expanded
    return key + (slice(None),) * (ndim - covered)


def _axes_covered(k: Any) -> int:
    if is_array_index(k):
        a = np.asarray(k)
        if a.dtype == bool:
            return max(a.ndim, 1)
    return 1


def index_array(k: Any, n: int, dim: int, *, flat_only: bool) -> np.ndarray:
    """An index component that is an array, as int64 indices in [0, n) (negative ones wrap; a
    boolean mask of the axis gives its True positions). Keeps an integer array's shape unless
    `flat_only`, where it must be 1-D."""
    a = np.asarray(k)
    if a.dtype == bool:
        if a.shape != (n,):
            raise IndexError(f"boolean index of shape {a.shape} does not match axis {dim} of size {n}")
        return np.flatnonzero(a)
    if a.size == 0:
        a = a.astype(np.int64)  # NumPy makes [] float64
    if a.dtype.kind not in "iu":
        raise IndexError(f"arrays used as indices must be of integer or boolean type; axis {dim} has {a.dtype}")
    if flat_only and a.ndim != 1:
        raise IndexError(f"orthogonal selection takes 1-D index arrays; axis {dim} has one of shape {a.shape}")
    if a.dtype == np.uint64 and a.size and a.max() > np.iinfo(np.int64).max:
        raise IndexError(f"index {int(a.max())} is out of bounds for axis {dim} with size {n}")
    a = a.astype(np.int64)
    bad = (a < -n) | (a >= n)
    if bad.any():
        raise IndexError(f"index {int(a[bad].flat[0])} is out of bounds for axis {dim} with size {n}")
    return np.where(a < 0, a + n, a)


def numpy_kind(key: tuple, shape: Sequence[int]) -> str:
    """What NumPy makes of an expanded key that holds arrays: "orthogonal" where one array selects
    along its axis (any other component basic), else "points" (several arrays broadcast together,
    or one boolean mask of the array's shape)."""
    arrays = [k for k in key if is_array_index(k)]
    if len(arrays) == 1 and not (np.asarray(arrays[0]).dtype == bool and np.asarray(arrays[0]).ndim > 1):
        return "orthogonal"
    return "points"


class _Group:
    """The distinct indices of an orthogonal selection along one axis that one read chunk holds:
    read as one box [first, stop), its values going to `target` in the output: a slice where they
    go, in their order, to consecutive places (read there directly), else the given positions
    (each distinct index's, ascending; `repeats` says how many each has where any repeats)."""

    __slots__ = ("distinct", "first", "local", "repeats", "stop", "target")

    def __init__(self, unique: np.ndarray, repeats: np.ndarray, given: np.ndarray, lo: int, hi: int):
        self.distinct = slice(lo, hi)
        self.first, self.stop = int(unique[lo]), int(unique[hi - 1]) + 1
        self.local = unique[lo:hi] - self.first
        repeated = len(given) != hi - lo
        self.repeats = repeats[lo:hi] if repeated else None
        if not repeated and (len(given) == 1 or bool(np.all(np.diff(given) == 1))):
            self.target: slice | np.ndarray = slice(int(given[0]), int(given[-1]) + 1)
        else:
            self.target = given


class Orthogonal:
    """An orthogonal selection resolved against an array: per axis an integer, a slice (any step)
    or indices. Axes in `counts` order keep integers as length 1 and hold every index given (with
    repeats, in the order given); boxes are read over the distinct sorted indices."""

    def __init__(self, key: tuple, shape: Sequence[int], chunks: Sequence[int], *, flat_only: bool = True):
        from .array import _Index  # the basic part of the key

        self.shape = tuple(shape)
        self.gap = getattr(key, "gap", None)  # where an ellipsis of no axis stood (Expanded)
        self.arrays: dict[int, np.ndarray] = {}  # axis -> indices as given (flattened)
        self.array_shapes: dict[int, tuple] = {}
        basic_key = []
        for dim, (k, n) in enumerate(zip(key, shape)):
            if is_array_index(k):
                a = index_array(k, n, dim, flat_only=flat_only)
                self.array_shapes[dim] = a.shape
                self.arrays[dim] = a.reshape(-1)
                basic_key.append(slice(None))
            else:
                basic_key.append(k)
        self.basic = _Index(tuple(basic_key), shape)
        self.dropped = list(self.basic.dropped)
        self.counts = [len(self.arrays[d]) if d in self.arrays else c for d, c in enumerate(self.basic.counts)]
        # Per array axis: the distinct sorted indices, where each given index is among them, and
        # their groups, one per read chunk holding any.
        self.unique: dict[int, np.ndarray] = {}
        self.inverse: dict[int, np.ndarray] = {}
        self.groups: dict[int, list[_Group]] = {}
        for d, a in self.arrays.items():
            unique, inverse, repeats = np.unique(a, return_inverse=True, return_counts=True)
            inverse = inverse.reshape(-1)
            self.unique[d], self.inverse[d] = unique, inverse
            # The given positions, those of the first distinct index first (each index's ascending).
            by_distinct = np.argsort(inverse, kind="stable")
            offsets = np.concatenate(([0], np.cumsum(repeats)))
            chunk_of = unique // chunks[d]
            bounds = np.concatenate(([0], np.flatnonzero(np.diff(chunk_of)) + 1, [len(unique)])) if len(unique) else []
            self.groups[d] = [
                _Group(unique, repeats, by_distinct[offsets[lo] : offsets[hi]], int(lo), int(hi))
                for lo, hi in zip(bounds[:-1], bounds[1:])
            ]

    @property
    def empty(self) -> bool:
        return any(c == 0 for c in self.counts)

    @property
    def result_shape(self) -> tuple:
        """The shape of the values with integer axes dropped (zarr-python's oindex layout)."""
        return tuple(c for d, c in enumerate(self.counts) if d not in self.dropped)

    @property
    def reversed(self) -> list[int]:
        return self.basic.reversed

    def boxes(self):
        """For every combination of the array axes' groups: (box key, where its values go among
        the distinct indices (for writes), where they go in the output (for reads: slices, or
        positions along array axes), how often each repeats per array axis where any does, which
        of the box's elements are selected or None where all are)."""
        b = self.basic
        per_axis = []
        for d in range(len(self.shape)):
            per_axis.append([(d, g) for g in self.groups[d]] if d in self.arrays else [(d, None)])
        for combination in itertools.product(*per_axis):
            key, distinct, target, repeats, local, dense = [], [], [], {}, [], True
            for d, group in combination:
                if group is None:
                    key.append(slice(b.starts[d], b.stops[d], b.steps[d]))
                    distinct.append(slice(None))
                    target.append(slice(None))
                    local.append(np.arange(b.counts[d]))
                else:
                    key.append(slice(group.first, group.stop, 1))
                    distinct.append(group.distinct)
                    target.append(group.target)
                    if group.repeats is not None:
                        repeats[d] = group.repeats
                    local.append(group.local)
                    dense = dense and len(group.local) == group.stop - group.first
            yield tuple(key), tuple(distinct), tuple(target), repeats, (None if dense else np.ix_(*local))

    def to_distinct_order(self, values: np.ndarray) -> np.ndarray:
        """Values over the indices as given -> over the distinct sorted ones, the last of repeated
        indices winning (as NumPy's assignment)."""
        if self.basic.reversed:
            values = np.flip(values, axis=self.basic.reversed)
        for d, a in self.arrays.items():
            if len(a) == len(self.unique[d]) and np.all(self.inverse[d] == np.arange(len(a))):
                continue
            # The position of each distinct index's last occurrence in the given order.
            last = np.empty(len(self.unique[d]), dtype=np.int64)
            last[self.inverse[d]] = np.arange(len(a))
            values = np.take(values, last, axis=d)
        return values


def _extent(s: slice) -> int:
    return len(range(s.start, s.stop, s.step or 1))


def _passes(boxes, itemsize: int):
    """The boxes (each a tuple whose first item is its key) in lists of about _PASS_BYTES each:
    one parallel read per list."""
    batch, size = [], 0
    for box in boxes:
        batch.append(box)
        size += math.prod(_extent(s) for s in box[0]) * itemsize
        if size >= _PASS_BYTES:
            yield batch
            batch, size = [], 0
    if batch:
        yield batch


def read_orthogonal(array: "Array", selection: Orthogonal, out: np.ndarray | None = None) -> np.ndarray:
    """The selection's values in `counts` order (integer axes kept as length 1), into `out` where
    given (C-contiguous, of that shape; the selection without negative steps)."""
    if out is None:
        out = np.empty(selection.counts, dtype=array.dtype)
    if out.size:
        for batch in _passes(selection.boxes(), array.dtype.itemsize):
            # A box whose elements are all selected and go to one contiguous part of `out` is read
            # straight into it; the others into a buffer, then scattered.
            buffers, direct = [], []
            for key, _, target, repeats, pick in batch:
                view = None
                if pick is None and not repeats and all(isinstance(t, slice) for t in target):
                    view = out[target + (Ellipsis,)]  # a view, also of a 0-d array
                direct.append(view is not None and view.flags.c_contiguous)
                buffers.append(view if direct[-1] else np.empty([_extent(s) for s in key], dtype=array.dtype))
            array.read_many([box[0] for box in batch], outs=buffers)
            for (_, _, target, repeats, pick), box, in_place in zip(batch, buffers, direct):
                if in_place:
                    continue
                values = box if pick is None else box[pick]
                for d, counts in repeats.items():
                    values = np.repeat(values, counts, axis=d)
                _scatter(out, target, values)
    if selection.basic.reversed:
        out = np.flip(out, axis=selection.basic.reversed)
    return out


def _scatter(out: np.ndarray, target: tuple, values: np.ndarray) -> None:
    """out[target] = values, target's position arrays (one per axis at most) taken orthogonally."""
    arrays = [i for i, t in enumerate(target) if not isinstance(t, slice)]
    if len(arrays) <= 1:
        out[target] = values  # one index array among slices keeps the axes where they are
    else:
        out[np.ix_(*(np.arange(n)[t] if isinstance(t, slice) else t for t, n in zip(target, out.shape)))] = values


def write_orthogonal(array: "Array", selection: Orthogonal, values: np.ndarray) -> None:
    """Writes `values` (in `counts` order) to the selection."""
    if selection.empty:
        return
    values = selection.to_distinct_order(values)
    for key, place, _, _, pick in selection.boxes():
        part = values[place]
        if pick is None:
            array[key] = part
        else:
            box = array[key]
            box[pick] = part
            array[key] = box


class Points:
    """A points selection with NumPy's meaning: integer arrays (integers, 1-D boolean masks) on
    some axes broadcast together into points, slices on the others; or one boolean mask of the
    array's shape. Each point's values (one element, or a slice's worth per point where slices
    remain) are read from the chunk holding the point, points grouped by chunk. `slices_last`:
    the points' dimensions always first, the slices' after them (xarray's vectorized indexing)."""

    def __init__(self, key: tuple, shape: Sequence[int], chunks: Sequence[int], *, slices_last: bool = False):
        from .array import _Index  # the slices of the key

        self.shape = tuple(shape)
        gap = getattr(key, "gap", None)  # where an ellipsis of no axis stood (Expanded)
        # Boolean masks become the integer arrays of their True positions, one per axis they cover.
        expanded: list = []
        for k in key:
            if is_array_index(k) and np.asarray(k).dtype == bool:
                mask, first = np.asarray(k), len(expanded)
                covered = self.shape[first : first + mask.ndim]
                if mask.shape != covered:
                    axes = f"axis {first}" if mask.ndim == 1 else f"axes {first} to {first + mask.ndim - 1}"
                    raise IndexError(f"boolean index of shape {mask.shape} does not match {axes} of the array, "
                                     f"of shape {covered}")
                expanded.extend(np.nonzero(mask))
            else:
                expanded.append(k)
        key = tuple(expanded)
        # Axes with integers or arrays are the point axes; slices stay per point.
        self.point_axes = [d for d, k in enumerate(key) if not isinstance(k, slice)]
        try:
            points_shape = np.broadcast_shapes(*(np.shape(key[d]) for d in self.point_axes))
        except ValueError:
            shapes = " ".join(str(np.shape(key[d])) for d in self.point_axes)
            raise IndexError(f"shape mismatch: index arrays of shapes {shapes} do not broadcast together") from None
        if math.prod(points_shape) == 0:
            # No points: NumPy checks the arrays' indices no further then (its integers still), nor
            # does zfeed.
            key = tuple(np.zeros(np.shape(k), dtype=np.int64) if d in self.point_axes and np.ndim(k) else k
                        for d, k in enumerate(key))
        coords = []
        for d in self.point_axes:
            k, n = key[d], shape[d]
            if isinstance(k, (int, np.integer)):
                if not -n <= int(k) < n:
                    raise IndexError(f"index {int(k)} is out of bounds for axis {d} with size {n}")
                coords.append(np.asarray(int(k) % n, dtype=np.int64))
            elif is_array_index(k):
                coords.append(index_array(k, n, d, flat_only=False))
            else:
                raise IndexError(f"unsupported index {k!r} for axis {d}: zfeed takes integers, slices (with "
                                 "steps), '...' and integer or boolean arrays")
        coords = list(np.broadcast_arrays(*coords))
        self.points_shape = coords[0].shape
        self.coords = [c.reshape(-1) for c in coords]
        self.count = len(self.coords[0])
        self.slices = _Index(tuple(slice(None) if d in self.point_axes else k for d, k in enumerate(key)), shape)
        self.slice_axes = [d for d in range(len(shape)) if d not in self.point_axes]
        slice_counts = [self.slices.counts[d] for d in self.slice_axes]
        # NumPy puts the points' dimensions where the point axes are when they are side by side,
        # else first; an ellipsis between them, even one that covers no axis, sets them apart.
        adjacent = self.point_axes == list(range(self.point_axes[0], self.point_axes[-1] + 1)) and not (
            gap is not None and self.point_axes[0] < gap <= self.point_axes[-1])
        place = sum(1 for d in self.slice_axes if d < self.point_axes[0]) if adjacent and not slices_last else 0
        self.result_shape = tuple(slice_counts[:place]) + self.points_shape + tuple(slice_counts[place:])
        self._place = place
        self.values_shape = (self.count, *slice_counts)  # points first, then the slices in order
        # Points grouped by chunk (in each group in the given order, so a repeated point's last
        # value is the one written).
        self.groups: list[np.ndarray] = []
        if self.count:
            grid = [math.ceil(shape[d] / chunks[d]) for d in self.point_axes]
            chunk_ids = np.ravel_multi_index([c // chunks[d] for c, d in zip(self.coords, self.point_axes)], grid)
            order = np.argsort(chunk_ids, kind="stable")
            bounds = np.flatnonzero(np.diff(chunk_ids[order])) + 1
            self.groups = np.split(order, bounds)

    def boxes(self):
        """(box key, the group's points, where they are in the box with its point axes first)."""
        b = self.slices
        for group in self.groups:
            coords = [c[group] for c in self.coords]
            firsts = {d: int(c.min()) for d, c in zip(self.point_axes, coords)}
            stops = {d: int(c.max()) + 1 for d, c in zip(self.point_axes, coords)}
            key = tuple(slice(firsts[d], stops[d]) if d in firsts else slice(b.starts[d], b.stops[d], b.steps[d])
                        for d in range(len(self.shape)))
            yield key, group, tuple(c - firsts[d] for d, c in zip(self.point_axes, coords))

    def gather(self, box: np.ndarray, local: tuple) -> np.ndarray:
        """The group's values from its box: (points, slice axes...)."""
        box = np.moveaxis(box, self.point_axes, range(len(self.point_axes)))
        return box[local]

    def scatter(self, box: np.ndarray, local: tuple, values: np.ndarray) -> None:
        np.moveaxis(box, self.point_axes, range(len(self.point_axes)))[local] = values

    def to_result(self, values: np.ndarray) -> np.ndarray:
        """(points, slice axes...) -> NumPy's layout."""
        if self.slices.reversed:
            values = np.flip(values, axis=[1 + self.slice_axes.index(d) for d in self.slices.reversed])
        values = values.reshape(self.points_shape + values.shape[1:])
        n = len(self.points_shape)
        values = np.moveaxis(values, range(n), range(self._place, self._place + n))
        return values[()] if values.ndim == 0 else values

    def from_result(self, values: np.ndarray) -> np.ndarray:
        """Values in NumPy's layout (broadcast to it) -> (points, slice axes...)."""
        values = np.broadcast_to(drop_leading_ones(values, len(self.result_shape)), self.result_shape)
        n = len(self.points_shape)
        values = np.moveaxis(values, range(self._place, self._place + n), range(n)).reshape(self.values_shape)
        if self.slices.reversed:
            values = np.flip(values, axis=[1 + self.slice_axes.index(d) for d in self.slices.reversed])
        return values


def read_points(array: "Array", selection: Points) -> np.ndarray:
    out = np.empty(selection.values_shape, dtype=array.dtype)
    if out.size:
        for batch in _passes(selection.boxes(), array.dtype.itemsize):
            for (_, group, local), box in zip(batch, array.read_many([key for key, _, _ in batch])):
                out[group] = selection.gather(box, local)
    return selection.to_result(out)


def write_points(array: "Array", selection: Points, values: np.ndarray) -> None:
    values = selection.from_result(values)
    if not values.size:
        return
    for key, group, local in selection.boxes():
        box = array[key]
        selection.scatter(box, local, values[group])
        array[key] = box
