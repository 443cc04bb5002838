"""
nsqadmin on Twisted: the cluster web UI and its JSON API.

* :mod:`nsqtw.admin.options` - ``AdminOptions`` (nsqadmin's flags);
* :mod:`nsqtw.admin.cluster` - ``clusterinfo``: fetching from nsqlookupd/nsqd and merging;
* :mod:`nsqtw.admin.history` - the /stats history the graphs are drawn from (no graphite);
* :mod:`nsqtw.admin.app` - the klein app (API, pages, /config, static files);
* :mod:`nsqtw.admin.pages`, :mod:`nsqtw.admin.html` - server-rendered, escaped HTML;
* ``static/`` and ``templates/`` - the page script, stylesheet and layout (package data).

The service tree is :mod:`nsqtw.admin.service`; embedding is :func:`nsqtw.embed.start_nsqadmin`.

Internal: applications import the public face (``nsqtw.embed``, ``nsqtw.client``, ``nsqtw.testing``, ``nsqtw.options``, ``nsqtw.errors``).
"""
