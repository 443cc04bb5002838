"""nsqlookupd's options, its twistd adapter and the service tree it builds (no sockets)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from twisted.internet.testing import MemoryReactorClock
from twisted.python import usage

from nsqtw.lookupd.options import LookupdOptions
from nsqtw.options import LOG_LEVELS, OptionError
from nsqtw.runtime.flags import options_from_argv, usage_text

ROOT = Path(__file__).resolve().parents[2]


def test_defaults_are_nsqlookupds() -> None:
    """Defaults: 0.0.0.0:4160 / 0.0.0.0:4161, 300s inactivity, 45s tombstones, the prefix."""
    o = LookupdOptions(broadcast_address="h")
    assert (o.tcp_address, o.http_address, o.inactive_producer_timeout, o.tombstone_lifetime,
            o.log_prefix, o.log_level, o.verbose) == (
        "0.0.0.0:4160", "0.0.0.0:4161", 300.0, 45.0, "[nsqlookupd] ", LOG_LEVELS["info"], False)


def test_go_style_command_line() -> None:
    """NSQ's flags in Go's syntax, durations in Go's format."""
    o = options_from_argv(LookupdOptions, [
        "-tcp-address=127.0.0.1:5160", "--http-address", "127.0.0.1:5161", "--broadcast-address=lk1",
        "--inactive-producer-timeout=1m30s", "-tombstone-lifetime", "500ms", "--log-level=debug",
        "--verbose"])
    assert (o.tcp_address, o.http_address, o.broadcast_address, o.inactive_producer_timeout,
            o.tombstone_lifetime, o.log_level, o.verbose) == (
        "127.0.0.1:5160", "127.0.0.1:5161", "lk1", 90.0, 0.5, LOG_LEVELS["debug"], True)


def test_config_file_and_flags_win(tmp_path: Path) -> None:
    """--config reads NSQ's TOML names; a flag on the command line overrides the file."""
    cfg = tmp_path / "nsqlookupd.cfg"
    cfg.write_text('tcp_address = "127.0.0.1:6160"\nbroadcast_address = "from-file"\n'
                   'tombstone_lifetime = "10s"\n')
    o = options_from_argv(LookupdOptions, ["--config", str(cfg), "--broadcast-address=flag"])
    assert (o.tcp_address, o.broadcast_address, o.tombstone_lifetime) == ("127.0.0.1:6160", "flag", 10.0)


@pytest.mark.parametrize("argv, text", [
    (["--tcp-address=nohost"], "--tcp-address"),
    (["--http-address="], "--http-address"),
    (["--http-address=127.0.0.1:99999"], "--http-address"),
    (["--inactive-producer-timeout=-1s"], "--inactive-producer-timeout"),
    (["--tombstone-lifetime=-5s"], "--tombstone-lifetime"),
    (["--tombstone-lifetime=soon"], "tombstone-lifetime"),
    (["--lookupd-tcp-address=x:1"], "flag provided but not defined: -lookupd-tcp-address"),
    (["--log-level=loud"], "log-level"),
])
def test_bad_values_are_refused_naming_the_flag(argv, text) -> None:
    """Invalid values fail at construction with a message that names the flag."""
    with pytest.raises(OptionError) as info:
        options_from_argv(LookupdOptions, argv)
    assert text in str(info.value)


def test_usage_lists_every_flag() -> None:
    """--help shows NSQ's flags with Go-formatted defaults."""
    text = usage_text(LookupdOptions, "nsqlookupd")
    for flag in ("-tcp-address", "-http-address", "-broadcast-address", "-inactive-producer-timeout",
                 "-tombstone-lifetime", "-log-level", "-log-prefix", "-verbose", "-config", "-version"):
        assert f"  {flag}" in text
    assert "(default 5m0s)" in text and "(default 45s)" in text


def test_tap_options_parse_and_refuse() -> None:
    """The twistd adapter parses Go flags into LookupdOptions and turns errors into UsageError."""
    from nsqtw.lookupd.tap import Options

    opts = Options()
    opts.parseOptions(["--tcp-address=127.0.0.1:0", "--broadcast-address=b"])
    assert isinstance(opts.config, LookupdOptions) and opts.config.broadcast_address == "b"
    with pytest.raises(usage.UsageError, match="tcp-address"):
        Options().parseOptions(["--tcp-address=bad"])


def test_plugin_names_the_tap_module() -> None:
    """plugins/nsqtw_plugins.py's nsqlookupd entry resolves to this tap's Options and makeService."""
    spec = importlib.util.spec_from_file_location("nsqtw_plugins_under_test", ROOT / "plugins" / "nsqtw_plugins.py")
    module = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    spec.loader.exec_module(module)
    from nsqtw.lookupd import tap

    maker = module.nsqlookupd
    assert maker.tapname == "nsqlookupd"
    assert maker.options is tap.Options and maker.makeService is tap.makeService


def test_service_tree_listens_on_both_addresses() -> None:
    """build_lookupd binds TCP and HTTP where told; the ports and ready() follow the listeners."""
    from nsqtw.lookupd.service import build_lookupd

    reactor = MemoryReactorClock()
    service = build_lookupd(LookupdOptions(tcp_address="127.0.0.1:5160", http_address="127.0.0.2:5161",
                                           broadcast_address="b"), reactor)
    service.startService()
    ports = sorted((p[0], p[3]) for p in reactor.tcpServers)
    assert ports == [(5160, "127.0.0.1"), (5161, "127.0.0.2")]
    fired = []
    service.ready().addCallback(fired.append)
    assert fired == [service]
    assert service.tcp_port == 5160 and service.http_port == 5161
    assert service.broadcast_address == "b" and service.now() == reactor.seconds()
    service.stopService()
    assert not service.running


def test_config_file_on_python_3_10(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The package supports 3.10, which has no tomllib: --config read through tomli there (it
    raised ModuleNotFoundError before, found by mypy at python_version 3.10)."""
    pytest.importorskip("tomli")
    import sys
    monkeypatch.setattr(sys, "version_info", (3, 10, 0, "final", 0))
    monkeypatch.setitem(sys.modules, "tomllib", None)  # an import of tomllib fails
    cfg = tmp_path / "nsqlookupd.cfg"
    cfg.write_text('tcp_address = "127.0.0.1:6160"\n')
    o = options_from_argv(LookupdOptions, ["--config", str(cfg)])
    assert o.tcp_address == "127.0.0.1:6160"
