"""
nsqlookupd without I/O: the registration DB, the peers it holds, protocol V1 and the options.

* :mod:`nsqtw.lookupd.core.registry` -- ``RegistrationDB`` (client/topic/channel keys,
  ``*`` wildcards, tombstones, ``filter_by_active``);
* :mod:`nsqtw.lookupd.core.peers` -- ``PeerInfo`` and IDENTIFY decoding;
* :mod:`nsqtw.lookupd.core.v1` -- ``LookupSession`` (server side) and nsqd's client-side codec;
* :mod:`nsqtw.lookupd.options` -- ``LookupdOptions``.

The Twisted glue lives in :mod:`nsqtw.lookupd.tcp`, :mod:`nsqtw.lookupd.http`
and :mod:`nsqtw.lookupd.service`; nsqd's side in :mod:`nsqtw.nsqd.lookup_peers`.
"""
