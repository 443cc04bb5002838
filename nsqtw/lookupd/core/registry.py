"""
nsqlookupd's RegistrationDB: which nsqd produces which topic and channel.

The DB maps a :class:`Registration` ``(category, key, subkey)`` to the
producers registered under it, keyed by peer id (the nsqd connection's
``ip:port``).  The categories are:

* ``client`` (key and subkey ``""``): one entry per identified nsqd;
* ``topic`` (key = topic, subkey ``""``);
* ``channel`` (key = topic, subkey = channel).

``*`` as key or subkey is a wildcard in :meth:`RegistrationDB.find_registrations`
and :meth:`RegistrationDB.find_producers`.  Removing a producer never removes
its registration: a non-ephemeral topic or channel stays with an empty producer
list (this is why ``/channels`` still lists a channel an nsqd deleted) until
``/topic/delete`` or ``/channel/delete``.  Ephemeral ones go when their last
producer unregisters.

Everything is in memory and nothing here reads a clock: time arrives as
``now`` (seconds) and durations are seconds.  Dicts keep insertion order, so
listings come out in registration order where Go's map order is random.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import attr
from twisted.logger import Logger

from ...protocol.names import is_ephemeral
from .peers import PeerInfo

__all__ = [
    "CLIENT",
    "TOPIC",
    "CHANNEL",
    "Registration",
    "Producer",
    "RegistrationDB",
    "filter_by_active",
    "keys",
    "subkeys",
]

log = Logger(namespace="nsqtw.lookupd")

CLIENT = "client"
TOPIC = "topic"
CHANNEL = "channel"

WILDCARD = "*"


@attr.s(frozen=True, slots=True, auto_attribs=True)
class Registration:
    """A DB key: ``category:key:subkey``."""

    category: str
    key: str = ""
    subkey: str = ""

    def is_match(self, category: str, key: str, subkey: str) -> bool:
        """Go's ``IsMatch``: same category, ``*`` matches any key or subkey."""
        if category != self.category:
            return False
        if key != WILDCARD and key != self.key:
            return False
        if subkey != WILDCARD and subkey != self.subkey:
            return False
        return True

    def __str__(self) -> str:
        return f"{self.category}:{self.key}:{self.subkey}"


@attr.s(slots=True, eq=False, auto_attribs=True)
class Producer:
    """A peer registered under one key, with that key's tombstone state."""

    peer: PeerInfo
    tombstoned: bool = False
    tombstoned_at: float | None = None

    def tombstone(self, now: float) -> None:
        self.tombstoned = True
        self.tombstoned_at = now

    def is_tombstoned(self, lifetime: float, now: float) -> bool:
        """Tombstoned less than ``lifetime`` seconds ago (a lifetime of 0 never hides)."""
        return self.tombstoned and self.tombstoned_at is not None and now - self.tombstoned_at < lifetime


def filter_by_active(producers: Iterable[Producer], inactive_timeout: float,
                     tombstone_lifetime: float, now: float) -> list[Producer]:
    """Go's ``FilterByActive``: drop producers silent for longer than ``inactive_timeout``
    and those tombstoned within ``tombstone_lifetime``."""
    return [p for p in producers
            if not (now - p.peer.last_update > inactive_timeout
                    or p.is_tombstoned(tombstone_lifetime, now))]


def keys(registrations: Iterable[Registration]) -> list[str]:
    return [r.key for r in registrations]


def subkeys(registrations: Iterable[Registration]) -> list[str]:
    return [r.subkey for r in registrations]


class RegistrationDB:
    """
    nsqlookupd's registrations (pure, single-threaded: the reactor is the lock).

    Besides Go's one map, three indexes (by category, by category and key, by
    peer) make ``/lookup``, ``/channels`` and a disconnect cost what they touch
    rather than a scan of every registration; results come out in the same
    order a scan would give.
    """

    def __init__(self) -> None:
        self._map: dict[Registration, dict[str, Producer]] = {}
        self._by_category: dict[str, dict[Registration, None]] = {}
        self._by_key: dict[tuple[str, str], dict[Registration, None]] = {}
        self._by_peer: dict[str, dict[Registration, None]] = {}

    # --- Go's primitives --------------------------------------------------------

    def _producers(self, key: Registration) -> dict[str, Producer]:
        producers = self._map.get(key)
        if producers is None:
            producers = self._map[key] = {}
            self._by_category.setdefault(key.category, {})[key] = None
            self._by_key.setdefault((key.category, key.key), {})[key] = None
        return producers

    def add_registration(self, key: Registration) -> None:
        """Make sure ``key`` exists (with no producers if it is new)."""
        self._producers(key)

    def add_producer(self, key: Registration, producer: Producer) -> bool:
        """Register ``producer`` under ``key``; False if that peer was already there."""
        producers = self._producers(key)
        peer_id = producer.peer.id
        if peer_id in producers:
            return False
        producers[peer_id] = producer
        self._by_peer.setdefault(peer_id, {})[key] = None
        return True

    def remove_producer(self, key: Registration, peer_id: str) -> tuple[bool, int]:
        """Remove a peer from ``key`` (the key stays); (was it there, producers left)."""
        producers = self._map.get(key)
        if producers is None:
            return False, 0
        removed = producers.pop(peer_id, None) is not None
        if removed:
            self._unindex_peer(peer_id, key)
        return removed, len(producers)

    def remove_registration(self, key: Registration) -> None:
        producers = self._map.pop(key, None)
        if producers is None:
            return
        for peer_id in producers:
            self._unindex_peer(peer_id, key)
        same_category = self._by_category[key.category]
        del same_category[key]
        if not same_category:
            del self._by_category[key.category]
        same_key = self._by_key[(key.category, key.key)]
        del same_key[key]
        if not same_key:
            del self._by_key[(key.category, key.key)]

    def _unindex_peer(self, peer_id: str, key: Registration) -> None:
        keys = self._by_peer.get(peer_id)
        if keys is not None:
            keys.pop(key, None)
            if not keys:
                del self._by_peer[peer_id]

    def _candidates(self, category: str, key: str) -> Iterable[Registration]:
        if key == WILDCARD:
            return self._by_category.get(category, {})
        return self._by_key.get((category, key), {})

    def find_registrations(self, category: str, key: str, subkey: str) -> list[Registration]:
        if key != WILDCARD and subkey != WILDCARD:
            k = Registration(category, key, subkey)
            return [k] if k in self._map else []
        return [k for k in self._candidates(category, key) if k.is_match(category, key, subkey)]

    def find_producers(self, category: str, key: str, subkey: str) -> list[Producer]:
        """Producers under every matching key, each peer once."""
        if key != WILDCARD and subkey != WILDCARD:
            return list(self._map.get(Registration(category, key, subkey), {}).values())
        seen: dict[str, Producer] = {}
        for k in self._candidates(category, key):
            if k.is_match(category, key, subkey):
                for peer_id, producer in self._map[k].items():
                    seen.setdefault(peer_id, producer)
        return list(seen.values())

    def lookup_registrations(self, peer_id: str) -> list[Registration]:
        """Every key the peer is registered under."""
        return list(self._by_peer.get(peer_id, {}))

    def items(self) -> Iterator[tuple[Registration, dict[str, Producer]]]:
        return iter(list(self._map.items()))

    def __contains__(self, key: Registration) -> bool:
        return key in self._map

    def __len__(self) -> int:
        return len(self._map)

    # --- what the TCP protocol does -------------------------------------------------

    def identify(self, peer: PeerInfo) -> bool:
        """An nsqd identified: it becomes a ``client`` producer."""
        return self.add_producer(Registration(CLIENT), Producer(peer))

    def register(self, peer: PeerInfo, topic: str, channel: str = "") -> list[Registration]:
        """REGISTER: the channel (if any) and always the topic; the keys newly added to."""
        added = []
        if channel:
            key = Registration(CHANNEL, topic, channel)
            if self.add_producer(key, Producer(peer)):
                added.append(key)
        key = Registration(TOPIC, topic)
        if self.add_producer(key, Producer(peer)):
            added.append(key)
        return added

    def unregister(self, peer: PeerInfo, topic: str, channel: str = "") -> list[Registration]:
        """
        UNREGISTER, as nsqlookupd does it; returns the keys the peer left.

        With a channel: leave that channel; an ``#ephemeral`` channel left with
        no producers is removed.  Without one: leave every channel of the topic
        (nsqd normally unregisters those first; nsqlookupd logs a warning for
        each it still finds), then the topic; an ``#ephemeral`` topic left with
        no producers is removed.  Other keys stay, empty.
        """
        removed_from = []
        if channel:
            key = Registration(CHANNEL, topic, channel)
            removed, left = self.remove_producer(key, peer.id)
            if removed:
                removed_from.append(key)
            if left == 0 and is_ephemeral(channel):
                self.remove_registration(key)
            return removed_from
        for key in self.find_registrations(CHANNEL, topic, WILDCARD):
            removed, _ = self.remove_producer(key, peer.id)
            if removed:
                log.warn("client({peer}) unexpected UNREGISTER category:{category} key:{key} subkey:{subkey}",
                         peer=peer.id, category=CHANNEL, key=topic, subkey=key.subkey)
                removed_from.append(key)
        key = Registration(TOPIC, topic)
        removed, left = self.remove_producer(key, peer.id)
        if removed:
            removed_from.append(key)
        if left == 0 and is_ephemeral(topic):
            self.remove_registration(key)
        return removed_from

    def remove_peer(self, peer_id: str) -> list[Registration]:
        """The peer's connection closed: it leaves every key (the keys stay)."""
        removed_from = []
        for key in self.lookup_registrations(peer_id):
            removed, _ = self.remove_producer(key, peer_id)
            if removed:
                removed_from.append(key)
        return removed_from

    # --- what the HTTP API does ---------------------------------------------------

    def topics(self) -> list[str]:
        """``/topics``: every topic key, producers or not."""
        return keys(self.find_registrations(TOPIC, WILDCARD, ""))

    def channels(self, topic: str) -> list[str]:
        """``/channels``: every channel key of the topic, producers or not."""
        return subkeys(self.find_registrations(CHANNEL, topic, WILDCARD))

    def has_topic(self, topic: str) -> bool:
        return Registration(TOPIC, topic) in self._map

    def topic_producers(self, topic: str, inactive_timeout: float, tombstone_lifetime: float,
                        now: float) -> list[PeerInfo]:
        """``/lookup``'s producers: active and not tombstoned."""
        producers = self.find_producers(TOPIC, topic, "")
        return [p.peer for p in filter_by_active(producers, inactive_timeout, tombstone_lifetime, now)]

    def create_topic(self, topic: str) -> None:
        self.add_registration(Registration(TOPIC, topic))

    def delete_topic(self, topic: str) -> None:
        """Drop the topic and all its channels, whoever produces them (no nsqd is told)."""
        for key in self.find_registrations(CHANNEL, topic, WILDCARD):
            self.remove_registration(key)
        for key in self.find_registrations(TOPIC, topic, ""):
            self.remove_registration(key)

    def create_channel(self, topic: str, channel: str) -> None:
        self.add_registration(Registration(CHANNEL, topic, channel))
        self.add_registration(Registration(TOPIC, topic))

    def delete_channel(self, topic: str, channel: str) -> bool:
        """Drop the channel's key; False if there was none."""
        found = self.find_registrations(CHANNEL, topic, channel)
        for key in found:
            self.remove_registration(key)
        return bool(found)

    def tombstone_topic_producer(self, topic: str, node: str, now: float) -> int:
        """Tombstone the topic's producer whose ``broadcast_address:http_port`` is ``node``;
        how many matched (0 is not an error)."""
        n = 0
        for producer in self.find_producers(TOPIC, topic, ""):
            if producer.peer.http_node == node:
                producer.tombstone(now)
                n += 1
        return n

    def nodes(self, inactive_timeout: float, tombstone_lifetime: float,
              now: float) -> list[tuple[PeerInfo, list[str], list[bool]]]:
        """
        ``/nodes``: each active nsqd with its topics and, per topic, whether it is
        tombstoned there.  Tombstoned nodes are listed (only the inactivity
        timeout filters), so nsqadmin can show them.
        """
        clients = filter_by_active(self.find_producers(CLIENT, "", ""), inactive_timeout, 0.0, now)
        by_topic: dict[str, list[Producer]] = {}
        out = []
        for client in clients:
            topics = [k.key for k in self.lookup_registrations(client.peer.id)
                      if k.is_match(TOPIC, WILDCARD, "")]
            tombstones = []
            for topic in topics:
                if topic not in by_topic:
                    by_topic[topic] = self.find_producers(TOPIC, topic, "")
                flag = False
                for producer in by_topic[topic]:
                    if producer.peer is client.peer:
                        flag = producer.is_tombstoned(tombstone_lifetime, now)
                        break
                tombstones.append(flag)
            out.append((client.peer, topics, tombstones))
        return out
