"""Integer-array and boolean-mask selections: ``arr[...]`` with NumPy's meaning, ``arr.oindex`` and
``arr.vindex`` with zarr-python's, reads and writes, on v3, sharded v3 and v2 arrays; only the
chunks that hold selected elements are read."""

from __future__ import annotations

import numpy as np
import pytest

import zfeed

zarr = pytest.importorskip("zarr")

SHAPE = (9, 11, 7)


@pytest.fixture
def data(seed):
    rng = np.random.default_rng(seed)
    return rng.integers(-1000, 1000, size=SHAPE).astype("int32")


@pytest.fixture(params=["v3", "v3-sharded", "v2"])
def stored(request, tmp_path, data):
    """The same values in a v3 array, a sharded v3 array and a v2 array, with edge chunks."""
    path = tmp_path / "a.zarr"
    if request.param == "v3":
        arr = zfeed.create(path, shape=SHAPE, chunks=(4, 3, 5), dtype="int32", compressor="zstd")
    elif request.param == "v3-sharded":
        arr = zfeed.create(path, shape=SHAPE, chunks=(2, 3, 2), shards=(4, 6, 4), dtype="int32")
    else:
        arr = zfeed.create(path, shape=SHAPE, chunks=(4, 3, 5), dtype="int32", zarr_format=2, compressor="blosc:lz4")
    arr[...] = data
    return path, data


MASK = np.zeros(SHAPE, dtype=bool)
MASK[1, 2, 3] = MASK[8, 10, 6] = MASK[4, 0, 0] = True

KEYS = [
    np.s_[[1, 2]],
    np.s_[[8, 0, 0, 3]],  # unsorted, repeated
    np.s_[[-1, -9]],
    np.s_[np.array([[1, 2], [3, 4]])],  # an index array's shape replaces its axis
    np.s_[:, [0, 10, 5]],
    np.s_[..., [6, 0]],
    np.s_[2, :, [0, 1]],  # an integer and an array apart: NumPy puts the array's axis first
    np.s_[:, [0, 6], 2],
    np.s_[:, [0, 6], ..., 2],  # an ellipsis of no axis sets them apart: the array's axis goes first
    np.s_[[1, 2], ..., [3, 4], 0],  # points set apart the same way
    np.s_[:, [0, 2], ..., [1, 3]],  # two arrays set apart: the points' axis goes first
    np.s_[[0, 1], 2],
    np.s_[::-2, [4, 0], 1:6:2],
    np.s_[np.array([True, False] * 4 + [True])],
    np.s_[:, np.arange(11) % 3 == 0],
    np.s_[[1, 2], [3, 4], [0, 6]],  # points
    np.s_[[[1], [2]], [3, 4], 0],  # points, broadcast to (2, 2)
    np.s_[[1, 2], :, [0, 1]],  # points apart: their axis goes first
    np.s_[:, [1, 2], [3, 4]],  # points side by side: in place
    np.s_[[7, 7, 0], ::-3, [6, 6, 1]],
    np.s_[MASK],
    np.s_[MASK[:, :, 0]],  # a mask over the first two axes
    np.s_[[]],
    np.s_[:, np.array([], dtype=np.int64)],
    np.s_[[], []],
    np.s_[np.array(3)],  # a 0-d array is an integer
    np.s_[3, 4, [1]],
]


@pytest.mark.parametrize("key", KEYS, ids=[repr(k)[:60] for k in KEYS])
def test_getitem_with_arrays_matches_numpy(stored, key):
    path, data = stored
    got = zfeed.open(path)[key]
    want = data[key]
    assert isinstance(got, np.ndarray) and got.dtype == want.dtype
    assert got.shape == want.shape
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("key", KEYS, ids=[repr(k)[:60] for k in KEYS])
def test_setitem_with_arrays_matches_numpy(stored, key, seed):
    path, data = stored
    rng = np.random.default_rng(seed)
    expected = data.copy()
    values = rng.integers(0, 100, expected[key].shape).astype("int32")
    if _has_repeats(key):
        values[...] = 55  # NumPy leaves which of a repeated index's values wins unspecified
    expected[key] = values
    arr = zfeed.open(path)
    arr[key] = values
    np.testing.assert_array_equal(zfeed.open(path)[...], expected)
    np.testing.assert_array_equal(np.asarray(zarr.open_array(str(path), mode="r")[...]), expected)


def _random_numpy_key(rng):
    """Any mix NumPy takes or refuses: integers, slices, integer arrays (of 0 to 2 dimensions, some
    out of bounds), boolean masks (some of the wrong length), an ellipsis."""
    key = []
    for n in SHAPE[: int(rng.integers(1, 4))]:
        kind = rng.integers(6)
        if kind == 0:
            key.append(int(rng.integers(-n - 1, n + 1)))
        elif kind == 1:
            start, stop = (int(v) for v in rng.integers(-n - 2, n + 3, 2))
            key.append(slice(start, stop, int(rng.choice([1, 2, -1, -3]))))
        elif kind in (2, 3):
            shape = [(), (int(rng.integers(0, 4)),), (2, int(rng.integers(1, 3)))][int(rng.integers(3))]
            key.append(rng.integers(-n, n + (1 if rng.random() < 0.1 else 0), shape))
        elif kind == 4:
            key.append(rng.random(n + (1 if rng.random() < 0.1 else 0)) < 0.5)
        else:
            key.append(Ellipsis)
    return tuple(key)


def test_random_keys_behave_as_numpy(stored, seed):
    """Whatever NumPy makes of a key, zfeed makes the same; where NumPy refuses it, so does zfeed
    (an IndexError)."""
    path, data = stored
    arr = zfeed.open(path)
    rng = np.random.default_rng(seed)
    for _ in range(300):
        key = _random_numpy_key(rng)
        try:
            want = data[key]
        except IndexError:
            with pytest.raises(IndexError):
                arr[key]
            continue
        got = arr[key]
        assert np.shape(got) == np.shape(want), key
        np.testing.assert_array_equal(got, want, err_msg=repr(key))


def test_random_key_writes_equal_numpys(stored, seed):
    path, data = stored
    arr = zfeed.open(path)
    expected = data.copy()
    rng = np.random.default_rng(seed)
    for _ in range(60):
        key = _random_numpy_key(rng)
        try:
            shape = expected[key].shape
        except IndexError:
            continue
        values = rng.integers(0, 100, shape).astype("int32")
        if _has_repeats(key):
            values[...] = 55  # NumPy leaves which of a repeated index's values wins unspecified
        expected[key] = values
        arr[key] = values
    np.testing.assert_array_equal(arr[...], expected)
    np.testing.assert_array_equal(np.asarray(zarr.open_array(str(path), mode="r")[...]), expected)


def _has_repeats(key):
    counts = np.zeros(SHAPE, dtype=np.int64)
    np.add.at(counts, key, 1)
    return bool((counts > 1).any())


def _orthogonal_reference(data, key):
    """oindex by NumPy: each axis's indices on its own (np.ix_), integer axes dropped."""
    key = key if isinstance(key, tuple) else (key,)
    key = key + (slice(None),) * (data.ndim - len(key))
    lists, dropped = [], []
    for d, (k, n) in enumerate(zip(key, data.shape)):
        if isinstance(k, (int, np.integer)):
            lists.append([k])
            dropped.append(d)
        elif isinstance(k, slice):
            lists.append(np.arange(n)[k])
        else:
            k = np.asarray(k)
            lists.append(np.flatnonzero(k) if k.dtype == bool else k)
    out = data[np.ix_(*lists)]
    return out.reshape([c for d, c in enumerate(out.shape) if d not in dropped])


def _random_orthogonal_key(rng):
    key = []
    for n in SHAPE:
        kind = rng.integers(5)
        if kind == 0:
            key.append(int(rng.integers(-n, n)))
        elif kind == 1:
            start, stop = sorted(rng.integers(-n, n + 1, 2))
            key.append(slice(int(start), int(stop), int(rng.choice([1, 2, 3, -1, -2]))))
        elif kind == 2:
            key.append(rng.integers(-n, n, int(rng.integers(0, 6))))  # unsorted, repeats, negatives
        elif kind == 3:
            key.append(rng.random(n) < 0.4)
        else:
            key.append(np.sort(rng.choice(n, int(rng.integers(1, n + 1)), replace=False)))
    return tuple(key)


def test_oindex_matches_numpy_orthogonally(stored, seed):
    path, data = stored
    arr = zfeed.open(path)
    rng = np.random.default_rng(seed)
    for _ in range(60):
        key = _random_orthogonal_key(rng)
        want = _orthogonal_reference(data, key)
        got = arr.oindex[key]
        assert np.shape(got) == want.shape, key
        np.testing.assert_array_equal(got, want, err_msg=repr(key))
    # zarr-python agrees on the same selections.
    za = zarr.open_array(str(path), mode="r")
    for _ in range(10):
        key = _random_orthogonal_key(rng)
        # zarr-python takes positive steps only.
        key = tuple(slice(k.start, k.stop, abs(k.step)) if isinstance(k, slice) else k for k in key)
        np.testing.assert_array_equal(arr.oindex[key], za.oindex[key], err_msg=repr(key))


def test_oindex_writes(stored, seed):
    path, data = stored
    arr = zfeed.open(path)
    rng = np.random.default_rng(seed)
    expected = data.copy()
    for _ in range(20):
        key = _random_orthogonal_key(rng)
        # Distinct indices per axis: the write's result is then defined.
        key = tuple(np.unique(np.asarray(k) % n) if isinstance(k, np.ndarray) and k.dtype != bool else k
                    for k, n in zip(key, SHAPE))
        shape = _orthogonal_reference(expected, key).shape
        values = rng.integers(0, 100, shape).astype("int32")
        arr.oindex[key] = values
        lists = [np.atleast_1d(np.arange(n)[k]) if not isinstance(k, np.ndarray) else
                 (np.flatnonzero(k) if k.dtype == bool else k) for k, n in zip(key, SHAPE)]
        expected[np.ix_(*lists)] = values.reshape([len(x) for x in lists])
        np.testing.assert_array_equal(arr[...], expected, err_msg=repr(key))
    arr.oindex[[0, 0], 0, 0] = np.array([1, 2], dtype="int32")  # a repeated index: the last value wins
    assert arr[0, 0, 0] == 2
    np.testing.assert_array_equal(np.asarray(zarr.open_array(str(path), mode="r")[...]), arr[...])


def test_vindex_matches_numpy_and_zarr(stored, seed):
    path, data = stored
    arr = zfeed.open(path)
    za = zarr.open_array(str(path), mode="r")
    rng = np.random.default_rng(seed)
    for _ in range(20):
        count = int(rng.integers(0, 30))
        key = tuple(rng.integers(-n, n, count) for n in SHAPE)
        np.testing.assert_array_equal(arr.vindex[key], data[key])
        np.testing.assert_array_equal(arr.vindex[key], za.vindex[key])
    mask = rng.random(SHAPE) < 0.1
    np.testing.assert_array_equal(arr.vindex[mask], data[mask])
    expected = data.copy()
    key = (np.array([0, 8, 4]), np.array([10, 0, 5]), np.array([6, 0, 3]))
    arr.vindex[key] = [-1, -2, -3]
    expected[key] = [-1, -2, -3]
    arr.vindex[mask] = 9
    expected[mask] = 9
    np.testing.assert_array_equal(arr[...], expected)


def test_reads_only_the_chunks_holding_selected_elements(tmp_path):
    """Every chunk without a selected element is made unreadable: the selections still read, and
    a read that needs one names its key."""
    path = tmp_path / "t.zarr"
    arr = zfeed.create(path, shape=(12, 8), chunks=(1, 8), dtype="float32", compressor="zstd")
    data = np.arange(96, dtype="float32").reshape(12, 8)
    arr[...] = data
    selected_rows = [9, 2, 2, 5]
    for row in range(12):
        if row not in selected_rows:
            (path / "c" / str(row) / "0").write_bytes(b"not a zstd frame")
    arr = zfeed.open(path)
    np.testing.assert_array_equal(arr[selected_rows], data[selected_rows])
    np.testing.assert_array_equal(arr.oindex[selected_rows, [7, 0]], data[np.ix_(selected_rows, [7, 0])])
    np.testing.assert_array_equal(arr.vindex[[9, 2, 5], [1, 2, 3]], data[[9, 2, 5], [1, 2, 3]])
    np.testing.assert_array_equal(arr[np.isin(np.arange(12), selected_rows)], data[[2, 5, 9]])
    with pytest.raises(zfeed.ZarrError, match="c/3/0"):
        arr[[2, 3]]


def test_read_into_a_buffer_with_an_index_array(stored):
    path, data = stored
    arr = zfeed.open(path)
    for key in [np.s_[[8, 0, 0, 3]], np.s_[:, [10, 2]], np.s_[1, np.arange(11) % 4 == 1, 2:6],
                np.s_[[4], 5], np.s_[:, :, []]]:
        want = data[key]
        out = np.full(want.shape, -1, dtype=data.dtype)
        assert arr.read(key, out=out) is out
        np.testing.assert_array_equal(out, want)
    with pytest.raises(IndexError, match="one index array"):
        arr.read(np.s_[[1, 2], [3, 4]], out=np.empty(2, data.dtype))
    with pytest.raises(IndexError, match="move its axis first"):
        arr.read(np.s_[1, :, [0, 1]], out=np.empty((2, 11), data.dtype))
    with pytest.raises(ValueError, match="negative steps"):
        arr.read(np.s_[::-1, [0]], out=np.empty((9, 1, 7), data.dtype))
    with pytest.raises(ValueError, match="out has shape"):
        arr.read(np.s_[[0, 1]], out=np.empty((3, 11, 7), data.dtype))


def test_zero_dimensional_arrays(tmp_path):
    arr = zfeed.create(tmp_path / "s.zarr", shape=(), dtype="float64")
    arr[...] = 2.5
    assert arr.oindex[()] == 2.5 and arr.oindex[...] == 2.5 and arr.vindex[()] == 2.5
    arr.oindex[()] = 4.0
    assert arr[()] == 4.0


def test_bad_array_indices_are_clear_errors(tmp_path):
    arr = zfeed.create(tmp_path / "e.zarr", shape=(4, 5), chunks=(2, 2), dtype="int8")
    cases = [
        (np.s_[[4]], "index 4 is out of bounds for axis 0 with size 4"),
        (np.s_[:, [-6]], "index -6 is out of bounds for axis 1 with size 5"),
        (np.s_[[1.5]], "integer or boolean type; axis 0 has float64"),
        (np.s_[np.array([True, False])], r"boolean index of shape \(2,\) does not match axis 0"),
        (np.s_[np.ones((4, 4), bool)], r"boolean index of shape \(4, 4\) does not match axes 0 to 1"),
        (np.s_[[1, 2], [1, 2, 3]], r"index arrays of shapes \(2,\) \(3,\) do not broadcast"),
        (np.s_[[0], None], "np.newaxis"),
    ]
    for key, message in cases:
        with pytest.raises(IndexError, match=message):
            arr[key]
    with pytest.raises(IndexError, match="1-D index arrays"):
        arr.oindex[np.array([[0, 1]])]
    with pytest.raises(IndexError, match="read_many take integers, slices"):
        arr.read_many([np.s_[[0, 1]]])
    with pytest.raises(ValueError):
        arr[[0, 1]] = np.zeros(3, "int8")  # does not broadcast to (2, 5)
