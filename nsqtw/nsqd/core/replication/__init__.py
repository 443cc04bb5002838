"""
Replicated publish, sans-IO, by responsibility:

* :mod:`.origin`: the origin's bookkeeping: records, batches, acknowledgements, the publish
  barrier, and what /stats shows per peer;
* :mod:`.link`: both ends of one link (handshake, then batches and ACKs);
* :mod:`.shadow`: a peer's shadow of an origin, and the snapshots a catching-up peer gets;
* :mod:`.adoption`: when a peer adopts an origin's shadow, and how;
* :mod:`.broker`: the broker that hands what it stores to the replication hooks.

Nothing here imports a reactor; times are passed in.
"""

from __future__ import annotations

from .adoption import AdoptAfterTimeout, AdoptionArbiter, AdoptionPolicy, PeerRule, adopt
from .broker import ReplicatedBroker, ReplicatedChannel
from .link import OriginLink, ShadowReceiver
from .origin import (
    CATCHING_UP, CONNECTING, IN_SYNC, MAX_LAG_MESSAGES, OUT_OF_SYNC, SNAPSHOT_WINDOW, PeerLag, PeerState,
    PublishRefused, ReplicationOrigin, peer_stats,
)
from .shadow import SNAPSHOT_BATCH_BYTES, ShadowMessage, ShadowState, iter_chunks, outstanding, topology_entries

__all__ = ["AdoptionPolicy", "AdoptAfterTimeout", "AdoptionArbiter", "PeerRule", "adopt", "ReplicatedBroker", "ReplicatedChannel", "ShadowState",
           "ShadowMessage", "PublishRefused", "PeerState", "ReplicationOrigin", "OriginLink", "ShadowReceiver",
           "IN_SYNC", "CATCHING_UP", "CONNECTING", "OUT_OF_SYNC", "outstanding", "iter_chunks",
           "topology_entries", "MAX_LAG_MESSAGES", "SNAPSHOT_BATCH_BYTES", "SNAPSHOT_WINDOW", "PeerLag", "peer_stats"]
