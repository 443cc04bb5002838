"""The replication proof (issues 26 and 44): two replicated nsqd processes (a secret file, node
ids 1 and 2), a publisher (plain protocol V2, or a stock client library in its own process:
nsqtw's Producer, pynsq's Writer, go-nsq's Producer where Go and go-nsq's module are to be had),
SIGKILL of the origin and deletion of its data directory, 20 times with nsqtw's Producer and 10
with each other publisher (what those add is their client, not more kills): every publish that
got OK is delivered by the origin's consumer before the crash or by the survivor after it (duplicates
counted, not failed).  The same run without replication loses messages, which shows the check
can fail.  The other faults, a few cycles each: the origin SIGSTOPped for good (a hung host), a
silent partition of the link (a blackhole proxy) healed before the origin is killed, and the
peer's disk full when it adopts (a tmpfs: root only).  The code is bench/replication_proof.py's."""

from __future__ import annotations

import importlib.util
import random
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _proof():
    spec = importlib.util.spec_from_file_location("replication_proof", ROOT / "bench" / "replication_proof.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _client(name: str) -> str:
    if name == "pynsq":
        pytest.importorskip("nsq", reason="pynsq is not installed (make test installs it)")
    if name == "go-nsq":
        binary, why = _proof().go_publisher()
        if binary is None:
            pytest.skip(why)
    return name


CLIENTS = ["raw", "nsqtw", "pynsq", "go-nsq"]
#: kill cycles per publisher (others: 10)
KILL_CYCLES = {"nsqtw": 20}


@pytest.mark.slow
@pytest.mark.e2e
@pytest.mark.parametrize("client", CLIENTS)
def test_losing_the_origin_loses_no_acknowledged_message(tmp_path, record_property, client):
    client = _client(client)
    proof = _proof()
    rng = random.Random(20261126)
    seq = [0]
    totals = {"acknowledged": 0, "lost": 0, "duplicates": 0, "delivered_by_survivor": 0}
    cycles = KILL_CYCLES.get(client, 10)
    for i in range(cycles):
        row = proof.cycle(str(tmp_path), rng, True, seq, client)
        print(f"cycle {i + 1}: {proof.show(row)}")
        assert row["lost"] == 0, row
        for k in totals:
            totals[k] += row[k]
    for k, v in totals.items():
        record_property(k, v)
    print(f"\n{cycles} cycles replicated, {client} publisher: {totals}")
    assert totals["acknowledged"] > 0 and totals["delivered_by_survivor"] > 0


@pytest.mark.slow
@pytest.mark.e2e
@pytest.mark.parametrize("client", CLIENTS)
def test_without_replication_the_same_run_loses_messages(tmp_path, client):
    client = _client(client)
    proof = _proof()
    row = proof.cycle(str(tmp_path), random.Random(1), False, [0], client)
    print(f"\nwithout replication: {row}")
    assert row["lost"] > 0 and row["delivered_by_survivor"] == 0


#: the faults other than kill, and their cycles (each cycle takes 5 to 15 s)
FAULT_CYCLES = {"pause": 5, "partition": 5, "disk": 4}


@pytest.mark.slow
@pytest.mark.e2e
@pytest.mark.parametrize("fault", list(FAULT_CYCLES))
def test_a_silent_or_degraded_fault_loses_no_acknowledged_message(tmp_path, record_property, fault):
    proof = _proof()
    if fault == "disk":
        why = proof.disk_fault_unavailable()
        if why is not None:
            pytest.skip(why)
    rng = random.Random(20261128)
    seq = [0]
    totals = {"acknowledged": 0, "lost": 0, "duplicates": 0, "delivered_by_survivor": 0}
    for i in range(FAULT_CYCLES[fault]):
        row = proof.cycle(str(tmp_path), rng, True, seq, "raw", fault)
        print(f"{fault} cycle {i + 1}: {proof.show(row)}")
        assert row["lost"] == 0, row
        assert row["adopt_seconds"] >= 0, row  # the peer adopted the origin (not within a bound: no wall clock here)
        if fault == "partition":
            assert row["partition_seen_by_origin"] == 1, row  # the blackhole was noticed, not slept through
        if fault == "disk":
            assert row["adoption_failing_seen"] == 1, row  # the adoption did hit the full disk
        for k in totals:
            totals[k] += row[k]
    for k, v in totals.items():
        record_property(k, v)
    print(f"\n{FAULT_CYCLES[fault]} cycles of {fault}: {totals}")
    assert totals["acknowledged"] > 0 and totals["delivered_by_survivor"] > 0


def test_the_go_publisher_says_why_it_cannot_be_built(tmp_path, monkeypatch):
    """Where go-nsq's publisher cannot be had, the reason names what is missing (the go-nsq
    case above skips with it), and a publisher named by NSQTW_GO_PUBLISHER is used as it is."""
    proof = _proof()
    monkeypatch.setenv("NSQTW_GO_PUBLISHER", str(tmp_path / "absent"))
    assert proof.go_publisher() == (None, f"NSQTW_GO_PUBLISHER={tmp_path / 'absent'} is not an executable")
    built = tmp_path / "proofpublisher"
    built.write_text("#!/bin/sh\n")
    built.chmod(0o755)
    monkeypatch.setenv("NSQTW_GO_PUBLISHER", str(built))
    assert proof.go_publisher() == (str(built), "")
    monkeypatch.delenv("NSQTW_GO_PUBLISHER")
    monkeypatch.setenv("PATH", str(tmp_path))  # no go here
    binary, why = proof.go_publisher()
    assert binary is None and why.startswith("Go is not installed")
