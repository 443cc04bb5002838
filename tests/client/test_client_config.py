"""Config: go-nsq's option names, defaults, bounds and Set() coercion."""

from __future__ import annotations

import datetime
import socket

import pytest

from nsqtw.client.config import Config, ExponentialStrategy, FullJitterStrategy, apply_flags
from nsqtw.client.errors import ConfigError

#: go-nsq config.go: option -> default (durations in seconds)
GO_NSQ_DEFAULTS = {
    "dial_timeout": 1.0, "read_timeout": 60.0, "write_timeout": 1.0, "local_addr": None,
    "lookupd_poll_interval": 60.0, "lookupd_poll_jitter": 0.3, "lookupd_poll_timeout": 60.0,
    "max_requeue_delay": 900.0, "default_requeue_delay": 90.0, "max_backoff_duration": 120.0,
    "backoff_multiplier": 1.0, "max_attempts": 5, "low_rdy_idle_timeout": 10.0, "low_rdy_timeout": 30.0,
    "rdy_redistribute_interval": 5.0, "topology_region": "", "topology_zone": "",
    "heartbeat_interval": 30.0, "sample_rate": 0, "tls_v1": False, "tls_config": None, "deflate": False,
    "deflate_level": 6, "snappy": False, "output_buffer_size": 16384, "output_buffer_timeout": 0.25,
    "max_in_flight": 1, "msg_timeout": 0.0, "max_msg_size": 0, "auth_secret": "",
    "skip_lookupd_authorization": True,
}

#: (option, below min, above max) as go-nsq's struct tags bound them
GO_NSQ_BOUNDS = [
    ("read_timeout", "99ms", "5m1s"), ("write_timeout", "99ms", "5m1s"),
    ("lookupd_poll_interval", "9ms", "5m1s"), ("lookupd_poll_jitter", "-0.1", "1.1"),
    ("max_requeue_delay", "-1s", "60m1s"), ("default_requeue_delay", "-1s", "61m"),
    ("max_backoff_duration", "-1ms", "61m"), ("backoff_multiplier", "-1ms", "61m"),
    ("max_attempts", None, "65536"), ("low_rdy_idle_timeout", "999ms", "5m1s"),
    ("low_rdy_timeout", "999ms", "5m1s"), ("rdy_redistribute_interval", "999us", "5001ms"),
    ("sample_rate", "-1", "100"), ("deflate_level", "0", "10"), ("max_in_flight", "-1", None),
    ("msg_timeout", "-1ms", None), ("max_msg_size", "-1", None),
]


def test_every_go_nsq_option_exists_with_its_default():
    """All go-nsq options are attributes with go-nsq's default values."""
    cfg = Config()
    for name, default in GO_NSQ_DEFAULTS.items():
        assert getattr(cfg, name) == default, name
    assert isinstance(cfg.backoff_strategy, ExponentialStrategy)
    assert cfg.client_id == socket.gethostname().split(".")[0]
    assert cfg.hostname == socket.gethostname()
    assert cfg.user_agent.startswith("nsqtw/")
    for name in ("tls_root_ca_file", "tls_insecure_skip_verify", "tls_cert", "tls_key", "tls_min_version"):
        assert name in Config.options()


@pytest.mark.parametrize("name,low,high", GO_NSQ_BOUNDS)
def test_bounds_are_go_nsqs_and_the_error_names_the_option(name, low, high):
    """A value outside go-nsq's min/max is refused with 'invalid <option> ! ...'."""
    cfg = Config()
    for bad in (low, high):
        if bad is None:
            continue
        with pytest.raises(ConfigError) as info:
            cfg.set(name, bad)
        assert name in str(info.value)


def test_duration_coercion_like_go_nsq():
    """Durations: Go strings, ints as milliseconds, timedeltas; floats are refused by set()."""
    cfg = Config()
    cfg.set("read_timeout", "1m30s")
    assert cfg.read_timeout == 90.0
    cfg.set("msg_timeout", 1500)
    assert cfg.msg_timeout == 1.5
    cfg.set("lookupd_poll_interval", datetime.timedelta(seconds=2))
    assert cfg.lookupd_poll_interval == 2.0
    with pytest.raises(ConfigError, match="msg_timeout"):
        cfg.set("msg_timeout", 1.5)
    with pytest.raises(ConfigError, match="dial_timeout"):
        cfg.set("dial_timeout", "1000")  # Go's ParseDuration needs a unit


def test_bool_coercion_like_go_nsq():
    """Bools: bool, strconv.ParseBool spellings, or ints (non-zero is true)."""
    cfg = Config()
    for value, expected in [("true", True), ("F", False), ("1", True), (0, False), (2, True), (True, True)]:
        cfg.set("snappy", value)
        assert cfg.snappy is expected
    with pytest.raises(ConfigError, match="snappy"):
        cfg.set("snappy", "yes")


def test_dash_means_underscore_and_unknown_options_are_refused():
    """'max-in-flight' is max_in_flight; an unknown name is 'invalid option'."""
    cfg = Config()
    cfg.set("max-in-flight", "100")
    assert cfg.max_in_flight == 100
    with pytest.raises(ConfigError, match="invalid option no_such_option"):
        cfg.set("no_such_option", 1)


def test_flag_strings_k_v_and_bare_k():
    """--consumer-opt=k,v sets k; a bare k means true; the value may contain commas."""
    cfg = apply_flags(Config(), ["max_in_flight,250", "tls_v1", "client_id,a,b", "heartbeat_interval,10s"])
    assert (cfg.max_in_flight, cfg.tls_v1, cfg.client_id, cfg.heartbeat_interval) == (250, True, "a,b", 10.0)
    with pytest.raises(ConfigError, match="max_attempts"):
        apply_flags(Config(), ["max_attempts,lots"])


def test_backoff_strategy_and_local_addr():
    """backoff_strategy is exponential|full_jitter; local_addr needs host:port."""
    cfg = Config()
    cfg.set("backoff_strategy", "full_jitter")
    assert isinstance(cfg.backoff_strategy, FullJitterStrategy)
    with pytest.raises(ConfigError, match="backoff_strategy"):
        cfg.set("backoff_strategy", "linear")
    cfg.set("local_addr", "127.0.0.1:0")
    assert cfg.local_addr == ("127.0.0.1", 0)
    with pytest.raises(ConfigError, match="local_addr"):
        cfg.set("local_addr", "127.0.0.1")


def test_constructor_takes_seconds_and_checks_bounds():
    """Python code passes float seconds (or Go strings); out-of-range values are refused."""
    cfg = Config(msg_timeout=30, read_timeout="2m", max_in_flight=7)
    assert (cfg.msg_timeout, cfg.read_timeout, cfg.max_in_flight) == (30.0, 120.0, 7)
    with pytest.raises(ConfigError, match="rdy_redistribute_interval"):
        Config(rdy_redistribute_interval=10)


def test_validate_requires_heartbeat_not_above_read_timeout():
    """go-nsq Validate: heartbeat_interval must not exceed read_timeout."""
    with pytest.raises(ConfigError, match="HeartbeatInterval"):
        Config(heartbeat_interval=61, read_timeout=60).validate()
    Config(heartbeat_interval=-1).validate()


def test_identify_body_is_what_go_nsq_sends():
    """IDENTIFY carries go-nsq's fields; durations in ms; negative intervals as -1."""
    body = Config(heartbeat_interval=-1, output_buffer_timeout=-1, msg_timeout=45, client_id="c").identify_body()
    assert body["feature_negotiation"] is True
    assert body["heartbeat_interval"] == -1 and body["output_buffer_timeout"] == -1
    assert body["msg_timeout"] == 45000 and body["short_id"] == "c" and body["client_id"] == "c"
    assert set(body) >= {"hostname", "user_agent", "long_id", "tls_v1", "deflate", "deflate_level", "snappy",
                         "sample_rate", "output_buffer_size", "topology_region", "topology_zone"}


def test_requeue_delay_is_default_times_attempts_capped():
    """Requeue(-1): default_requeue_delay × attempts, at most max_requeue_delay."""
    cfg = Config(default_requeue_delay=90, max_requeue_delay=900)
    assert cfg.requeue_delay(1) == 90 and cfg.requeue_delay(3) == 270 and cfg.requeue_delay(20) == 900


def test_copy_is_independent():
    """Producers and consumers keep their own copy, as go-nsq copies the Config."""
    cfg = Config()
    other = cfg.copy()
    other.set("max_in_flight", 9)
    assert cfg.max_in_flight == 1


def test_tls_root_ca_file_must_be_readable(tmp_path):
    """go-nsq reads the CA file on Set: a missing one is refused there."""
    with pytest.raises(ConfigError, match="Certificate Authority"):
        Config().set("tls_root_ca_file", str(tmp_path / "missing.pem"))
    with pytest.raises(ConfigError, match="tls_min_version"):
        Config().set("tls_min_version", "tls9")
