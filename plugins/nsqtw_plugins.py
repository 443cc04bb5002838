# twistd plugins of nsqtw; this file must stay import-cheap and plugins/ must never get an __init__.py
from twisted.application.service import ServiceMaker

nsqd = ServiceMaker("nsqtw nsqd", "nsqtw.nsqd.tap", "NSQ daemon (TCP V2 + HTTP) on Twisted.", "nsqd")
nsqlookupd = ServiceMaker("nsqtw nsqlookupd", "nsqtw.lookupd.tap", "NSQ lookup daemon on Twisted.", "nsqlookupd")
nsqadmin = ServiceMaker("nsqtw nsqadmin", "nsqtw.admin.tap", "NSQ admin web UI on Twisted.", "nsqadmin")
nsqtw = ServiceMaker("nsqtw all-in-one", "nsqtw.allinone.tap", "nsqd + nsqlookupd + nsqadmin in one process.", "nsqtw")

# `twistd --reactor=nsqtw ...`: the epoll reactor that polls briefly before sleeping (nsqtw.runtime.spinreactor)
from twisted.application.reactors import Reactor  # noqa: E402

nsqtw_reactor = Reactor("nsqtw", "nsqtw.runtime.spinreactor", "epoll, polling up to NSQTW_SPIN_US (50) us before sleeping.")
