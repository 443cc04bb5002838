"""
nsqlookupd without I/O: the registration DB, the peers it holds, protocol V1 and the options.

* :mod:`nsqtw.lookupd.registry` -- ``RegistrationDB`` (client/topic/channel keys,
  ``*`` wildcards, tombstones, ``filter_by_active``);
* :mod:`nsqtw.lookupd.peers` -- ``PeerInfo`` and IDENTIFY decoding;
* :mod:`nsqtw.lookupd.v1` -- ``LookupSession`` (server side) and nsqd's client-side codec;
* :mod:`nsqtw.lookupd.options` -- ``LookupdOptions``.

The Twisted glue lives in :mod:`nsqtw.tcp.lookupd`, :mod:`nsqtw.http.lookupd_api`
and :mod:`nsqtw.service.lookupd`; nsqd's side in :mod:`nsqtw.service.lookup_peers`.
"""
