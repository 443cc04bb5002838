"""
nsqd's service tree: the one composition root used by twistd, the CLIs and embedding.

:class:`NsqdService` is a ``MultiService`` whose children listen on the TCP,
HTTP and HTTPS addresses, run the queue scan on a ``LoopingCall``, and (when
configured) keep the disk queues synced, talk to nsqlookupd and export stats.
It owns the :class:`~nsqtw.nsqd.core.broker.Broker` and is the "node" the HTTP API
and TCP glue ask for the time, the current options and to settle work.
"""

from __future__ import annotations

import os
import random
from functools import partial
from typing import Any, cast

from twisted.application.service import MultiService
from twisted.internet import defer
from twisted.logger import Logger

from .core.broker import Broker, Event
from .core.scan import ChannelSampler, scan_channels
from .core.v2 import Features
from ..options import TLS_REQUIRED, NsqdOptions, OptionError, format_duration
from .tcp import NsqdFactory
from ..backend.durability import fsync
from ..runtime.loop import LoopService
from ..runtime.turn import IReactorWorkMeter, TurnBatcher
from ..runtime.listen import LazyFactory, ListeningService

__all__ = ["NsqdService", "build_nsqd"]

log = Logger(namespace="nsqtw.nsqd")

#: seconds between attempts to write messages the disk refused (see nsqtw.nsqd.core.backlog)
HELD_RETRY_INTERVAL = 1.0
#: while a stop waits for disk space: seconds between attempts, and between log lines
STOP_RETRY_INTERVAL = 0.5
STOP_WAIT_LOG_INTERVAL = 5.0
#: the file in the data path that keeps room for the final flush (deleted at the stop)
RESERVE_NAME = "nsqd.reserve"


def _import_http_api() -> None:
    """The HTTP API's imports (klein, werkzeug, twisted.web): the slow part of building it."""
    import nsqtw.nsqd.http  # noqa: F401
    import nsqtw.runtime.responses  # noqa: F401


class NsqdService(MultiService):
    """One nsqd: broker, storage, listeners and timers."""

    #: where its listeners log "TCP: listening on ..." (the daemon a line belongs to)
    log_namespace = "nsqtw.nsqd"

    def __init__(self, options: NsqdOptions, reactor: Any, *, rng: random.Random | None = None,
                 backend_factory: Any = None, sync_thread: bool = True, throwaway: bool = False,
                 etcd: Any = None) -> None:
        """``sync_thread=False`` runs disk syncs inline (starting the thread is most of a
        start-up); ``throwaway=True`` (a data directory deleted on stop: embedded brokers, test
        fixtures) also skips every fsync, so the inline disk work stays cheap on any disk."""
        super().__init__()
        from ..backend.disk import SyncWorker, disk_backends
        from ..backend.dirlock import DirLock

        self.options = options
        self.reactor = reactor
        #: this node in etcd (--etcd-endpoints: an :class:`~nsqtw.nsqd.etcd.EtcdSession`), or None
        self.etcd = etcd
        self.rng = rng or random.Random()
        self.data_path = options.data_path or os.getcwd()
        self.dirlock = DirLock(self.data_path)
        #: end-of-turn work (delivery settling, sync submission): once per reactor turn, the
        #: same on every reactor
        self.turn = TurnBatcher(reactor)
        # first child: MultiService stops children in reverse, so the disk worker stops last
        #: a data directory deleted on stop: no fsync, no reserve for the final flush
        self.throwaway = throwaway
        self.sync_worker = SyncWorker(reactor, threaded=sync_thread and not throwaway, fsync=not throwaway,
                                      turn=self.turn)
        self.sync_worker.setServiceParent(self)
        factory = backend_factory or disk_backends(options, self.sync_worker, self.data_path)
        #: this process's identity on replication links (tells a node from itself)
        self.instance = os.urandom(16)
        #: the links to --replica-peer nodes (None: not replicated, the plain broker's publish)
        self.replication: Any = None
        self.broker: Broker
        #: the secret replication links prove (None: no replication, or --replication-insecure)
        self.replication_secret: bytes | None = None
        if options.replication_secret_file:
            from .replication import read_secret
            self.replication_secret = read_secret(options.replication_secret_file)
        from ..runtime.tls import replication_contexts
        try:
            #: (server, client) TLS contexts of the replication links (--replication-tls), or None
            replication_tls = replication_contexts(options)
        except ValueError as e:
            raise OptionError(str(e)) from None
        if options.replica_peers:
            from .core.replication import ReplicatedBroker
            from .replication import ReplicationService
            self.replication = ReplicationService(options, reactor, instance=self.instance,
                                                  name=options.broadcast_address, turn=self.turn,
                                                  data_path=self.data_path, secret=self.replication_secret,
                                                  tls=replication_tls[1] if replication_tls else None)
            self.broker = ReplicatedBroker(options, reactor.seconds(), hooks=self.replication.hooks,
                                           backend_factory=factory, rng=self.rng)
            self.replication.attach(self.broker)
        else:
            self.broker = Broker(options, reactor.seconds(), backend_factory=factory, rng=self.rng)
        from .deadletters import DeadLetterFiles
        from .policies import PolicyFile
        durable_files = options.sync_every == 1 and not throwaway
        self.broker.clock = reactor.seconds
        self.broker.dead_sinks = DeadLetterFiles(self.data_path, fsync=durable_files)
        #: channels' policies between runs (nsqtw.policies.json)
        self.policy_file = PolicyFile(self.data_path, fsync=durable_files)
        from ..backend.metadata import MetadataWriter, TopicFragments, write_fragments
        self.metadata_fragments = TopicFragments(self.broker.topics)
        self.metadata_writer = MetadataWriter(self.metadata_fragments,
                                              partial(write_fragments, self.data_path),
                                              self.sync_worker.submit, clock=reactor)
        from ..runtime.tls import server_context
        try:
            self.tls_context = server_context(options)
        except ValueError as e:
            raise OptionError(str(e)) from None
        self.features = Features(tls=self.tls_context is not None, snappy=options.snappy,
                                 deflate=options.deflate)
        self.authorizer = None
        if options.auth_http_addresses:
            from .auth_server import AuthServerClient
            self.authorizer = AuthServerClient(
                options.auth_http_addresses, options.auth_http_request_method, reactor,
                connect_timeout=options.http_client_connect_timeout,
                request_timeout=options.http_client_request_timeout, rng=self.rng)
        self.tcp_factory = NsqdFactory(self.broker, reactor, features=self.features, settle=self.settle,
                                       sync_barrier=self.sync_barrier if self.durable_publish else None,
                                       sync_hold=self.replication.hold if self.replication is not None
                                       and options.sync_every != 1 else None,
                                       tls_context=self.tls_context, authorizer=self.authorizer,
                                       turn=self.turn)
        self.tcp_factory.noisy = False
        self._settle_call: Any = None
        self._sampler = ChannelSampler(self.broker.channels, options.queue_scan_refresh_interval)
        self.broker.listeners.append(self._on_event)
        self.tcp_listener = ListeningService(reactor, options.tcp_address, self.tcp_factory, "TCP", "tcp-address")
        self.tcp_listener.setServiceParent(self)
        if self.replication is not None:
            self.replication.setServiceParent(self)
        self.shadow_files: Any = None
        self.shadow_factory: Any = None
        self.adoption: Any = None
        self.replication_listener: ListeningService | None = None
        if options.replication_address:
            from .replication import ShadowFactory, ShadowFiles
            self.shadow_files = ShadowFiles(self.data_path, fsync=options.sync_every == 1 and not throwaway)
            from .core.replication.shadow import SNAPSHOT_BATCH_BYTES
            allow = {int(n) for n in options.replication_allow}
            self.shadow_factory = shadow = ShadowFactory(
                options.node_id, self.instance, options.broadcast_address, self.shadow_files, reactor=reactor,
                timeout=options.replication_timeout, secret=self.replication_secret,
                allowed=(lambda origin: origin in allow) if allow else (lambda origin: True),
                # a batch is cut at about 4 MiB, plus the one publish that ends it
                max_frame=SNAPSHOT_BATCH_BYTES + max(options.max_body_size, options.max_msg_size) + 64 * 1024)
            listener: Any = shadow
            if replication_tls is not None:
                from twisted.protocols.tls import TLSMemoryBIOFactory
                listener = TLSMemoryBIOFactory(replication_tls[0], False, shadow)
            self.replication_listener = ListeningService(reactor, options.replication_address, listener,
                                                         "REPLICATION", "replication-address")
            self.replication_listener.setServiceParent(self)
            from .core.replication import AdoptAfterTimeout
            from .core.replication.maintenance import MaintenanceWindows
            from .replication import AdoptionService
            replication = self.replication
            self.adoption = AdoptionService(
                self.shadow_files, AdoptAfterTimeout(options.adopt_after), reactor, self._adopt,
                interval=min(0.25, options.adopt_after / 4), node_id=options.node_id,
                peers_holding=replication.peers_holding if replication is not None else (lambda origin: []),
                announce=shadow.announce, health=lambda: self.broker.health,
                arbiter=etcd.arbiter() if etcd is not None else None)
            shadow.adoption = self.adoption
            shadow.maintenance = self.adoption.maintenance = MaintenanceWindows()
            self.adoption.setServiceParent(self)
        self.http_listener: ListeningService | None = None
        self.https_listener: ListeningService | None = None
        if options.http_address:
            # the HTTP API (klein, werkzeug, twisted.web) is built just after start-up, or at the
            # first request: the TCP port must not wait for its imports
            site = LazyFactory(partial(self._http_site, options.tls_required == TLS_REQUIRED),
                               warm=_import_http_api)
            self.http_listener = ListeningService(reactor, options.http_address, site, "HTTP", "http-address")
            self.http_listener.setServiceParent(self)
        if self.tls_context is not None and options.https_address:
            from twisted.internet.endpoints import SSL4ServerEndpoint
            from ..runtime.listen import split_host_port
            host, port = split_host_port(options.https_address, "https-address")
            endpoint = SSL4ServerEndpoint(reactor, port, self.tls_context, interface=host or "0.0.0.0")
            self.https_listener = ListeningService(reactor, options.https_address,
                                                   LazyFactory(partial(self._http_site, False),
                                                               warm=_import_http_api), "HTTPS",
                                                   "https-address", endpoint=endpoint)
            self.https_listener.setServiceParent(self)
        LoopService(reactor, options.queue_scan_interval, self.scan_once, "queue-scan").setServiceParent(self)
        #: messages that could not be written at a clean shutdown (the disk refused them)
        self.lost_at_shutdown = 0
        LoopService(reactor, HELD_RETRY_INTERVAL, self.retry_held, "held-retry").setServiceParent(self)
        if options.stats_export_path:
            from .stats.export import StatsExportService
            StatsExportService(self).setServiceParent(self)
        if options.statsd_address:
            from .stats.statsd import StatsdService
            StatsdService(self).setServiceParent(self)
        # built only when there is an nsqlookupd to talk to (now, or after PUT /config)
        self.lookup_peers: Any = None
        if options.lookupd_tcp_addresses:
            self._lookup_peers_service()
        self._stopping: defer.Deferred | None = None
        from .drain import DrainService
        #: the drain (POST /drain, or a stop with --drain-timeout)
        self.drain = DrainService(self, reactor)
        self.drain.setServiceParent(self)
        #: called with ``(kind, doc)`` when the node's drain changes state (``"drain"``, the
        #: progress GET /drain shows) or its maintenance window is set or ended
        #: (``"maintenance"``, ``{"seconds": left}``): the hook a coordinator records them by
        self.state_listeners: list[Any] = []
        if self.etcd is not None:  # recorded in etcd where the cluster agrees (see nsqtw.nsqd.etcd)
            self.state_listeners.append(self._record_state)
        self.drain.listeners.append(lambda state, doc: self._state_changed("drain", doc))
        if self.shadow_factory is not None:  # a draining node takes no other node's backlog
            self.shadow_factory.refuse_handoff = lambda: "this node drains too" if self.drain.draining else ""
        if self.replication is not None:
            self.replication.maintenance_listeners.append(
                lambda seconds: self._state_changed("maintenance", {"seconds": seconds}))

    def _http_site(self, tls_only_http: bool) -> Any:
        from .http import NsqdHTTPAPI
        from ..runtime.responses import GoAccessLog, RouterResource, limited_site
        api = NsqdHTTPAPI(self, tls_only_http=tls_only_http)
        # Go's nsqd logs every HTTP answer at INFO except /pub and /mpub (http_api.Log)
        access = GoAccessLog("nsqtw.nsqd.http", frozenset((b"/pub", b"/mpub")))
        return limited_site(RouterResource(api.app), self._body_limit, self.reactor, access)

    # --- what the glue asks of the node ------------------------------------------

    def _body_limit(self, path: bytes | None) -> Any:
        """The most an HTTP request body may hold here, and nsqd's answer when it is more (for
        None, a path the HTTP layer could not read early: the largest limit of any path)."""
        opts = self.options
        if path is None:
            return max(opts.max_msg_size, opts.max_body_size), "BODY_TOO_BIG"
        if path == b"/pub":
            return opts.max_msg_size, "MSG_TOO_BIG"
        if path == b"/mpub":
            return opts.max_body_size, "BODY_TOO_BIG"
        if path.startswith(b"/config/"):
            return opts.max_msg_size, "INVALID_VALUE"
        return opts.max_body_size, "BODY_TOO_BIG"

    def now(self) -> float:
        return self.reactor.seconds()

    def settle(self) -> None:
        """Deliver and write everything that became possible; keep pumping big backlogs."""
        broker = self.broker
        broker.settle(self.reactor.seconds())
        if broker.busy() and self._settle_call is None:
            self._settle_call = self.reactor.callLater(0, self._settle_again)

    def _settle_again(self) -> None:
        self._settle_call = None
        self.settle()

    def scan_once(self) -> None:
        now = self.reactor.seconds()
        opts = self.options
        scan_channels(self._sampler.channels(now), now, self.rng,
                      opts.queue_scan_selection_count, opts.queue_scan_dirty_percent)
        self.broker.wake_throttled()
        self.settle()

    def retry_held(self) -> None:
        """Write the messages held in memory since the disk refused them, if it accepts now."""
        backlog = self.broker.backlog
        if backlog.channels:
            backlog.retry()
            if not backlog.channels:
                self.broker.resume_pumps()
            self.settle()

    def _on_event(self, event: str, topic: str, channel: str | None) -> None:
        if event == Event.POLICY or (event in (Event.CHANNEL_DELETED, Event.TOPIC_DELETED)
                                     and os.path.exists(self.policy_file.path)):
            self.save_policies()
            if event == Event.POLICY:
                return
        self.metadata_fragments.touch(topic)
        if event in (Event.CHANNEL_CREATED, Event.CHANNEL_DELETED, Event.TOPIC_DELETED):
            self._sampler.stale = True
        if event != Event.PAUSED and event != Event.EMPTIED and not self.broker.loading and not self.broker.exiting:
            if not topic.endswith("#ephemeral") and not (channel or "").endswith("#ephemeral"):
                self.persist_metadata()

    def save_policies(self) -> None:
        """Rewrite nsqtw.policies.json (a policy was set, or a channel with one went)."""
        if self.broker.loading:
            return
        try:
            self.policy_file.save(self.broker)
        except OSError as e:
            log.error("failed to write {path}: {e}", path=self.policy_file.path, e=e)

    def persist_metadata(self, urgent: bool = False) -> defer.Deferred:
        """Rewrite nsqd.dat (on create, delete, pause, unpause and exit), off the reactor thread;
        coalesced (see :class:`~nsqtw.backend.metadata.MetadataWriter`).  Fires once a rewrite
        covering every change so far is done; a failure is logged by the writer."""
        d = self.metadata_writer.request(urgent)
        d.addErrback(lambda f: None)
        return d

    @property
    def durable_publish(self) -> bool:
        """True when a publisher's answer waits for :meth:`sync_barrier` (``--sync-every=1``,
        or replication)."""
        return self.options.sync_every == 1 or self.replication is not None

    def sync_barrier(self) -> defer.Deferred:
        """Fires once everything published so far is as durable as promised: fsynced with
        ``--sync-every=1``, stored by ``--replication-min-acks`` peers when replicated (both
        when both); fails (``PUB failed <reason>``) when that cannot be had."""
        if self.replication is None:
            return self.sync_worker.flush_and_sync_all()
        replicated = self.replication.barrier()
        if self.options.sync_every != 1:
            return replicated
        both = defer.gatherResults([self.sync_worker.flush_and_sync_all(), replicated], consumeErrors=True)
        both.addErrback(lambda f: f.value.subFailure if isinstance(f.value, defer.FirstError) else f)
        return both

    def replication_health(self) -> tuple[bool, str] | None:
        """``(ok, text)`` of replication for /ping; None when not replicated: not ok while
        publishes are refused, or while this node cannot store its origins' batches (a full
        disk) or finish an adoption."""
        etcd_ok, etcd_text = self.etcd.health() if self.etcd is not None else (True, "OK")
        if self.replication is None and self.shadow_files is None:
            return None if etcd_ok else (False, etcd_text)
        ok, text = self.replication.health() if self.replication is not None else (True, "OK")
        problems = [] if etcd_ok else [etcd_text.removeprefix("NOK - ")]
        if self.shadow_files is not None:
            if self.shadow_factory.store_error:
                problems.append(f"storing origins' batches failed: {self.shadow_factory.store_error}")
            for o, (why, _, _) in sorted(self.adoption.failures.items()):
                problems.append(f"adopting node {o} failed: {why}")
        if not problems:
            return ok, text
        detail = "; ".join(problems)
        return False, f"{text}; {detail}" if text.startswith("NOK") else f"NOK - {detail}"

    def replication_stats(self) -> dict[str, Any] | None:
        if self.replication is None and self.shadow_files is None:
            return None
        doc: dict[str, Any] = self.replication.stats() if self.replication is not None else {}
        if self.shadow_files is not None and self.shadow_factory.maintenance is not None:
            left = self.shadow_factory.maintenance.remaining(self.reactor.seconds())
            if left:
                doc["maintenance_windows"] = [{"origin_node_id": o, "remaining_seconds": s}
                                              for o, s in left.items()]
        if self.adoption is not None and self.adoption.handed_over:
            doc["handed_over"] = [{"origin_node_id": o, "messages": n, "at": when}
                                  for o, n, when in self.adoption.handed_over]
        if self.shadow_files is not None:
            doc["shadows"] = self.shadow_files.stats()
            doc["adopted"] = self.adoption.stats()
            doc["adoption"] = self.adoption.status()
            doc["origins"] = self.shadow_factory.link_stats()
            doc["store_error"] = self.shadow_factory.store_error
        if self.etcd is not None:
            doc["etcd"] = self.etcd.stats()
        return doc

    def _adopt(self, origin: int, state: Any, done: set[bytes]) -> tuple[int, int, defer.Deferred[Any] | None]:
        """Republish an adopted origin's unfinished messages here (see core.replication.adopt),
        skipping those in ``done`` (an earlier try's); the new topics and channels are
        registered with nsqlookupd as any others.  The Deferred fires once this node's own
        peers stored them (None: not replicated, or nothing adopted)."""
        from .core.replication import adopt
        adopted, refused = adopt(self.broker, state, self.reactor.seconds(), done)
        stored = None
        if self.replication is not None and adopted and not refused:
            stored = self._replicate_adopted(state)
        self.settle()
        return adopted, refused, stored

    def _replicate_adopted(self, state: Any) -> defer.Deferred[Any]:
        """Onward replication: adopted messages go to this node's own peers before they are
        delivered here, as a new snapshot of everything outstanding (sent a window at a
        time, so a large adopted backlog is never one batch or in memory whole).  Every topic
        and channel that got them is held paused until ``--replication-min-acks`` peers
        stored it (or, with too few peers in sync, until that is known: then they are
        delivered anyway, the peers get them with their next catch-up); what the origin had
        paused stays paused."""
        targets: list[Any] = []
        for name in state.unfinished_topics():
            t = self.broker.topics.get(name)
            if t is not None:
                candidates: list[Any] = [t, *t.channels.values()]
                targets.extend(x for x in candidates if not x.paused)
        d = self.replication.restream()  # taken before the hold: the peers see them unpaused
        held: list[Any] = []
        for target in targets:
            target.pause()
            held.append(target)

        def release(result: Any) -> Any:
            if result is not None:
                log.warn("REPLICATION: adopted messages delivered before the peers stored them: {why}",
                         why=result.getErrorMessage())
            for target in held:
                target.unpause()
            self.settle()
            return result

        stored: defer.Deferred[Any] = defer.Deferred()
        d.addCallbacks(lambda _: release(None), release)
        # too few peers stored it then (a partition): it is stored once enough are in sync
        # again (their catch-up snapshot holds it), and only then may the other survivors drop
        # their copy of the origin
        d.addCallbacks(stored.callback, lambda _: self.replication.when_in_sync().chainDeferred(stored))
        return stored

    def set_options(self, **changes: Any) -> None:
        self.options = self.options.replace(**changes)
        self.broker.options = self.options

    def set_lookupd_addresses(self, addresses: list[str]) -> None:
        """PUT /config/nsqlookupd_tcp_addresses: drop removed peers, connect new ones."""
        self.set_options(lookupd_tcp_addresses=list(addresses))
        if self.lookup_peers is None and not addresses:
            return
        self._lookup_peers_service().set_addresses(list(addresses))

    def _lookup_peers_service(self) -> Any:
        if self.lookup_peers is None:
            from .lookup_peers import LookupPeersService
            self.lookup_peers = LookupPeersService(self)
            self.lookup_peers.setServiceParent(self)
        return self.lookup_peers

    # --- addresses ------------------------------------------------------------

    @property
    def tcp_port(self) -> int | None:
        return self.tcp_listener.bound_port

    @property
    def http_port(self) -> int | None:
        return self.http_listener.bound_port if self.http_listener else None

    @property
    def https_port(self) -> int | None:
        return self.https_listener.bound_port if self.https_listener else None

    @property
    def replication_port(self) -> int | None:
        return self.replication_listener.bound_port if self.replication_listener else None

    def ready(self) -> defer.Deferred:
        """Fires (with this service) once every listener is bound."""
        waits = [s.ready for s in (self.tcp_listener, self.http_listener, self.https_listener,
                                   self.replication_listener) if s is not None]
        d = defer.gatherResults(waits, consumeErrors=True)
        d.addCallback(lambda _: self)
        return d

    # --- lifecycle --------------------------------------------------------------

    def startService(self) -> None:
        """Lock the data path, load nsqd.dat and the queues, then start listening."""
        from ..backend.metadata import MetadataError, load_metadata, metadata_from_broker, write_metadata

        self.dirlock.lock()
        broker = self.broker
        try:
            metadata = load_metadata(self.data_path, warn=lambda text: log.warn("{text}", text=text))
            broker.loading = True
            try:
                now = self.reactor.seconds()
                for tmd in (metadata.topics if metadata else ()):
                    topic = broker.get_topic(tmd.name, now)
                    if tmd.paused:
                        topic.pause()
                    for cmd in tmd.channels:
                        ch = topic.get_channel(cmd.name, now)
                        if cmd.paused:
                            ch.pause()
                for (t, c), policy in self.policy_file.load().items():
                    found = broker.topics.get(t)
                    policed = found.channels.get(c) if found is not None else None
                    if policed is not None:
                        policed.set_policy(policy, now)
            finally:
                broker.loading = False
            if self.shadow_files is not None:
                self.shadow_files.load()  # the origins' shadows this node keeps
                from .replication import load_windows
                for origin, until in load_windows(self.data_path).items():  # maintenance windows
                    self.shadow_factory.maintenance.restore(origin, until)
            # as Go's nsqd, refuse to start when nsqd.dat cannot be written (read-only data path)
            try:
                self.sync_worker.run_here(partial(write_metadata, self.data_path, metadata_from_broker(broker)))
            except OSError as e:
                raise MetadataError(f"failed to persist metadata - {e}") from None
        except Exception:
            self.dirlock.unlock()
            raise
        self._make_reserve()
        try:
            super().startService()
        except Exception:
            self._abort_start()
            raise
        self.settle()
        meter = IReactorWorkMeter(self.reactor, None)
        if meter is not None:
            meter.measure_work(self.work_done)
            if self.replication_listener is not None:
                from .replication import PEER_SPIN_SECONDS

                meter.spin_at_least(PEER_SPIN_SECONDS, yielding=True)

    def work_done(self) -> int:
        """Messages published here, delivered and finished by the connected clients, and
        stored for origins: the spin reactor's measure of its tuning (read once per 0.2 s,
        see :class:`~nsqtw.runtime.turn.IReactorWorkMeter`)."""
        broker = self.broker
        done = sum(t.message_count for t in broker.topics.values())
        done += sum(c.message_count + c.finish_count for c in broker.clients.values())
        return done + (self.shadow_files.stored if self.shadow_files is not None else 0)

    def _abort_start(self) -> None:
        """A listener could not bind: close what did, release the data path, stay stopped."""
        self.running = 0
        for svc in list(self):
            port = getattr(svc, "port", None)
            if port is not None:
                port.stopListening()
                svc.port = None
            if svc.running and svc is not self.sync_worker:
                try:
                    svc.stopService()
                except Exception:
                    pass
        self.sync_worker.stopService()
        self.dirlock.unlock()

    def _record_state(self, kind: str, doc: dict[str, Any]) -> None:
        """A drain or maintenance state goes to etcd (``<prefix>/nodes/<id>/state``); a node
        serving again, or a window ended, removes it there."""
        over = doc.get("state") == "serving" if kind == "drain" else not doc.get("seconds")
        self.etcd.record_state(kind, None if over else doc).addErrback(lambda f: None)  # logged there

    def _state_changed(self, kind: str, doc: dict[str, Any]) -> None:
        for listener in list(self.state_listeners):
            try:
                listener(kind, doc)
            except Exception:
                log.failure("a state listener failed")

    def stopService(self) -> defer.Deferred:
        """nsqd's Exit: stop listening, close every client, write everything held to disk;
        with ``--drain-timeout``, after draining for at most that long."""
        if self._stopping is not None:
            return self._stopping
        if self.options.drain_timeout > 0 and self.running and self.drain.running:
            d = self.drain.drain_for_stop(self.options.drain_timeout)
            d.addCallback(lambda _: self._stop_now())
            self._stopping = d
            return d
        self._stopping = self._stop_now()
        return self._stopping

    def _stop_now(self) -> defer.Deferred:
        meter = IReactorWorkMeter(self.reactor, None)
        if meter is not None:
            meter.measure_work(None)
        broker = self.broker
        broker.close()
        if self.replication_listener is not None:
            self.shadow_factory.close_links()
        for proto in list(self.tcp_factory.protocols):
            proto._stop_timers()
            proto.transport.loseConnection()
        if self._settle_call is not None and self._settle_call.active():
            self._settle_call.cancel()
        self._settle_call = None
        # the listeners and timers stop first (children but the sync worker, in reverse)
        self.running = 0
        waits = []
        for svc in reversed(list(self)):
            if svc is not self.sync_worker:
                waits.append(defer.maybeDeferred(svc.stopService))
        self._release_reserve()
        d = self._wait_for_disk()

        def flush(_: Any) -> Any:
            # after the wait: the last nsqd.dat rewrite (everything, from the broker itself)
            # needs disk space too
            self.metadata_fragments.touch()
            waits.append(self.persist_metadata(urgent=True))
            return defer.DeferredList(waits + self._flush_queues(), consumeErrors=True)

        d.addCallback(flush)

        def stop_worker(_: Any) -> Any:
            if self.shadow_files is not None:
                self.shadow_files.close()
            return defer.maybeDeferred(self.sync_worker.stopService)

        def unlock(result: Any) -> Any:
            self.dirlock.unlock()
            return result

        d.addCallback(stop_worker)
        d.addBoth(unlock)
        return d

    # --- the disk at a stop ---------------------------------------------------------

    @property
    def reserve_path(self) -> str:
        return os.path.join(self.data_path, RESERVE_NAME)

    def _make_reserve(self) -> None:
        """A small file of zeros in the data path, released (deleted) at the stop: room for
        the final flush even when the disk filled meanwhile.  Best effort: a disk too full
        for it at start only logs a warning."""
        size = self.options.disk_reserve_bytes
        if size <= 0 or self.throwaway:  # a throwaway directory's contents are never needed
            return
        try:
            fd = os.open(self.reserve_path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o600)
            try:
                if os.fstat(fd).st_size < size:
                    os.pwrite(fd, bytes(size), 0)
                    fsync(fd)
            finally:
                os.close(fd)
        except OSError as e:
            log.warn("cannot reserve {n} bytes in {path} for the final flush - {err}",
                     n=size, path=self.reserve_path, err=e)

    def _release_reserve(self) -> None:
        try:
            os.unlink(self.reserve_path)
        except FileNotFoundError:
            pass
        except OSError as e:
            log.warn("cannot release the reserved space {path} - {err}", path=self.reserve_path, err=e)

    def _wait_for_disk(self) -> defer.Deferred:
        """Before the final flush: every message in flight goes back to its channel (to disk,
        or held if the disk refuses it) and, while messages are held, the stop waits for
        space -- retrying every half second, saying every few seconds how many and how long
        it still waits -- for at most ``--stop-disk-wait``.  Fires when nothing is held or
        the wait is over (the flush then counts what it cannot write as lost)."""
        broker = self.broker
        now = self.reactor.seconds()
        backlog = broker.backlog
        topics = []
        for topic in list(broker.topics.values()):
            if topic.ephemeral:
                continue
            for ch in list(topic.channels.values()):
                if ch.ephemeral:
                    continue
                if ch.inflight:
                    ch.requeue_all_in_flight()
                # everything in memory now belongs on disk: what it refuses counts as held
                ch.mem.capacity = 0
                if ch.mem.depth():
                    backlog.channels[ch] = None
            if topic.mem.depth():
                topics.append(topic)
        if not backlog.channels and not topics:
            return defer.succeed(None)
        deadline = now + self.options.stop_disk_wait
        done: defer.Deferred = defer.Deferred()
        said = [-1e18]

        def pending() -> int:
            backlog.retry()
            left = backlog.count()
            for topic in list(topics):
                if not _write_topic_memory(topic):
                    topics.remove(topic)
                else:
                    left += topic.mem.depth()
            return left

        def step() -> None:
            n = pending()
            t = self.reactor.seconds()
            if not n:
                if said[0] > -1e18:  # only after saying it waited
                    log.info("stopping: the disk accepted every held message")
                done.callback(None)
                return
            if t >= deadline:
                log.error("stopping: gave up waiting for disk space after {wait}; {n} held messages "
                          "cannot be written", wait=format_duration(self.options.stop_disk_wait), n=n)
                done.callback(None)
                return
            if t - said[0] >= STOP_WAIT_LOG_INTERVAL:
                said[0] = t
                log.warn("stopping: {n} acknowledged messages are held in memory because the disk "
                         "refuses writes ({err}); waiting up to {left:.0f}s more for space "
                         "(--stop-disk-wait)", n=n, err=backlog.error, left=deadline - t)
            self.reactor.callLater(STOP_RETRY_INTERVAL, step)

        step()
        return done

    def _flush_queues(self) -> list[defer.Deferred]:
        """Write every topic's and channel's memory queue, in-flight and deferred messages to
        their backends and close them (nsqd's Topic/Channel exit without deletion).

        What the disk refuses (a full disk) is counted in ``lost_at_shutdown`` and logged
        as critical; the command-line nsqd then exits with status 1."""
        closing: list[defer.Deferred] = []
        lost = self.broker.flush_to_backends(lambda backend: closing.append(defer.maybeDeferred(backend.close)))
        if lost:
            self.lost_at_shutdown += lost
            log.critical("failed to write {n} messages to disk at shutdown (the disk refused them: "
                         "{err}); they are LOST", n=lost, err=self.broker.backlog.error or "see above")
        return closing


def _write_topic_memory(topic: Any) -> bool:
    """A stop: write a topic's memory queue to its disk queue; True if the disk refused some
    (kept in memory for the next try)."""
    from .core.backlog import spill_runs

    refused, _ = spill_runs(topic.backend, topic.mem.drain(), topic.mem)
    if refused is not None:
        topic.broker.backlog.error = refused
        return True
    return False


def build_nsqd(options: NsqdOptions, reactor: Any, *, sync_thread: bool = True,
               throwaway: bool = False) -> NsqdService:
    """nsqd's service tree; with ``--etcd-endpoints``, one that claims its node id in etcd
    first and builds the nsqd once it holds it (:class:`~nsqtw.nsqd.etcd.EtcdNodeService`)."""
    if options.etcd_endpoints:
        from .etcd import EtcdNodeService

        def build(claimed: NsqdOptions, session: Any) -> NsqdService:
            return NsqdService(claimed, reactor, sync_thread=sync_thread, throwaway=throwaway, etcd=session)

        return cast(NsqdService, EtcdNodeService(options, reactor, build))  # the nsqd's attributes, once built
    return NsqdService(options, reactor, sync_thread=sync_thread, throwaway=throwaway)
