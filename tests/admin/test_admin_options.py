"""nsqadmin's options: NSQ's flags and defaults, the start-up checks, twistd and the embedding entry points."""

from __future__ import annotations

import pytest
from twisted.python import usage

from nsqtw.admin.options import AdminOptions, normalize_base_path
from nsqtw.options import OptionError
from nsqtw.runtime.flags import options_from_argv, usage_text


def test_defaults_are_nsqadmins() -> None:
    """Defaults match nsqadmin's NewOptions (address, base path, timeouts, CIDR, ACL header, prefix)."""
    o = AdminOptions(nsqd_http_addresses=["127.0.0.1:4151"])
    assert (o.http_address, o.base_path, o.allow_config_from_cidr, o.acl_http_header, o.log_prefix) == (
        "0.0.0.0:4171", "/", "127.0.0.1/8", "X-Forwarded-User", "[nsqadmin] ")
    assert (o.http_client_connect_timeout, o.http_client_request_timeout) == (2.0, 5.0)
    assert o.admin_users == [] and o.notification_http_endpoint == "" and o.log_level == 2


def test_go_style_command_line() -> None:
    """Repeatable flags collect, durations parse, cfg names match nsqadmin's (nsqlookupd_http_addresses...)."""
    o = options_from_argv(AdminOptions, [
        "--lookupd-http-address=10.0.0.1:4161", "-lookupd-http-address", "10.0.0.2:4161",
        "--admin-user", "alice", "--admin-user=bob", "--http-client-request-timeout=250ms",
        "--base-path", "/admin", "--acl-http-header=X-User", "--notification-http-endpoint",
        "http://hooks.example/nsq"])
    assert o.lookupd_http_addresses == ["10.0.0.1:4161", "10.0.0.2:4161"]
    assert o.admin_users == ["alice", "bob"] and o.http_client_request_timeout == 0.25
    assert o.base == "/admin" and o.acl_http_header == "X-User" and o.lookupd_mode


def test_history_retention_flag_reaches_the_history() -> None:
    """--history-retention 24h (default 6h) is how far back the charts go; the service's history and
    its book of failed nodes use it."""
    from twisted.internet.testing import MemoryReactorClock

    from nsqtw.admin.service import AdminService

    assert AdminOptions(nsqd_http_addresses=["a:1"]).history_retention == 21600.0
    o = options_from_argv(AdminOptions, ["--nsqd-http-address=127.0.0.1:4151", "--history-retention=24h",
                                         "--http-address=127.0.0.1:0"])
    assert o.history_retention == 86400.0
    service = AdminService(o, MemoryReactorClock(), http_client=object())
    assert service.history.retention == 86400.0 and service.cluster.book.retention == 86400.0
    assert service.history.coarse_step == 120.0


def test_config_file_uses_nsqadmin_cfg_names(tmp_path) -> None:
    """A TOML config with nsqadmin's keys is read; flags on the command line win."""
    cfg = tmp_path / "nsqadmin.cfg"
    cfg.write_text('nsqd_http_addresses = ["127.0.0.1:4151"]\nadmin_users = ["root"]\n'
                   'http_address = "127.0.0.1:9999"\n')
    o = options_from_argv(AdminOptions, ["--config", str(cfg), "--http-address=127.0.0.1:4171"])
    assert o.nsqd_http_addresses == ["127.0.0.1:4151"] and o.admin_users == ["root"]
    assert o.http_address == "127.0.0.1:4171"


@pytest.mark.parametrize("kwargs, text", [
    ({}, "--nsqd-http-address or --lookupd-http-address required"),
    ({"nsqd_http_addresses": ["a:1"], "lookupd_http_addresses": ["b:2"]},
     "use --nsqd-http-address or --lookupd-http-address not both"),
    ({"nsqd_http_addresses": ["nohost"]}, "--nsqd-http-address"),
    ({"lookupd_http_addresses": ["h:notaport"]}, "--lookupd-http-address"),
    ({"nsqd_http_addresses": ["a:1"], "http_client_tls_cert": "c.pem"},
     "--http-client-tls-key must be specified with --http-client-tls-cert"),
    ({"nsqd_http_addresses": ["a:1"], "http_client_tls_key": "k.pem"},
     "--http-client-tls-cert must be specified with --http-client-tls-key"),
    ({"nsqd_http_addresses": ["a:1"], "allow_config_from_cidr": "300.1.1.1/8"}, "--allow-config-from-cidr"),
    ({"nsqd_http_addresses": ["a:1"], "allow_config_from_cidr": "127.0.0.1"}, "--allow-config-from-cidr"),
    ({"nsqd_http_addresses": ["a:1"], "notification_http_endpoint": "hooks.example/x"},
     "--notification-http-endpoint"),
    ({"nsqd_http_addresses": ["a:1"], "http_client_request_timeout": 0.0}, "--http-client-request-timeout"),
    ({"nsqd_http_addresses": ["a:1"], "history_size": 1}, "--history-size"),
    ({"nsqd_http_addresses": ["a:1"], "history_retention": 0.0}, "--history-retention"),
    ({"nsqd_http_addresses": ["a:1"], "http_address": "nowhere"}, "--http-address"),
])
def test_bad_options_are_refused_naming_the_flag(kwargs, text) -> None:
    """Each invalid combination raises OptionError whose message names the flag."""
    with pytest.raises(OptionError) as e:
        AdminOptions(**kwargs)
    assert text in str(e.value)


@pytest.mark.parametrize("argv, flag", [
    (["--graphite-url=http://graphite:8080"], "--graphite-url"),
    (["--proxy-graphite"], "--proxy-graphite"),
])
def test_graphite_flags_fail_loudly(argv, flag) -> None:
    """--graphite-url and --proxy-graphite are refused with a message that says graphs need no graphite."""
    with pytest.raises(OptionError) as e:
        options_from_argv(AdminOptions, ["--nsqd-http-address=127.0.0.1:4151", *argv])
    assert str(e.value).startswith(f"{flag} is not supported: ")
    assert "history" in str(e.value)


def test_statsd_flags_are_accepted() -> None:
    """The --statsd-* flags parse (they only ever described graphite keys)."""
    o = options_from_argv(AdminOptions, ["--nsqd-http-address=127.0.0.1:4151", "--statsd-prefix=nsq.%s.x",
                                         "--statsd-interval=10s", "--statsd-counter-format="])
    assert (o.statsd_prefix, o.statsd_interval, o.statsd_counter_format) == ("nsq.%s.x", 10.0, "")


@pytest.mark.parametrize("raw, norm", [("", "/"), ("/", "/"), ("admin", "/admin"), ("/a/b/", "/a/b"),
                                       ("//x//y", "/x/y"), ("/a/../b", "/b")])
def test_base_path_is_normalised(raw, norm) -> None:
    """normalizeBasePath: a leading slash, path.Clean, and / for empty."""
    assert normalize_base_path(raw) == norm


def test_usage_lists_nsqadmins_flags() -> None:
    """--help prints Go's flag layout with nsqadmin's flags and defaults."""
    text = usage_text(AdminOptions, "nsqadmin")
    assert text.startswith("Usage of nsqadmin:")
    for flag in ("-lookupd-http-address value", "-nsqd-http-address value", "-admin-user value",
                 "-acl-http-header string", "-allow-config-from-cidr string", "-base-path string",
                 "-http-client-connect-timeout duration", "-notification-http-endpoint string"):
        assert flag in text
    assert '(default "127.0.0.1/8")' in text


def test_twistd_options_and_make_service(monkeypatch) -> None:
    """``twistd nsqadmin`` parses Go-style flags and builds an AdminService (not started), to
    which it applies the daemons' process policy (recorded here: this is pytest's process)."""
    import nsqtw.runtime.process
    from nsqtw.admin.service import AdminService
    from nsqtw.admin import tap

    applied: list = []
    monkeypatch.setattr(nsqtw.runtime.process, "apply_daemon_policy", lambda service, reactor: applied.append(service))
    opts = tap.Options()
    opts.parseOptions(["--nsqd-http-address=127.0.0.1:4151", "--http-address=127.0.0.1:0", "--admin-user=ops"])
    assert opts.config.admin_users == ["ops"]
    service = tap.makeService(opts)
    assert isinstance(service, AdminService) and not service.running
    assert applied == [service]
    assert service.http_listener.address == "127.0.0.1:0"
    with pytest.raises(usage.UsageError) as e:
        tap.Options().parseOptions(["--http-address=127.0.0.1:0"])
    assert "--nsqd-http-address or --lookupd-http-address required" in str(e.value)


def test_unresolvable_upstream_is_refused_at_build() -> None:
    """An address that does not resolve stops nsqadmin from starting (nsqadmin's ResolveTCPAddr check)."""
    from twisted.internet.testing import MemoryReactorClock

    from nsqtw.admin.service import build_admin

    with pytest.raises(OptionError) as e:
        build_admin(AdminOptions(lookupd_http_addresses=["no-such-host.invalid:4161"]), MemoryReactorClock())
    assert "failed to resolve --lookupd-http-address (no-such-host.invalid:4161)" in str(e.value)


def test_tls_files_are_checked_at_build(tmp_path) -> None:
    """A missing --http-client-tls-root-ca-file is refused with the flag and path in the message."""
    from twisted.internet.testing import MemoryReactorClock

    from nsqtw.admin.service import build_admin

    missing = tmp_path / "ca.pem"
    with pytest.raises(OptionError) as e:
        build_admin(AdminOptions(nsqd_http_addresses=["127.0.0.1:4151"],
                                 http_client_tls_root_ca_file=str(missing)), MemoryReactorClock())
    assert "--http-client-tls-root-ca-file" in str(e.value) and str(missing) in str(e.value)
