"""Packaging: twistd finds the ``nsqd`` tap through Twisted's plugin system, and the plugin file and the
setup.cfg wiring it depends on are sound."""

from __future__ import annotations

import configparser
import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PLUGIN_FILE = ROOT / "plugins" / "nsqtw_plugins.py"

#: run in a fresh interpreter: list IServiceMaker plugins (from twisted.plugins, or from a given package),
#: then build the nsqd service from Go-style flags without starting it
PROBE = r"""
import importlib, json, sys
from twisted.application.service import IService, IServiceMaker
from twisted.plugin import getPlugins
package = importlib.import_module(sys.argv[1]) if sys.argv[1] != "-" else None
data_path = sys.argv[2]
makers = {m.tapname: m for m in (getPlugins(IServiceMaker, package) if package else getPlugins(IServiceMaker))}
out = {"tapnames": sorted(makers)}
nsqd = makers.get("nsqd")
if nsqd is not None:
    out["module"] = nsqd.module.__name__ if hasattr(nsqd.module, "__name__") else str(nsqd.module)
    opts = nsqd.options()
    opts.parseOptions(["--tcp-address=127.0.0.1:0", "--http-address=127.0.0.1:0", "--https-address=",
                       "--mem-queue-size=123", "--node-id=5", "--data-path=" + data_path])
    out["mem_queue_size"] = opts.config.mem_queue_size
    out["node_id"] = opts.config.node_id
    service = nsqd.makeService(opts)
    out["is_service"] = IService.providedBy(service)
    out["running"] = bool(service.running)
print(json.dumps(out))
"""


def run_probe(*args: str, extra_path: str = "") -> dict:
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
    # keep the caller's PYTHONPATH (an installed nsqtw may live there); the checkout comes last
    env["PYTHONPATH"] = os.pathsep.join(p for p in (extra_path, os.environ.get("PYTHONPATH", ""), str(ROOT)) if p)
    out = subprocess.run([sys.executable, "-c", PROBE, *args], capture_output=True, text=True, env=env,
                         cwd=str(ROOT), timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def _installed_plugin() -> bool:
    """True if nsqtw is installed into this interpreter with its twisted/plugins drop-in."""
    try:
        from importlib.metadata import PackageNotFoundError, distribution
        distribution("nsqtw")
    except PackageNotFoundError:
        return False
    import twisted.plugins
    return any((Path(p) / "nsqtw_plugins.py").is_file() for p in twisted.plugins.__path__)


@pytest.mark.skipif(not _installed_plugin(),
                    reason="nsqtw is not installed in this venv (bare checkout): twistd can only discover "
                           "plugins/ through an installed twisted/plugins/nsqtw_plugins.py (pip install .)")
def test_twistd_discovers_installed_nsqd_tap(tmp_path):
    """getPlugins(IServiceMaker) lists the installed 'nsqd' tap, whose options and makeService work."""
    result = run_probe("-", str(tmp_path))
    assert "nsqd" in result["tapnames"]
    assert result["module"] == "nsqtw.nsqd.tap"
    assert (result["mem_queue_size"], result["node_id"]) == (123, 5)
    assert result["is_service"] is True and result["running"] is False


def test_plugin_file_declares_the_taps(tmp_path):
    """plugins/nsqtw_plugins.py, loaded by Twisted's plugin scanner from a copy, yields the nsqd
    IServiceMaker (tapname nsqd, module nsqtw.nsqd.tap) that builds a service from NSQ flags."""
    pkg = tmp_path / "nsqtw_probe_plugins"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    shutil.copy(PLUGIN_FILE, pkg / "nsqtw_plugins.py")
    result = run_probe("nsqtw_probe_plugins", str(tmp_path / "data"), extra_path=str(tmp_path))
    assert "nsqd" in result["tapnames"]
    assert result["module"] == "nsqtw.nsqd.tap"
    assert (result["mem_queue_size"], result["node_id"]) == (123, 5)
    assert result["is_service"] is True and result["running"] is False


def test_plugins_dir_is_not_a_package():
    """plugins/ must not have an __init__.py: it is installed as (part of) the twisted.plugins namespace."""
    assert PLUGIN_FILE.is_file()
    assert not (ROOT / "plugins" / "__init__.py").exists()


def test_setup_cfg_installs_plugins_into_twisted_plugins():
    """setup.cfg maps plugins/ onto twisted.plugins and ships it."""
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    package_dir = cfg["options"]["package_dir"]
    assert "twisted.plugins = plugins" in [line.strip() for line in package_dir.splitlines()]
    packages = [line.strip() for line in cfg["options"]["packages"].splitlines() if line.strip()]
    assert "twisted.plugins" in packages and "nsqtw" in packages
    for name in packages:
        if name.startswith("nsqtw"):
            assert (ROOT / Path(*name.split("."))).is_dir(), name


def test_declared_entry_points_are_importable():
    """Every module named by setup.cfg's entry points exists in the checkout."""
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    missing = []
    for group, spec in cfg["options.entry_points"].items():
        for line in spec.splitlines():
            if "=" not in line:
                continue
            target = line.split("=", 1)[1].strip().split(":")[0]
            if target.startswith("nsqtw") and importlib.util.find_spec(target) is None:
                missing.append(f"{group}: {target}")
    assert missing == []


def test_pytest_extra_installs_what_the_fixtures_need() -> None:
    """``pip install "nsqtw[pytest]"`` brings pytest and pytest-twisted, which the fixtures run on (the
    testing guide and the README say to install it that way)."""
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    extra = [line.strip() for line in cfg["options.extras_require"]["pytest"].splitlines() if line.strip()]
    names = {line.split(">")[0].split("=")[0].split("<")[0].strip().lower() for line in extra}
    assert names == {"pytest", "pytest-twisted"}
    for doc in ("README.rst", "docs/guide/testing.rst"):
        assert "nsqtw[pytest]" in (ROOT / doc).read_text(), doc


def test_setup_cfg_lists_every_package_of_the_tree() -> None:
    """setup.cfg names its packages one by one: a new subpackage left out of the list is left out
    of the install (and a stale module of the same name from an older build is installed instead)."""
    import configparser
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    cfg = configparser.ConfigParser()
    cfg.read(root / "setup.cfg")
    listed = set(cfg["options"]["packages"].split())
    tree = {".".join(p.parent.relative_to(root).parts) for p in (root / "nsqtw").rglob("__init__.py")}
    assert tree <= listed, sorted(tree - listed)
