"""
Where channels' policies are kept between runs (nsqtw only).

``nsqtw.policies.json`` beside ``nsqd.dat``: ``{"version": 1, "channels": [{"topic": ...,
"channel": ..., "policy": {...}}]}``, one entry for each channel whose policy differs from the
nsqd-wide default (``--max-attempts`` and the like), rewritten whole (beside it, then renamed
over it) whenever a policy is set.  Go's nsqd never reads it, so the data directory still
starts under Go's nsqd, which then enforces no policy.
"""

from __future__ import annotations

import json
import os
from typing import Any

from twisted.logger import Logger

from ..runtime.files import write_atomically
from .core.policy import ChannelPolicy, PolicyError

__all__ = ["PolicyFile", "POLICY_FILE"]

POLICY_FILE = "nsqtw.policies.json"

log = Logger(namespace="nsqtw.nsqd")


class PolicyFile:
    """Reads and writes ``nsqtw.policies.json`` in one data directory."""

    def __init__(self, data_path: str, fsync: bool) -> None:
        self.path = os.path.join(data_path, POLICY_FILE)
        self.fsync = fsync

    def load(self) -> dict[tuple[str, str], ChannelPolicy]:
        """Every stored policy; an unreadable file or entry is logged and skipped."""
        try:
            with open(self.path, "rb") as f:
                doc = json.loads(f.read())
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as e:
            log.error("{path} could not be read, no channel policy restored: {e}", path=self.path, e=e)
            return {}
        out: dict[tuple[str, str], ChannelPolicy] = {}
        for entry in doc.get("channels", ()) if isinstance(doc, dict) else ():
            try:
                out[(entry["topic"], entry["channel"])] = ChannelPolicy.from_record(entry["policy"])
            except (KeyError, TypeError, PolicyError) as e:
                log.warn("{path}: an entry was skipped ({e!r})", path=self.path, e=e)
        return out

    def save(self, broker: Any) -> None:
        """Write the policy of every channel of ``broker`` that differs from its default."""
        default = broker.default_policy or ChannelPolicy()
        entries = []
        for topic in broker.topics.values():
            if topic.ephemeral or topic.exiting:
                continue
            for ch in topic.channels.values():
                policy = ch.policy or ChannelPolicy()
                if policy != default and not ch.ephemeral and not ch.exiting:
                    entries.append({"topic": topic.name, "channel": ch.name, "policy": policy.to_record()})
        if not entries:
            try:
                os.unlink(self.path)
            except FileNotFoundError:
                pass
            return
        data = json.dumps({"version": 1, "channels": entries}, indent=1).encode()
        write_atomically(self.path, data, self.fsync)
