"""Remote stores: S3 (a real S3 server, moto's, on loopback, checking V4 signatures) and plain HTTP
(a static file server with range requests on loopback), read and written through zfeed.open,
zfeed.create, the loader, xarray and the command line, against the same data on local disk."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import zfeed
import zfeed_cli
from zfeed._range_server import serve_in_thread

boto3 = pytest.importorskip("boto3")
pytest.importorskip("moto.server")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def s3_server():
    """moto's S3 server in its own process, with signatures checked: the first three requests (an
    IAM user, its policy and its key) go unsigned, every later one must be signed by that key."""
    port = _free_port()
    env = {**os.environ, "INITIAL_NO_AUTH_ACTION_COUNT": "3"}
    server = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                              env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    endpoint = f"http://127.0.0.1:{port}"
    try:
        for _ in range(300):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                time.sleep(0.1)
        else:
            pytest.fail("moto's S3 server did not start")
        iam = boto3.client("iam", endpoint_url=endpoint, region_name="us-east-1",
                           aws_access_key_id="setup", aws_secret_access_key="setup")
        iam.create_user(UserName="trainer")
        policy = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "s3:*", "Resource": "*"}]}
        iam.put_user_policy(UserName="trainer", PolicyName="s3", PolicyDocument=json.dumps(policy))
        key = iam.create_access_key(UserName="trainer")["AccessKey"]
        client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1",
                              aws_access_key_id=key["AccessKeyId"], aws_secret_access_key=key["SecretAccessKey"])
        client.create_bucket(Bucket="weather")
        yield {"endpoint": endpoint, "key": key["AccessKeyId"], "secret": key["SecretAccessKey"], "client": client}
    finally:
        server.terminate()
        server.wait(timeout=30)


@pytest.fixture
def s3(s3_server, monkeypatch):
    """The environment a user sets for an S3-compatible store; zfeed reads it when it opens one."""
    for name in ("AWS_NO_SIGN_REQUEST", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL_S3", "AWS_DEFAULT_REGION",
                 "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    # No profile files: a developer's ~/.aws must not sign the "unsigned" requests below.
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent/credentials")
    monkeypatch.setenv("AWS_CONFIG_FILE", "/nonexistent/config")
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_server["endpoint"])
    monkeypatch.setenv("AWS_REGION", "us-east-1")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", s3_server["key"])
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", s3_server["secret"])
    return s3_server


def _objects(client, prefix: str) -> dict[str, bytes]:
    out = {}
    for page in client.get_paginator("list_objects_v2").paginate(Bucket="weather", Prefix=prefix):
        for item in page.get("Contents", []):
            out[item["Key"][len(prefix):]] = client.get_object(Bucket="weather", Key=item["Key"])["Body"].read()
    return out


def _files(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _upload(client, root: Path, prefix: str) -> None:
    for key, value in _files(root).items():
        client.put_object(Bucket="weather", Key=f"{prefix}/{key}", Body=value)


def _write_arrays(target, rng) -> dict[str, np.ndarray]:
    group = zfeed.create_group(target, attributes={"title": "remote"})
    values = {
        "t": rng.standard_normal((6, 20, 30)).astype("float32"),
        "q": rng.integers(-1000, 1000, (7, 11)).astype("int16"),
    }
    group.create_array("t", shape=(6, 20, 30), chunks=(1, 10, 15), shards=(2, 20, 30), dtype="float32",
                       compressor="zstd", dimension_names=["time", "lat", "lon"], data=values["t"])
    group.create_array("q", shape=(7, 11), chunks=(3, 4), dtype="int16", compressor="blosc:lz4", fill_value=-5,
                       data=values["q"])
    return values


def test_s3_writes_the_same_objects_as_local_disk_and_reads_them_back(s3, tmp_path):
    local = tmp_path / "local.zarr"
    values = _write_arrays(local, np.random.default_rng(1))
    _write_arrays("s3://weather/written.zarr", np.random.default_rng(1))
    assert _objects(s3["client"], "written.zarr/") == _files(local)
    remote = zfeed.open("s3://weather/written.zarr")
    assert sorted(name for name, _ in remote.members()) == ["q", "t"]
    assert remote.attrs["title"] == "remote"
    for name, expected in values.items():
        np.testing.assert_array_equal(remote[name][...], expected)
    # An inner chunk of a shard: the shard's index, then that chunk, by range.
    np.testing.assert_array_equal(remote["t"][3, 12:17, 5:9], values["t"][3, 12:17, 5:9])
    # Writes in part, and what a missing chunk reads as.
    remote["q"][0:3, 0:4] = -5
    expected = values["q"].copy()
    expected[0:3, 0:4] = -5
    np.testing.assert_array_equal(zfeed.open("s3://weather/written.zarr/q")[...], expected)


def test_reads_what_zarr_python_wrote_to_s3(s3, tmp_path):
    zarr = pytest.importorskip("zarr")
    rng = np.random.default_rng(2)
    expected = {}
    for fmt in (2, 3):
        root = zarr.open_group(tmp_path / f"v{fmt}.zarr", mode="w", zarr_format=fmt)
        data = rng.standard_normal((9, 16)).astype("float64")
        arr = root.create_array("x", shape=data.shape, chunks=(4, 5), dtype="float64")
        arr[...] = data
        expected[fmt] = data
        _upload(s3["client"], tmp_path / f"v{fmt}.zarr", f"zarr-python/v{fmt}.zarr")
    for fmt, data in expected.items():
        group = zfeed.open(f"s3://weather/zarr-python/v{fmt}.zarr")
        assert group.zarr_format == fmt
        np.testing.assert_array_equal(group["x"][...], data)
        np.testing.assert_array_equal(group["x"][1:8:3, ::4], data[1:8:3, ::4])


def _era5_like(target) -> None:
    root = zfeed.create_group(target)
    rng = np.random.default_rng(3)
    for name, mean in (("t2m", 280.0), ("u500", 5.0), ("z500", 55000.0)):
        values = (mean + rng.standard_normal((12, 8, 16))).astype("float32")
        root.create_array(name, shape=values.shape, chunks=(1, 8, 16), dtype="float32", compressor="zstd",
                          dimension_names=["time", "latitude", "longitude"], data=values,
                          attributes={"zfeed_stats": {"mean": mean, "std": 1.0}})


def test_the_loader_reads_s3_as_it_reads_local_disk(s3, tmp_path):
    local = tmp_path / "era5.zarr"
    _era5_like(local)
    _upload(s3["client"], local, "era5.zarr")
    kwargs = dict(inputs=["t2m", "u500", "z500"], targets=["t2m"], batch_size=4, seed=7, history=2)
    expected = [{k: np.array(v, copy=True) for k, v in batch.items()} for batch in zfeed.Loader(local, **kwargs)]
    loader = zfeed.Loader("s3://weather/era5.zarr", **kwargs)
    got = [{k: np.array(v, copy=True) for k, v in batch.items()} for batch in loader]
    assert len(got) == len(expected) > 0
    for a, b in zip(got, expected):
        assert a.keys() == b.keys()
        for key in a:
            np.testing.assert_array_equal(a[key], b[key])


def test_s3_errors_name_the_key_and_what_was_wrong(s3, tmp_path, monkeypatch):
    _write_arrays("s3://weather/errors.zarr", np.random.default_rng(4))
    # A corrupt chunk.
    s3["client"].put_object(Bucket="weather", Key="errors.zarr/q/c/1/1", Body=b"not blosc at all")
    with pytest.raises(zfeed.ZarrError, match=r"s3://weather/errors\.zarr/q/c/1/1"):
        zfeed.open("s3://weather/errors.zarr/q")[...]
    with pytest.raises(zfeed.ZarrError, match=r"s3://weather/absent\.zarr: no Zarr array or group"):
        zfeed.open("s3://weather/absent.zarr")
    with pytest.raises(zfeed.ZarrError, match=r"s3://no-such-bucket/x\.zarr/zarr\.json: HTTP 404 \(NoSuchBucket"):
        zfeed.open("s3://no-such-bucket/x.zarr")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not the secret")
    with pytest.raises(zfeed.ZarrError, match=r"s3://weather/errors\.zarr/zarr\.json: HTTP 403 \(SignatureDoesNotMatch"):
        zfeed.open("s3://weather/errors.zarr")
    monkeypatch.setenv("AWS_NO_SIGN_REQUEST", "1")
    with pytest.raises(zfeed.ZarrError, match=r"HTTP 403.*unsigned"):
        zfeed.open("s3://weather/errors.zarr")
    monkeypatch.delenv("AWS_NO_SIGN_REQUEST")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    with pytest.raises(zfeed.ZarrError, match="AWS_SECRET_ACCESS_KEY is not"):
        zfeed.open("s3://weather/errors.zarr")


def test_credentials_from_an_aws_profile(s3, tmp_path, monkeypatch):
    """What `aws configure` writes: the keys in ~/.aws/credentials, the region in ~/.aws/config."""
    _write_arrays("s3://weather/profile.zarr", np.random.default_rng(8))
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_REGION"):
        monkeypatch.delenv(name)
    (tmp_path / "credentials").write_text(
        f"[trainer]\naws_access_key_id = {s3['key']}\naws_secret_access_key = {s3['secret']}\n")
    (tmp_path / "config").write_text("[profile trainer]\nregion = us-east-1\n")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "credentials"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "config"))
    with pytest.raises(zfeed.ZarrError, match="unsigned"):
        zfeed.open("s3://weather/profile.zarr")  # the default profile has no keys
    monkeypatch.setenv("AWS_PROFILE", "trainer")
    assert zfeed.open("s3://weather/profile.zarr/q").shape == (7, 11)


def test_the_command_line_reads_and_writes_s3(s3, tmp_path):
    local = tmp_path / "era5.zarr"
    _era5_like(local)
    _upload(s3["client"], local, "cli/era5.zarr")
    info = zfeed_cli.run("info", "s3://weather/cli/era5.zarr").stdout
    assert "s3://weather/cli/era5.zarr" in info and "t2m" in info and "zstd" in info
    # Statistics computed from S3 and written back there as attributes.
    zfeed_cli.run("stats", "s3://weather/cli/era5.zarr", "--variables", "t2m")
    stats = zfeed.open("s3://weather/cli/era5.zarr")["t2m"].attrs["zfeed_stats"]
    np.testing.assert_allclose(stats["mean"], zfeed.open(local)["t2m"][...].astype("float64").mean(), rtol=1e-6)
    # A remote input converts to a local directory; a remote output is refused, not written to
    # a local directory named "s3:".
    zfeed_cli.run("rechunk", "s3://weather/cli/era5.zarr", tmp_path / "rechunked.zarr", "--chunks", "time=4", "-q")
    rechunked = zfeed.open(tmp_path / "rechunked.zarr")
    assert rechunked["t2m"].chunks == (4, 8, 16)
    np.testing.assert_array_equal(rechunked["t2m"][...], zfeed.open(local)["t2m"][...])
    refused = zfeed_cli.run("rechunk", local, "s3://weather/cli/out.zarr", "--chunks", "time=4", ok=False,
                            cwd=tmp_path)
    assert refused.returncode != 0
    assert "the output \"s3://weather/cli/out.zarr\" is not a local directory path" in refused.stderr
    assert not (tmp_path / "s3:").exists()


@pytest.fixture
def http_root(tmp_path):
    """A static file server with range requests (zfeed._range_server), in a thread here."""
    root = tmp_path / "served"
    root.mkdir()
    server, url = serve_in_thread(root)
    try:
        yield root, url
    finally:
        server.shutdown()
        server.server_close()


def test_plain_http_reads_consolidated_stores(http_root):
    """Served by a Python thread of this process: zfeed releases the GIL while it waits."""
    root, url = http_root
    values = _write_arrays(root / "data.zarr", np.random.default_rng(5))
    zfeed.open(root / "data.zarr").consolidate()
    group = zfeed.open(f"{url}/data.zarr")
    assert sorted(name for name, _ in group.members()) == ["q", "t"]
    for name, expected in values.items():
        np.testing.assert_array_equal(group[name][...], expected)
    np.testing.assert_array_equal(zfeed.open(f"{url}/data.zarr/t")[2:5, 3], values["t"][2:5, 3])
    np.testing.assert_array_equal(group["t"][5, 19, 29], values["t"][5, 19, 29])
    with pytest.raises(zfeed.ZarrError, match=r"/data\.zarr/q/c/0/0: a plain HTTP store is read-only"):
        group["q"][0:3, 0:4] = 1
    info = zfeed_cli.run("info", f"{url}/data.zarr").stdout
    assert "blosc" in info and "zstd" in info and "stored size unknown (the store cannot list its keys)" in info
    assert group["t"].info()["stored_bytes"] is None


def test_xarray_opens_http_stores_through_zfeed(http_root):
    xr = pytest.importorskip("xarray")
    root, url = http_root
    ds = xr.Dataset({"t2m": (("time", "lat"), np.arange(12, dtype="float32").reshape(4, 3))},
                    coords={"time": np.arange(4), "lat": [10.0, 20.0, 30.0]})
    ds.to_zarr(root / "xr.zarr", zarr_format=2, consolidated=True)
    remote = xr.open_dataset(f"{url}/xr.zarr", engine="zfeed")
    xr.testing.assert_equal(remote.load(), xr.open_zarr(root / "xr.zarr").load())


def test_an_absent_server_is_a_prompt_error(tmp_path):
    port = _free_port()
    start = time.monotonic()
    with pytest.raises(zfeed.ZarrError, match=rf"http://127\.0\.0\.1:{port}/x\.zarr/zarr\.json: "):
        zfeed.open(f"http://127.0.0.1:{port}/x.zarr")
    assert time.monotonic() - start < 20


def test_stage_makes_one_local_copy_per_node(s3, tmp_path):
    """Two processes of a node stage the same S3 store at once: one copies, the other waits for
    it; the copy holds the same files, and the loader reads it as it reads S3."""
    local = tmp_path / "era5.zarr"
    _era5_like(local)
    _upload(s3["client"], local, "stage/era5.zarr")
    destination = tmp_path / "node-local" / "era5.zarr"
    command = [zfeed_cli.zfeed_command(), "stage", "s3://weather/stage/era5.zarr", str(destination), "-q"]
    processes = [subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                 for _ in range(2)]
    outputs = [p.communicate(timeout=300) for p in processes]
    assert [p.returncode for p in processes] == [0, 0], outputs
    assert sum("already a complete copy" in out for out, _ in outputs) == 1, outputs
    copied = {k: v for k, v in _files(destination).items() if not k.startswith(".zfeed-stage")}
    assert copied == _files(local)
    assert zfeed.stage("s3://weather/stage/era5.zarr", destination, progress=False) == destination
    kwargs = dict(inputs=["t2m", "u500"], targets=["z500"], batch_size=3, seed=11)
    staged = [{k: np.array(v, copy=True) for k, v in b.items()} for b in zfeed.Loader(destination, **kwargs)]
    remote = [{k: np.array(v, copy=True) for k, v in b.items()} for b in zfeed.Loader("s3://weather/stage/era5.zarr", **kwargs)]
    assert len(staged) == len(remote) > 0
    for a, b in zip(staged, remote):
        for key in a:
            np.testing.assert_array_equal(a[key], b[key])


def test_stage_copies_a_plain_http_store_from_its_metadata(http_root, tmp_path, capfd):
    root, url = http_root
    values = _write_arrays(root / "data.zarr", np.random.default_rng(6))
    zfeed.open(root / "data.zarr").consolidate()
    path = zfeed.stage(f"{url}/data.zarr", tmp_path / "copy.zarr")
    assert "stage: " in capfd.readouterr().err
    copy = zfeed.open(path)
    for name, expected in values.items():
        np.testing.assert_array_equal(copy[name][...], expected)
    result = zfeed_cli.run("stage", f"{url}/data.zarr", tmp_path / "copy.zarr")
    assert "already a complete copy" in result.stdout


def test_dataloader_workers_read_s3_after_the_parent_did(s3, tmp_path):
    """DataLoader workers forked from a process that already read the store (its I/O threads
    started, its connections kept) read through connections of their own, and split the epoch."""
    torch = pytest.importorskip("torch")
    from zfeed.torch import ZarrIterableDataset

    local = tmp_path / "era5.zarr"
    _era5_like(local)
    _upload(s3["client"], local, "workers/era5.zarr")
    url = "s3://weather/workers/era5.zarr"
    zfeed.open(url)["t2m"].read_many([np.s_[t] for t in range(12)])  # the parent's threads and connections
    dataset = ZarrIterableDataset(url, inputs=["t2m", "u500"], targets=["t2m"], batch_size=2, seed=3,
                                  drop_last=False)
    seen = {}
    for batch in torch.utils.data.DataLoader(dataset, batch_size=None, num_workers=2,
                                             multiprocessing_context="fork"):
        for i, t in enumerate(batch["times"].tolist()):
            seen[t] = batch["inputs"][i].numpy().copy()
    assert sorted(seen) == list(range(11))
    data = zfeed.open(local)
    for t, inputs in seen.items():
        np.testing.assert_array_equal(inputs[0], data["t2m"][t] - 280.0)


def _batches(loader) -> list[dict]:
    return [{k: np.array(v, copy=True) for k, v in batch.items()} for batch in loader]


def test_each_node_stages_its_own_block_of_samples(s3, tmp_path):
    """Two nodes of two ranks read an S3 store with partition="node": each node copies only the
    time steps of its block of samples to its own disk (its first rank copies, the second finds
    the copy), the batches equal those read from S3 itself, and every rank has as many."""
    local = tmp_path / "era5.zarr"
    _era5_like(local)
    _upload(s3["client"], local, "nodes/era5.zarr")
    url = "s3://weather/nodes/era5.zarr"
    kwargs = dict(inputs=["t2m", "u500"], targets=["z500"], batch_size=2, seed=5, world_size=4,
                  local_world_size=2, partition="node", drop_last=False)
    counts, times_by_node = set(), {0: set(), 1: set()}
    for rank in range(4):
        node = rank // 2
        staged = zfeed.Loader(url, rank=rank, stage=tmp_path / f"node{node}" / "era5.zarr",
                              stage_progress=False, **kwargs)
        direct = zfeed.Loader(url, rank=rank, **kwargs)
        # 11 samples (t + 1 < 12), 5 per node: node 0 reads steps [0, 6), node 1 [5, 11).
        assert staged.time_span == direct.time_span == (5 * node, 5 * node + 6)
        assert staged.staged["time_range"] == [5 * node, 5 * node + 6]
        assert staged.staged["already_complete"] == (rank % 2 == 1)
        got, want = _batches(staged), _batches(direct)
        assert len(got) == len(want) > 0
        for a, b in zip(got, want):
            for key in a:
                np.testing.assert_array_equal(a[key], b[key])
        counts.add(len(got))
        times_by_node[node].update(int(t) for batch in got for t in batch["times"])
    assert len(counts) == 1
    assert times_by_node == {0: set(range(0, 5)), 1: set(range(5, 10))}
    held = {k for k in _files(tmp_path / "node1" / "era5.zarr") if k.startswith("t2m/c/")}
    assert held == {f"t2m/c/{t}/0/0" for t in range(5, 11)}
    # Read by path, the copy refuses the steps it does not hold rather than read them as fill.
    with pytest.raises(zfeed.ZarrError, match=r"t2m/c/0/0/0: time chunk 0 \(time step 0\) is not in "
                                              r"this partial staged copy of s3://weather/nodes/era5\.zarr"):
        zfeed.open(tmp_path / "node1" / "era5.zarr")["t2m"][0]


def test_a_loader_stages_in_the_background_while_it_serves_batches(s3, tmp_path, capfd):
    """stage_in_background: batches at once (read from S3 and from what the copy holds), equal to
    S3's; once the copy is done, the next epoch reads it alone, and it is a complete copy."""
    local = tmp_path / "era5.zarr"
    _era5_like(local)
    _upload(s3["client"], local, "background/era5.zarr")
    url = "s3://weather/background/era5.zarr"
    destination = tmp_path / "node-local" / "era5.zarr"
    kwargs = dict(inputs=["t2m", "u500"], targets=["z500"], batch_size=2, seed=5)
    staging = zfeed.Loader(url, stage=destination, stage_in_background=True, **kwargs)
    direct = zfeed.Loader(url, **kwargs)
    first = _batches(staging)
    assert first and all(np.array_equal(a[k], b[k]) for a, b in zip(first, _batches(direct)) for k in a)
    deadline = time.monotonic() + 60
    while staging.staged["running"] and time.monotonic() < deadline:
        time.sleep(0.05)
    done = staging.staged
    assert done["running"] is False and done["copied"] > 0, done
    second = _batches(staging)  # the copy alone
    assert all(np.array_equal(a[k], b[k]) for a, b in zip(second, _batches(direct)) for k in a)
    assert {k: v for k, v in _files(destination).items() if not k.startswith(".zfeed-stage")} == _files(local)
    assert f"stage {destination}: " in capfd.readouterr().err
    again = zfeed.Loader(url, stage=destination, stage_in_background=True, **kwargs)
    assert again.staged["already_complete"] is True


def test_a_background_copy_that_fails_leaves_the_loader_reading_the_source(tmp_path, capfd):
    """A copy in the background that cannot write (here a file stands where the copy's t2m
    directory goes, as a full disk would fail it) warns, says why in ``staged``, and the loader
    serves every batch from the source."""
    import json

    local = tmp_path / "era5.zarr"
    _era5_like(local)
    destination = tmp_path / "node-local"
    destination.mkdir()
    (destination / ".zfeed-stage.json").write_text(
        json.dumps({"source": f"file://{local}", "complete": False}))
    (destination / "t2m").write_text("in the way")
    kwargs = dict(inputs=["t2m", "u500"], targets=["z500"], batch_size=2, seed=5)
    staging = zfeed.Loader(local, stage=destination, stage_in_background=True, stage_progress=False,
                           **kwargs)
    direct = zfeed.Loader(local, **kwargs)
    for _ in range(2):  # the epoch in which the copy fails, and the next
        got, want = _batches(staging), _batches(direct)
        assert len(got) == len(want) > 0
        assert all(np.array_equal(a[k], b[k]) for a, b in zip(got, want) for k in a)
    failed = staging.staged
    assert failed["running"] is False and "in the background failed" in failed["failed"], failed
    assert "reading from the source instead" in failed["failed"]
    assert "zfeed: warning: loader: staging" in capfd.readouterr().err


def test_ctrl_c_stops_a_stage_waiting_for_another_process(tmp_path):
    """zfeed.stage waits while another process of the node holds the copy's lock; Ctrl-C (SIGINT)
    ends that wait with KeyboardInterrupt, as it would a copy under way."""
    import fcntl
    import signal

    source = tmp_path / "era5.zarr"
    _era5_like(source)
    destination = tmp_path / "copy.zarr"
    destination.mkdir()
    with open(destination / ".zfeed-stage.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        script = ("import sys, zfeed\nprint('staging', flush=True)\n"
                  f"zfeed.stage({str(source)!r}, {str(destination)!r}, progress=False)\n")
        process = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE, text=True)
        assert process.stdout.readline() == "staging\n"
        time.sleep(1.0)
        assert process.poll() is None  # still waiting for the lock
        process.send_signal(signal.SIGINT)
        _, err = process.communicate(timeout=30)
    assert process.returncode != 0
    assert "KeyboardInterrupt" in err, err


def test_ctrl_c_ends_a_wait_for_a_batch_from_a_stalled_server(tmp_path):
    """A loader whose server stopped answering: Ctrl-C (SIGINT) raises KeyboardInterrupt within
    a moment, not when the stalled read gives up (30 s, then retries), and the batch is still due:
    iterating again once the server answers yields it. A loader dropped while its reads stall
    ends them."""
    import signal

    source = tmp_path / "era5.zarr"
    _era5_like(source)
    script = f"""
import threading, time
from functools import partial
from http.server import ThreadingHTTPServer
import numpy as np, zfeed
from zfeed._range_server import RangeHandler

answering = threading.Event()
answering.set()

class Stalling(RangeHandler):
    def send_head(self):
        answering.wait()
        return super().send_head()

server = ThreadingHTTPServer(("127.0.0.1", 0), partial(Stalling, directory={str(tmp_path)!r}))
server.daemon_threads = True
threading.Thread(target=server.serve_forever, daemon=True).start()
kwargs = dict(inputs=["t2m", "u500"], targets=["z500"], batch_size=2, shuffle=False)
loader = zfeed.Loader(f"http://127.0.0.1:{{server.server_address[1]}}/era5.zarr", **kwargs)
answering.clear()
print("waiting", flush=True)
start = time.monotonic()
try:
    next(iter(loader))
    print("no interrupt", flush=True)
except KeyboardInterrupt:
    print(f"interrupted after {{time.monotonic() - start:.1f}} s", flush=True)
answering.set()
got = next(iter(loader))
want = next(iter(zfeed.Loader({str(source)!r}, **kwargs)))
assert all(np.array_equal(got[k], want[k]) for k in want), "another batch"
print("resumed", flush=True)
answering.clear()  # the loader reads ahead: those reads stall now
time.sleep(0.5)
start = time.monotonic()
del loader, got
print(f"dropped after {{time.monotonic() - start:.1f}} s", flush=True)
# Not Python's exit: it freezes the server's daemon threads while the loader still reads ahead.
import os
os._exit(0)
"""
    process = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True)
    assert process.stdout.readline() == "waiting\n"
    time.sleep(1.0)
    process.send_signal(signal.SIGINT)
    out, err = process.communicate(timeout=60)
    assert process.returncode == 0, err
    lines = out.splitlines()
    assert lines[0].startswith("interrupted after "), out
    assert float(lines[0].split()[2]) < 10, out  # at once, not after the stalled read's 30 s
    assert lines[1] == "resumed", out
    assert lines[2].startswith("dropped after ") and float(lines[2].split()[2]) < 10, out  # reads ended


def test_stage_a_time_range_from_the_command_line(s3, tmp_path):
    local = tmp_path / "era5.zarr"
    _era5_like(local)
    _upload(s3["client"], local, "range/era5.zarr")
    destination = tmp_path / "part.zarr"
    result = zfeed_cli.run("stage", "s3://weather/range/era5.zarr", destination, "--time", "3:7", "-q")
    assert "(time steps [3, 7) of the arrays along it)" in result.stdout
    info = zfeed_cli.run("info", destination).stdout
    assert "staged copy of s3://weather/range/era5.zarr, time steps [3, 7) only" in info
    copy = zfeed.open(destination)
    np.testing.assert_array_equal(copy["u500"][3:7], zfeed.open(local)["u500"][3:7])
    # A loader on the copy keeps to its steps: samples t = 3 to 5 (t + 1 < 7).
    loader = zfeed.Loader(destination, inputs=["t2m"], targets=["t2m"], batch_size=1, drop_last=False)
    assert loader.time_span == (3, 7)
    assert sorted(int(b["times"][0]) for b in loader) == [3, 4, 5]
    with pytest.raises(zfeed.ZarrError, match=r"reaches past what the partial staged copy"):
        zfeed.Loader(destination, inputs=["t2m"], targets=["t2m"], time_range=(0, 7))
    other = zfeed_cli.run("stage", "s3://weather/range/era5.zarr", destination, "--time", "0:4", ok=False)
    assert other.returncode != 0
    assert "holds time steps [3, 7) of the source only, not time steps [0, 4)" in other.stderr
    bad = zfeed_cli.run("stage", "s3://weather/range/era5.zarr", tmp_path / "x", "--time", "3-7", ok=False)
    assert bad.returncode != 0 and "--time takes START:STOP" in bad.stderr


def test_the_node_layout_comes_from_torchrun_or_slurm(monkeypatch):
    for name in ("LOCAL_WORLD_SIZE", "SLURM_NNODES"):
        monkeypatch.delenv(name, raising=False)
    assert zfeed.node_layout(0, 1) == (0, 1, 0, 1)
    with pytest.raises(zfeed.ZarrError, match="processes per node for rank 3 of 8"):
        zfeed.node_layout(3, 8)
    assert zfeed.node_layout(5, 8, local_world_size=4) == (1, 2, 1, 4)
    monkeypatch.setenv("SLURM_NNODES", "4")
    assert zfeed.node_layout(5, 8) == (2, 4, 1, 2)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "8")
    assert zfeed.node_layout(5, 8) == (0, 1, 5, 8)
    with pytest.raises(zfeed.ZarrError, match="8 processes do not make nodes of local_world_size 3"):
        zfeed.node_layout(5, 8, local_world_size=3)
    with pytest.raises(zfeed.ZarrError, match="partition must be 'global' or 'node'"):
        zfeed.Loader("unused.zarr", inputs=["t2m"], partition="rack")
