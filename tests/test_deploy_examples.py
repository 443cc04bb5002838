"""The deployment files the production guide ships (examples/systemd, examples/container) and the
guide's commands: every flag they pass is one nsqtw has (a renamed flag fails here), the units pass
``systemd-analyze verify``, and the stop timeouts cover the drain."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from nsqtw.admin.options import AdminOptions
from nsqtw.lookupd.options import LookupdOptions
from nsqtw.options import NsqdOptions, nsq_default, option_fields, parse_duration
from nsqtw.runtime.flags import options_from_argv

ROOT = Path(__file__).resolve().parent.parent
SYSTEMD = ROOT / "examples" / "systemd"
DOCKERFILE = ROOT / "examples" / "container" / "Dockerfile"
GUIDE = ROOT / "docs" / "guide" / "production.rst"
UNITS = ("nsqd.service", "nsqlookupd.service", "nsqadmin.service")
OPTIONS = {"nsqd": NsqdOptions, "nsqlookupd": LookupdOptions, "nsqadmin": AdminOptions}

#: flags the guide documents for work that lands beside this one (drain, etcd): checked for their
#: value's syntax and otherwise left out of the parse while the options do not have them yet; once
#: they do, they are parsed like any other flag (and a rename of theirs fails like any other)


def _known(cls: type) -> set[str]:
    return {f.metadata["flag"] for f in option_fields(cls)}


def parse(daemon: str, argv: list[str]) -> Any:
    """``argv`` through the daemon's own flag parser (Go's syntax, ``--config`` files, validation)."""
    return options_from_argv(OPTIONS[daemon], list(argv))


def unit(name: str) -> dict[str, list[str]]:
    """A unit file's ``Key=value`` lines (every section), values in order."""
    out: dict[str, list[str]] = {}
    for line in (SYSTEMD / name).read_text().splitlines():
        if line and not line.startswith(("#", ";", "[")):
            key, _, value = line.partition("=")
            out.setdefault(key.strip(), []).append(value.strip())
    return out


def exec_start(name: str) -> tuple[str, list[str]]:
    binary, *argv = shlex.split(unit(name)["ExecStart"][0])
    # the unit's config file is the example beside it
    argv = [a.replace("/etc/nsq/nsqd.toml", str(SYSTEMD / "nsqd.toml")) for a in argv]
    return binary, argv


@pytest.mark.parametrize("name", UNITS)
def test_unit_flags_parse_with_nsqtws_options(name: str) -> None:
    binary, argv = exec_start(name)
    daemon = os.path.basename(binary)
    assert daemon == name.removesuffix(".service")
    options = parse(daemon, argv)
    assert options.log_level == 2  # built: every flag known and valid


def test_nsqd_unit_reads_the_example_config() -> None:
    """The TOML file the unit names holds the host's part: node id, lookupds, the replication mesh."""
    _, argv = exec_start("nsqd.service")
    options = parse("nsqd", argv)
    assert options.node_id == 1
    assert options.data_path == "/var/lib/nsqd"
    assert len(options.lookupd_tcp_addresses) == 2
    assert len(options.replica_peers) == 2 and options.replication_address == "0.0.0.0:4153"
    assert options.replication_secret_file == "/etc/nsq/replication.secret"


@pytest.mark.parametrize("name", UNITS)
def test_units_run_as_a_service_should(name: str) -> None:
    u = unit(name)
    assert u["User"] == ["nsq"] and u["Group"] == ["nsq"]
    assert u["KillSignal"] == ["SIGTERM"]
    assert u["Restart"] == ["on-failure"]
    assert u["NoNewPrivileges"] == ["yes"] and u["ProtectSystem"] == ["strict"]
    assert u["CapabilityBoundingSet"] == [""]
    assert "/opt/nsqtw/bin/" in u["ExecStart"][0]


def test_state_directories_are_the_data_paths() -> None:
    """ProtectSystem=strict leaves only the StateDirectory writable: the data paths must be it."""
    _, argv = exec_start("nsqd.service")
    assert unit("nsqd.service")["StateDirectory"] == ["nsqd"]
    assert parse("nsqd", argv).data_path == "/var/lib/nsqd"
    _, argv = exec_start("nsqadmin.service")
    assert unit("nsqadmin.service")["StateDirectory"] == ["nsqadmin"]
    assert parse("nsqadmin", argv).history_path == "/var/lib/nsqadmin"


def _drain_timeout(argv: list[str]) -> float:
    values = [a.split("=", 1)[1] for a in argv if a.lstrip("-").startswith("drain-timeout=")]
    assert values, "no --drain-timeout"
    return parse_duration(values[-1])


def test_nsqd_stop_timeout_covers_the_drain_and_the_final_flush() -> None:
    """systemd sends SIGKILL after TimeoutStopSec: it must outlast --drain-timeout plus the final
    write to disk (--stop-disk-wait), or a stop would kill a node mid-drain."""
    _, argv = exec_start("nsqd.service")
    timeout = parse_duration(unit("nsqd.service")["TimeoutStopSec"][0])
    flush = nsq_default(NsqdOptions, "stop_disk_wait")
    assert timeout >= _drain_timeout(argv) + flush + 5


def test_sysusers_file_creates_the_units_user() -> None:
    lines = [ln.split() for ln in (SYSTEMD / "nsqtw.sysusers.conf").read_text().splitlines()
             if ln.strip() and not ln.startswith("#")]
    assert [ln[:2] for ln in lines] == [["u", "nsq"]]


def _entry_points() -> Path | None:
    bin_dir = Path(sys.executable).parent
    return bin_dir if all((bin_dir / d).exists() for d in OPTIONS) else None


def test_units_pass_systemd_analyze_verify(tmp_path: Path) -> None:
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed (Debian: systemd)")
    bin_dir = _entry_points()
    if bin_dir is None:
        pytest.skip(f"the nsqd/nsqlookupd/nsqadmin entry points are not installed beside {sys.executable}")

    def verify(*files: Path) -> subprocess.CompletedProcess[str]:
        return subprocess.run([analyze, "verify", "--man=no", *map(str, files)], capture_output=True, text=True,
                              timeout=120, env=dict(os.environ, SYSTEMD_LOG_COLOR="0"))

    control = tmp_path / "nsqtw-control.service"
    control.write_text(f"[Service]\nType=exec\nExecStart={bin_dir / 'nsqd'} --version\n")
    proc = verify(control)
    if proc.returncode != 0:
        pytest.skip(f"systemd-analyze verify cannot run here: {(proc.stderr or proc.stdout).strip()[:300]}")
    copies = []
    for name in UNITS:
        text = (SYSTEMD / name).read_text().replace("/opt/nsqtw/bin/", f"{bin_dir}/")
        (tmp_path / name).write_text(text)
        copies.append(tmp_path / name)
    proc = verify(*copies)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    # unknown keys, bad values and missing binaries are warnings with status 0: none is allowed
    assert not [ln for ln in out.splitlines() if any(name in ln for name in UNITS)], out


def test_verify_would_catch_a_bad_key(tmp_path: Path) -> None:
    """The check above means something: a misspelt key in a unit is reported."""
    analyze = shutil.which("systemd-analyze")
    bin_dir = _entry_points()
    if analyze is None or bin_dir is None:
        pytest.skip("systemd-analyze or the entry points are not installed")
    text = (SYSTEMD / "nsqd.service").read_text().replace("/opt/nsqtw/bin/", f"{bin_dir}/")
    (tmp_path / "nsqd.service").write_text(text.replace("KillSignal=SIGTERM", "KillSignl=SIGTERM"))
    proc = subprocess.run([analyze, "verify", "--man=no", str(tmp_path / "nsqd.service")], capture_output=True,
                          text=True, timeout=120)
    if "Failed to" in proc.stderr and "KillSignl" not in proc.stderr:
        pytest.skip(f"systemd-analyze verify cannot run here: {proc.stderr.strip()[:300]}")
    assert "KillSignl" in proc.stdout + proc.stderr


def _dockerfile_array(instruction: str) -> list[str]:
    text = DOCKERFILE.read_text()
    m = re.search(rf"^{instruction}\s+(\[.*\])\s*$", text, re.MULTILINE)
    assert m, f"no {instruction} [...] in the Dockerfile"
    value: list[str] = json.loads(m.group(1))
    return value


def test_dockerfile_command_parses_with_nsqtws_options() -> None:
    entrypoint, cmd = _dockerfile_array("ENTRYPOINT"), _dockerfile_array("CMD")
    assert entrypoint[0] == "nsqd"
    options = parse("nsqd", entrypoint[1:] + cmd)
    assert options.data_path == "/data"
    assert options.tcp_address == "0.0.0.0:4150" and options.http_address == "0.0.0.0:4151"
    assert _drain_timeout(entrypoint[1:] + cmd) > 0
    text = DOCKERFILE.read_text()
    assert re.search(r"^USER nsq$", text, re.MULTILINE) and re.search(r"^VOLUME /data$", text, re.MULTILINE)
    assert re.search(r"^STOPSIGNAL SIGTERM$", text, re.MULTILINE)


def test_dockerfile_context_leaves_out_the_virtualenv() -> None:
    ignored = (ROOT / ".dockerignore").read_text().split()
    assert ".venv" in ignored and ".git" in ignored


# --- the production guide's commands ---------------------------------------------------------------


def guide_commands() -> list[list[str]]:
    """Every ``nsqd``/``nsqlookupd``/``nsqadmin`` command line in the guide's literal blocks (also
    behind ``twistd ...`` or ``docker run ... nsqtw``), continuation lines joined, as argv lists."""
    lines = GUIDE.read_text(encoding="utf-8").splitlines()
    commands: list[list[str]] = []
    i = 0
    in_block = False
    while i < len(lines):
        line = lines[i]
        if line.rstrip().endswith("::"):
            in_block = True
        elif in_block and line.strip() and not line.startswith(" "):
            in_block = False
        if in_block and line.startswith("    "):
            text = line.strip()
            while text.endswith("\\") and i + 1 < len(lines):
                i += 1
                text = text[:-1] + " " + lines[i].strip()
            try:
                words = shlex.split(text, comments=True)
            except ValueError:
                words = []
            argv = _daemon_argv(words)
            if argv:
                commands.append(argv)
        i += 1
    return commands


def _daemon_argv(words: list[str]) -> list[str] | None:
    """``[daemon, flags...]`` when ``words`` run a daemon (itself, under twistd, or in the image);
    None otherwise."""
    if any(w in ("|", ";", "&&") for w in words):
        return None
    if words[:1] == ["sudo"]:
        words = words[1:]
    if not words:
        return None
    first = os.path.basename(words[0])
    if first in OPTIONS:
        return [first, *words[1:]]
    if first == "twistd":  # twistd's own options (all --name=value here), then the plugin's name
        rest = [w for w in words[1:] if not w.startswith("-")]
        if rest and rest[0] in OPTIONS:
            k = words.index(rest[0])
            return [rest[0], *words[k + 1:]]
        return None
    if words[:2] == ["docker", "run"] and "nsqtw" in words:
        k = words.index("nsqtw")
        head = words[:k]
        if "--entrypoint" in head:
            return [head[head.index("--entrypoint") + 1], *words[k + 1:]]
        image = _dockerfile_array("ENTRYPOINT")
        return [image[0], *image[1:], *words[k + 1:]]
    return None


def test_the_guide_has_commands_to_check() -> None:
    commands = guide_commands()
    assert {c[0] for c in commands} == set(OPTIONS), commands
    assert len(commands) >= 8


@pytest.mark.parametrize("argv", guide_commands(), ids=lambda a: " ".join(a)[:60])
def test_guide_command_flags_parse(argv: list[str]) -> None:
    """A flag renamed or removed, or a value nsqtw would refuse at start, fails here."""
    daemon, *flags = argv
    flags = [f for f in flags if not f.startswith("--version") and f not in ("-h", "--help")]
    flags = [f.replace("/etc/nsq/nsqd.toml", str(SYSTEMD / "nsqd.toml")) for f in flags]
    parse(daemon, flags)


def test_every_series_the_guide_names_is_exported() -> None:
    """A Prometheus series the guide (and its alert rules) names is one nsqd's /metrics renders."""
    source = (ROOT / "nsqtw" / "nsqd" / "stats" / "prometheus.py").read_text()
    exported = set(re.findall(r'"(nsq_[a-z0-9_]+)"', source))
    exported |= {f"{p}_e2e_processing_latency_seconds" for p in ("nsq_topic", "nsq_channel")}
    named = set(re.findall(r"\b(nsq_[a-z0-9_]+)", GUIDE.read_text(encoding="utf-8")))
    assert named and named <= exported, sorted(named - exported)


def _guide_block_after(marker: str) -> list[str]:
    """The literal block that follows the paragraph starting with ``marker``, one command a line."""
    lines = GUIDE.read_text(encoding="utf-8").splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.strip().startswith(marker))
    i = next(i for i in range(start, len(lines)) if lines[i].rstrip().endswith("::")) + 1
    indent = None
    block = []
    while i < len(lines) and (not lines[i].strip() or indent is None or lines[i].startswith(" " * indent)):
        if lines[i].strip():
            if indent is None:
                indent = len(lines[i]) - len(lines[i].lstrip())
            block.append(lines[i].strip())
        i += 1
    return block


@pytest.mark.e2e
def test_rolling_restart_check_command_works_on_a_replicated_pair(tmp_path: Path) -> None:
    """Step 1 of the guide's rolling restart, run as written (host and port replaced) against a live
    replicated pair: it prints how many peers are in sync, and /ping says OK."""
    if shutil.which("curl") is None:
        pytest.skip("curl is not installed")
    sys.path.insert(0, str(ROOT / "bench"))
    from bench_sizing import Daemon, nsqd_args, wait_for

    (command,) = _guide_block_after("1. Check every peer is in sync")
    assert "nsq_replication_peers_in_sync" in command
    peer = Daemon("nsqd", nsqd_args(str(tmp_path), "--node-id=2", "--replication-address=127.0.0.1:0",
                                    "--replication-insecure"), str(tmp_path))
    origin = None
    try:
        peer.wait_listening(("TCP", "REPLICATION", "HTTP"))
        origin_data = tmp_path / "origin"
        origin_data.mkdir()
        origin = Daemon("nsqd", nsqd_args(str(origin_data), "--node-id=1", "--replication-insecure",
                                          f"--replica-peer=127.0.0.1:{peer.ports['REPLICATION']}"), str(tmp_path))
        origin.wait_listening(("TCP", "HTTP"))
        here = command.replace("nsq-1.example.internal:4151", f"127.0.0.1:{origin.ports['HTTP']}")
        assert here != command
        seen: list[str] = []

        def in_sync() -> bool:
            out = subprocess.run(["bash", "-c", here], capture_output=True, text=True, timeout=30).stdout.strip()
            seen.append(out)
            return out == "nsq_replication_peers_in_sync 1"

        wait_for(in_sync, 60, f"the guide's check to print 1 peer in sync (it printed {seen[-3:]})")
        assert seen[-1] == "nsq_replication_peers_in_sync 1"
        ping = subprocess.run(["curl", "-s", f"http://127.0.0.1:{origin.ports['HTTP']}/ping"], capture_output=True,
                              text=True, timeout=30)
        assert ping.stdout == "OK"
    finally:
        if origin is not None:
            origin.stop()
        peer.stop()


def test_the_guides_sizing_table_is_the_benchs() -> None:
    """The guide quotes bench/bench_sizing.py's table: the same rows, in the same order."""
    sys.path.insert(0, str(ROOT / "bench"))
    import argparse

    from bench_sizing import table

    keys = ("idle_nsqd_mib", "idle_nsqlookupd_mib", "idle_nsqadmin_mib", "idle_replicated_origin_mib",
            "idle_replicated_peer_mib", "per_connection_kib", "per_topic_kib", "per_message_memory_rss_bytes",
            "per_message_disk_bytes", "per_message_disk_rss_bytes", "cpu_pub_percent_per_10k", "cpu_pub_rate",
            "cpu_mpub100_percent_per_10k", "cpu_mpub100_rate")
    printed = table(dict.fromkeys(keys, 1.0), argparse.Namespace(body_size=200))
    rows = [re.split(r"\s{2,}", ln)[0] for ln in printed.splitlines() if ln and not ln.startswith("=")]
    guide = GUIDE.read_text(encoding="utf-8")
    section = guide[guide.index("\nSizing\n"):guide.index("\nA consumer connection is one")]
    quoted = [re.split(r"\s{2,}", ln)[0] for ln in section.splitlines()
              if re.match(r"^={10,}  =+$", ln) is None and re.match(r"^\S.*\S  +\S", ln)]
    assert quoted == rows


def test_the_guides_mesh_config_is_the_example_file() -> None:
    """The per-host TOML the guide shows is examples/systemd/nsqd.toml's (what the unit reads)."""
    if sys.version_info >= (3, 11):
        import tomllib
    else:
        import tomli as tomllib
    block = _guide_block_after("**A mesh of three with replication.**")
    assert tomllib.loads("\n".join(block)) == tomllib.loads((SYSTEMD / "nsqd.toml").read_text())


@pytest.mark.slow
@pytest.mark.e2e
def test_bench_sizing_runs_and_measures_the_disk_record() -> None:
    """bench/bench_sizing.py on small numbers (~40 s): every figure there, and a queued 200-byte
    message on disk takes its go-diskqueue record (4-byte length, 26-byte header, the body)."""
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "bench_sizing.py"), "--connections", "20",
                           "--topics", "20", "--messages", "2000", "--seconds", "1", "--rate", "1000", "--json"],
                          capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    figures = json.loads(proc.stdout)
    assert abs(figures["per_message_disk_bytes"] - 230) < 1
    assert figures["idle_nsqd_mib"] > 1 and figures["cpu_pub_rate"] > 500
