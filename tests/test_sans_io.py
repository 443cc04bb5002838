"""The sans-IO cores import no reactor: importing each component's ``core`` (``nsqtw.nsqd.core``,
``nsqtw.lookupd.core``) and the shared codecs (``protocol``, ``backend``, ``options``) in a fresh
interpreter leaves ``twisted.internet.reactor`` out of ``sys.modules`` (design rule: the reactor is
resolved lazily)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path


ROOT = Path(__file__).resolve().parent.parent

SANS_IO = ["nsqtw.protocol", "nsqtw.nsqd.core", "nsqtw.lookupd.core", "nsqtw.backend", "nsqtw.options"]

PROBE = r"""
import importlib, json, pkgutil, sys
roots = json.loads(sys.argv[1])
walk = sys.argv[2] == "walk"
imported, offenders, failed = [], [], {}
names = list(roots)
if walk:
    for root in roots:
        mod = importlib.import_module(root)
        for info in pkgutil.walk_packages(getattr(mod, "__path__", []), root + "."):
            names.append(info.name)
for name in names:
    before = "twisted.internet.reactor" in sys.modules
    try:
        importlib.import_module(name)
    except ImportError as e:  # optional dependency missing: reported, not judged here
        failed[name] = repr(e)
        continue
    imported.append(name)
    if not before and "twisted.internet.reactor" in sys.modules:
        offenders.append(name)
print(json.dumps({"imported": imported, "offenders": offenders, "failed": failed,
                  "reactor": "twisted.internet.reactor" in sys.modules}))
"""


def probe(roots, walk: bool):
    env = dict(os.environ, PYTHONPATH=str(ROOT), PYTHONDONTWRITEBYTECODE="1")
    out = subprocess.run([sys.executable, "-c", PROBE, json.dumps(roots), "walk" if walk else "top"],
                         capture_output=True, text=True, env=env, cwd=str(ROOT), timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_sans_io_packages_import_no_reactor():
    """import the codecs and each component's core in a fresh process: no reactor."""
    result = probe(SANS_IO, walk=False)
    assert result["imported"] == SANS_IO
    assert result["reactor"] is False, result


def test_every_sans_io_module_imports_no_reactor():
    """Every submodule of the sans-IO packages imports without installing the reactor."""
    result = probe(SANS_IO, walk=True)
    assert len(result["imported"]) > len(SANS_IO)
    assert "nsqtw.nsqd.core.v2" in result["imported"] and "nsqtw.nsqd.core.broker" in result["imported"]
    assert "nsqtw.lookupd.core.registry" in result["imported"]
    assert result["failed"] == {}, result["failed"]
    assert result["offenders"] == [] and result["reactor"] is False, result


#: walks every nsqtw module with the reactor import blocked; third-party libraries that bind the reactor at
#: import time (klein's _app does, for Klein.run) are imported first against a placeholder, so only nsqtw's
#: own import-time reactor imports are reported, attributed to the innermost nsqtw module on the stack
TRIPWIRE = r"""
import importlib, json, pkgutil, sys, traceback, types
import twisted.internet
placeholder = types.ModuleType("twisted.internet.reactor")
sys.modules["twisted.internet.reactor"] = placeholder
for lib in ("klein", "treq"):
    try:
        importlib.import_module(lib)
    except ImportError:
        pass
del sys.modules["twisted.internet.reactor"]
if getattr(twisted.internet, "reactor", None) is placeholder:
    delattr(twisted.internet, "reactor")

class Block:
    def find_spec(self, name, path=None, target=None):
        if name == "twisted.internet.reactor":
            raise ImportError("REACTOR-AT-IMPORT")
        return None

sys.meta_path.insert(0, Block())
names = ["nsqtw"] + [i.name for i in pkgutil.walk_packages(importlib.import_module("nsqtw").__path__, "nsqtw.")]
imported, offenders, failed = [], {}, {}
for name in names:
    try:
        importlib.import_module(name)
        imported.append(name)
    except ImportError as e:
        tb = traceback.extract_tb(e.__traceback__)
        if "REACTOR-AT-IMPORT" in str(e):
            culprits = [f.filename for f in tb if "/nsqtw/" in f.filename]
            offenders[name] = culprits[-1] if culprits else "?"
        else:
            failed[name] = repr(e)
print(json.dumps({"imported": imported, "offenders": offenders, "failed": failed}))
"""


def test_no_nsqtw_module_imports_the_reactor_at_import_time():
    """No nsqtw module anywhere imports the reactor when imported (klein's own import-time binding aside)."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), PYTHONDONTWRITEBYTECODE="1")
    out = subprocess.run([sys.executable, "-c", TRIPWIRE], capture_output=True, text=True, env=env,
                         cwd=str(ROOT), timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert len(result["imported"]) > 20
    assert "nsqtw.nsqd.http" in result["imported"] and "nsqtw.nsqd.service" in result["imported"]
    assert result["offenders"] == {}, result["offenders"]
