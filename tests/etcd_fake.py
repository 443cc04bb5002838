"""An in-memory stand-in for :class:`nsqtw.nsqd.etcd.EtcdGateway` (the same coroutine methods):
keys, leases and transactions as etcd keeps them, with a switch that makes it unreachable."""

from __future__ import annotations

from typing import Any

from nsqtw.nsqd.etcd import EtcdError, KeyValue


class FakeGateway:
    def __init__(self) -> None:
        self.kv: dict[bytes, KeyValue] = {}
        self.leases: dict[int, int] = {}
        self.next_lease = 100
        self.revision = 1
        self.down = False
        self.calls: list[str] = []
        #: one-shot: the next create of this key finds it created by another lease first
        self.race: dict[bytes, bytes] = {}

    def _check(self, name: str) -> None:
        self.calls.append(name)
        if self.down:
            raise EtcdError("no etcd endpoint answered (fake: down)")

    def expire(self, lease: int) -> None:
        """The lease ends (expired or revoked): its keys go."""
        self.leases.pop(lease, None)
        self.kv = {k: v for k, v in self.kv.items() if v.lease != lease}

    def held(self, key: bytes) -> bytes | None:
        kv = self.kv.get(key)
        return None if kv is None else kv.value

    async def grant(self, ttl: int) -> tuple[int, int]:
        self._check("grant")
        self.next_lease += 1
        self.leases[self.next_lease] = ttl
        return self.next_lease, ttl

    async def keepalive(self, lease: int) -> int:
        self._check("keepalive")
        return self.leases.get(lease, 0)

    async def revoke(self, lease: int) -> None:
        self._check("revoke")
        self.expire(lease)

    async def put(self, key: bytes, value: bytes, lease: int = 0) -> None:
        self._check("put")
        if lease and lease not in self.leases:
            raise EtcdError("etcdserver: requested lease not found")
        self.revision += 1
        old = self.kv.get(key)
        self.kv[key] = KeyValue(key, value, lease, old.create_revision if old else self.revision)

    async def get(self, key: bytes) -> KeyValue | None:
        self._check("get")
        return self.kv.get(key)

    async def get_prefix(self, prefix: bytes) -> list[KeyValue]:
        self._check("get_prefix")
        return [v for k, v in sorted(self.kv.items()) if k.startswith(prefix)]

    async def create(self, key: bytes, value: bytes, lease: int = 0,
                     absent: tuple[bytes, ...] = ()) -> tuple[bool, dict[bytes, KeyValue]]:
        self._check("create")
        if key in self.race:
            self.revision += 1
            self.kv[key] = KeyValue(key, self.race.pop(key), 999, self.revision)
        keys = (key, *absent)
        if all(k not in self.kv for k in keys):
            await self.put(key, value, lease)
            return True, {}
        return False, {k: self.kv[k] for k in keys if k in self.kv}

    def close(self) -> Any:
        return None
