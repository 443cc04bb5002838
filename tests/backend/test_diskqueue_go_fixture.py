"""Reading (and re-writing) the data directory Go's nsqd 1.3.0 left behind, byte for byte."""

from __future__ import annotations

import json
import os
import shutil
import struct

import pytest

from nsqtw.backend.metadata import ChannelMetadata, Metadata, TopicMetadata, load_metadata

from dq_helpers import decoded, frame_of_record, open_queue, read_all, run_of

FIXTURE = "go-nsqd-1.3.0-datadir"


@pytest.fixture
def go_dir(fixtures_dir, tmp_path):
    """A writable copy of the fixture's data directory."""
    src = fixtures_dir / FIXTURE / "data"
    dst = tmp_path / "data"
    shutil.copytree(src, dst)
    for p in [dst, *dst.iterdir()]:
        os.chmod(p, 0o755 if p.is_dir() else 0o644)
    return dst


@pytest.fixture
def expected(fixtures_dir):
    return json.loads((fixtures_dir / FIXTURE / "expected-queues.json").read_text())


def go_queue(path, name):
    return open_queue(path, name, max_bytes_per_file=4096, sync_every=1)


def parse_records(data: bytes):
    """The records of a data file, split by hand from the specification."""
    out, pos = [], 0
    while pos < len(data):
        (n,) = struct.unpack_from(">i", data, pos)
        out.append(data[pos + 4:pos + 4 + n])
        pos += 4 + n
    assert pos == len(data)
    return out


QUEUES = ["audit", "metrics", "orders", "orders:billing", "orders:shipping"]


@pytest.mark.parametrize("name", QUEUES)
def test_fixture_queue_yields_expected_messages(go_dir, expected, name):
    """Every queue Go wrote yields exactly the listed messages (id, attempts, body, timestamp), in order."""
    want = expected[name]
    q = go_queue(go_dir, name)
    d, rf, rp, wf, wp = q.positions()
    assert (d, [rf, rp], [wf, wp]) == (want["depth"], want["read"], want["write"])
    assert q.depth() == want["depth"]
    got = decoded(read_all(q, batch=7))
    assert got == [(m["id"].encode(), m["attempts"], m["body"].encode(), m["timestamp_ns"])
                   for m in want["messages"]]
    assert q.depth() == 0


def test_fixture_depths_match_the_readme(go_dir):
    """billing 91, shipping 101, audit 5, metrics 3, orders 0; no file for the ephemeral topic."""
    depths = {n: go_queue(go_dir, n).depth() for n in QUEUES}
    assert depths == {"orders:billing": 91, "orders:shipping": 101, "audit": 5, "metrics": 3, "orders": 0}
    assert not [f for f in os.listdir(go_dir) if "ephemeral" in f]


def test_fixture_billing_read_to_end_deletes_first_file(go_dir):
    """Reading billing past its first file deletes it; the metadata then points into file 1, as Go's would."""
    q = go_queue(go_dir, "orders:billing")
    assert len(read_all(q)) == 91
    q.close()
    names = sorted(f for f in os.listdir(go_dir) if f.startswith("orders:billing"))
    assert names == ["orders:billing.diskqueue.000001.dat", "orders:billing.diskqueue.meta.dat"]
    assert (go_dir / "orders:billing.diskqueue.meta.dat").read_bytes() == b"0\n1,303\n1,303\n"


@pytest.mark.parametrize("name", ["audit", "metrics", "orders:shipping", "orders", "orders:billing"])
def test_rewriting_go_records_gives_go_files(go_dir, tmp_path, name):
    """Putting Go's records again (max-bytes-per-file 4096) produces Go's data files byte for byte."""
    nums = sorted(int(f.split(".")[-2]) for f in os.listdir(go_dir)
                  if f.startswith(name + ".diskqueue.") and f.endswith(".dat") and "meta" not in f)
    originals = [(go_dir / f"{name}.diskqueue.{n:06d}.dat").read_bytes() for n in nums]
    records = [r for data in originals for r in parse_records(data)]
    out = tmp_path / "rewrite"
    out.mkdir()
    q = go_queue(out, name)
    for i in range(0, len(records), 10):
        q.put(run_of([frame_of_record(r) for r in records[i:i + 10]]))
    q.close()
    for n, data in zip(nums, originals, strict=True):
        assert (out / f"{name}.diskqueue.{n:06d}.dat").read_bytes() == data
    go_meta = (go_dir / f"{name}.diskqueue.meta.dat").read_bytes().split(b"\n")
    ours = (out / f"{name}.diskqueue.meta.dat").read_bytes().split(b"\n")
    assert ours[2] == go_meta[2]  # same write file and position


def test_fixture_nsqd_dat(go_dir):
    """nsqd.dat loads to orders (billing, shipping paused), audit, metrics (paused)."""
    md = load_metadata(str(go_dir))
    assert md == Metadata((
        TopicMetadata("metrics", True, ()),
        TopicMetadata("orders", False, (ChannelMetadata("billing", False), ChannelMetadata("shipping", True))),
        TopicMetadata("audit", False, ()),
    ), "1.3.0")
