/*
 * nsqadmin (nsqtw): live refresh, sparklines and actions for the server-rendered pages.
 *
 * The server renders every page.  This script polls the page's JSON API
 * (body[data-api]) and nsqadmin's history (body[data-history]) every
 * body[data-refresh] ms and
 *   - writes fresh numbers into cells marked data-v inside rows marked data-row;
 *   - draws inline SVG sparklines into svg[data-spark] from the history;
 *   - when rows appear or disappear or a paused flag flips, fetches the page
 *     again with ?fragment=1 and swaps <main>;
 *   - runs the action buttons (data-action) after a confirmation dialog.
 * No libraries, no build step, nothing loaded from the internet.
 */
(function () {
  'use strict';

  var body = document.body;
  var cfg = body.dataset;
  var base = cfg.base === '/' ? '' : (cfg.base || '');
  var refreshMs = parseInt(cfg.refresh, 10) || 5000;
  var page = cfg.page || '';
  var main = document.getElementById('main');
  var lastHist = null;
  var timer = null;
  var refreshing = false;
  // counters the browser tests read (and a curious operator can, in the console)
  var stats = window.nsqadmin = {polls: 0, fragments: 0, errors: 0};

  // ---- formatting (the same rules as nsqtw/admin/html.py) ----------------------

  function commafy(n) {
    n = Math.trunc(Number(n) || 0);
    return n.toString().replace(/\B(?=(\d{3})+(?!\d))/g, ',');
  }

  function trim2(x) {
    return String(Math.round(x * 100) / 100);
  }

  function nanotohuman(n) {
    if (n === null || n === undefined) { return ''; }
    n = Number(n);
    var s = '';
    if (n >= 3600e9) { s = Math.floor(n / 3600e9) + 'h'; n = n % 3600e9; }
    if (n >= 60e9) { s += Math.floor(n / 60e9) + 'm'; n = n % 60e9; }
    // below a minute after hours or minutes, always seconds: 1h39m0.28s, never 1h39m277.81ms
    if (n >= 1e9 || s) { return s + trim2(n / 1e9) + 's'; }
    if (n >= 1e6) { return trim2(n / 1e6) + 'ms'; }
    if (n >= 1e3) { return trim2(n / 1e3) + 'us'; }
    return trim2(n) + 'ns';
  }

  stats.fmt = {nanotohuman: function (n) { return nanotohuman(n); }};

  function fmtRate(r) {
    return (r === null || r === undefined) ? '\u2013' : Number(r).toFixed(1) + '/s';
  }

  function last(series) {
    if (!series || !series.length) { return null; }
    for (var i = series.length - 1; i >= 0; i--) {
      if (series[i] !== null && series[i] !== undefined) { return series[i]; }
    }
    return null;
  }

  function joinHostPort(host, port) {
    return (host.indexOf(':') >= 0 ? '[' + host + ']' : host) + ':' + port;
  }

  function enc(s) { return encodeURIComponent(s); }

  var STATES = {0: 'init', 1: 'disconnected', 2: 'connected', 3: 'subscribed', 4: 'closing'};

  // ---- HTTP ---------------------------------------------------------------------

  function getJSON(url) {
    return fetch(url, {headers: {'Accept': 'application/json'}, credentials: 'same-origin', cache: 'no-store'})
      .then(function (r) {
        return r.json().catch(function () { return {}; }).then(function (doc) {
          if (!r.ok) {
            var err = new Error((doc && doc.message) || (r.status + ' ' + r.statusText));
            err.status = r.status;
            throw err;
          }
          return doc;
        });
      });
  }

  // ---- one poll per interval across tabs: a tab that finds what another tab of this nsqadmin fetched
  // less than 80% of an interval ago uses that instead of asking again (localStorage is shared by every
  // tab of the origin; nothing is kept longer than a minute) ----------------------------------------

  var SHARE = 'nsqadmin.poll:';
  var bypassShare = false;  // right after an action: ask nsqadmin itself, never an older answer
  stats.fetched = 0;
  stats.shared = 0;

  function sharedGet(url) {
    var key = SHARE + url;
    if (!bypassShare) {
      try {
        var rec = JSON.parse(localStorage.getItem(key) || 'null');
        if (rec && Date.now() - rec.t >= 0 && Date.now() - rec.t < refreshMs * 0.8) {
          stats.shared++;
          return Promise.resolve(rec.doc);
        }
      } catch (e) { /* no storage (private mode): just ask */ }
    }
    return getJSON(url).then(function (doc) {
      stats.fetched++;
      try { localStorage.setItem(key, JSON.stringify({t: Date.now(), doc: doc})); } catch (e) { /* full: fine */ }
      return doc;
    });
  }

  (function pruneShared() {
    try {
      for (var i = localStorage.length - 1; i >= 0; i--) {
        var k = localStorage.key(i);
        if (k && k.indexOf(SHARE) === 0) {
          var rec = JSON.parse(localStorage.getItem(k) || 'null');
          if (!rec || Date.now() - rec.t > 60000) { localStorage.removeItem(k); }
        }
      }
    } catch (e) { /* no storage */ }
  }());

  function send(method, url, payload) {
    return fetch(url, {
      method: method,
      headers: {'Content-Type': 'application/json', 'Accept': 'application/json'},
      credentials: 'same-origin',
      body: payload === undefined ? undefined : JSON.stringify(payload)
    }).then(function (r) {
      return r.json().catch(function () { return {}; }).then(function (doc) {
        return {ok: r.ok, status: r.status, message: (doc && doc.message) || '', doc: doc || {}};
      });
    });
  }

  // ---- flash and live indicator ----------------------------------------------------

  var flashTimer = null;

  function flash(kind, text) {
    var el = document.getElementById('flash');
    if (!el) { return; }
    el.className = 'flash ' + kind;
    el.textContent = text;
    el.hidden = false;
    clearTimeout(flashTimer);
    if (kind === 'ok') {
      flashTimer = setTimeout(function () { el.hidden = true; }, 6000);
    }
  }

  // ok: every upstream answered; 'warn': the page shows a partial picture (why says which); false: refresh failed
  function setLive(ok, why) {
    var el = document.getElementById('live');
    if (!el) { return; }
    if (ok === true) {
      el.className = 'live';
      el.textContent = 'live \u00b7 ' + new Date().toLocaleTimeString();
      el.title = 'refreshes every ' + (refreshMs / 1000) + 's; every node answered';
    } else if (ok === 'warn') {
      el.className = 'live warn';
      el.textContent = 'partial \u00b7 ' + new Date().toLocaleTimeString();
      el.title = why || 'some nodes did not answer';
    } else {
      el.className = 'live down';
      el.textContent = 'stale';
      el.title = why || 'refresh failed';
    }
  }

  function upstreamTrouble(data, hist) {
    var why = [];
    if (data && data.partial) {
      why.push('partial: ' + data.partial.answered + ' of ' + data.partial.total + ' nodes answered');
    } else if (data && data.nodes_missing && data.nodes_missing.length) {
      why.push(data.nodes_missing.length + ' node(s) not answering');
    }
    if (data && data.message) { why.push(data.message); }
    if (hist && hist.message && (!data || hist.message !== data.message)) { why.push('history: ' + hist.message); }
    return why.join('\n');
  }

  // ---- times: "10:21:03 (2m ago)" in the browser's time zone ---------------------------

  // a duration in whole seconds as 3d4h, 2h5m, 4m10s or 12s (html.fmt_seconds)
  function fmtSeconds(seconds) {
    var n = Math.max(0, Math.floor(seconds));
    var d = Math.floor(n / 86400), h = Math.floor((n % 86400) / 3600), m = Math.floor((n % 3600) / 60);
    if (d) { return d + 'd' + h + 'h'; }
    if (h) { return h + 'h' + m + 'm'; }
    if (m) { return m + 'm' + (n % 60) + 's'; }
    return n + 's';
  }

  function age(seconds) {
    seconds = Math.max(0, Math.round(seconds));
    if (seconds < 60) { return seconds + 's'; }
    if (seconds < 3600) { return Math.floor(seconds / 60) + 'm' + (seconds % 60) + 's'; }
    return Math.floor(seconds / 3600) + 'h' + Math.floor((seconds % 3600) / 60) + 'm';
  }

  function localTimes() {
    document.querySelectorAll('time[data-ts]').forEach(function (t) {
      var ts = parseInt(t.dataset.ts, 10);
      if (!ts) { return; }
      t.textContent = new Date(ts * 1000).toLocaleTimeString() + ' (' + age(Date.now() / 1000 - ts) + ' ago)';
    });
  }

  // ---- which rows the API answer has ---------------------------------------------------

  function rowsFor(data, hist) {
    var rows = {};
    var i, j;
    if (!data) { return null; }
    var missing = function () {
      (data.nodes_missing || []).forEach(function (n) { rows['missing:' + n.node] = {obj: n, paused: false}; });
    };
    if (page === 'topics') {
      var ht = (hist && hist.topics) || {};
      var mt = data.topics_missing_nodes || {};
      (data.topics || []).forEach(function (name) {
        var h = ht[name] || {};
        rows['topic:' + name] = {obj: {}, paused: !!h.paused};
        if (mt[name] && mt[name].length) { rows['missing-topic:' + name] = {obj: {}, paused: false}; }
      });
    } else if (page === 'topic') {
      rows.total = {obj: data, paused: !!data.paused};
      (data.nodes || []).forEach(function (n) { rows['node:' + n.node] = {obj: n, paused: !!n.paused}; });
      missing();
      var hc = (hist && hist.channels) || {};
      (data.channels || []).forEach(function (c) {
        rows['channel:' + c.channel_name] = {obj: c, paused: !!c.paused};
        troubles(c, hc[c.channel_name], 'trouble:' + c.channel_name, rows);
      });
      (data.channels_elsewhere || []).forEach(function (c) { rows['elsewhere:' + c] = {obj: {}, paused: false}; });
    } else if (page === 'channel') {
      rows.total = {obj: data, paused: !!data.paused};
      (data.nodes || []).forEach(function (n) { rows['node:' + n.node] = {obj: n, paused: !!n.paused}; });
      missing();
      (data.clients || []).forEach(function (c) {
        rows['client:' + c.node + '/' + c.remote_address] = {obj: c, paused: false};
      });
    } else if (page === 'nodes') {
      (data.nodes || []).forEach(function (p) {
        var ok = !p.status || p.status === 'ok';
        rows[(ok ? 'node:' : 'missing:') + joinHostPort(p.broadcast_address, p.http_port)] = {obj: p, paused: false};
      });
    } else if (page === 'node') {
      var topics = data.topics || [];
      var nch = 0;
      for (i = 0; i < topics.length; i++) {
        var t = topics[i];
        rows['topic:' + t.topic_name] = {obj: t, paused: !!t.paused};
        var chans = t.channels || [];
        nch += chans.length;
        for (j = 0; j < chans.length; j++) {
          rows['channel:' + t.topic_name + '/' + chans[j].channel_name] = {obj: chans[j], paused: !!chans[j].paused};
          troubles(chans[j], null, 'trouble:' + t.topic_name + '/' + chans[j].channel_name, rows);
          (chans[j].clients || []).forEach(function (c) {
            rows['client:' + c.node + '/' + c.remote_address] = {obj: c, paused: false};
          });
        }
      }
      replicationRows(data.replication, rows);
      // a node that does not answer has no current numbers: its cards keep the last ones, marked
      var down = data.status && data.status.status !== 'ok' && !topics.length;
      rows.total = {obj: down ? {} : {topic_count: topics.length, channel_count: nch, total_clients: data.total_clients,
                                      total_messages: data.total_messages}, paused: false};
      if (data.status) { rows.status = {obj: data.status, paused: data.status.status !== 'ok'}; }
    } else if (page === 'lookup') {
      var map = data.topics || {};
      Object.keys(map).forEach(function (name) {
        rows['topic:' + name] = {obj: {}, paused: false};
        (map[name] || []).forEach(function (c) { rows['channel:' + name + '/' + c] = {obj: {}, paused: false}; });
      });
    } else {
      return null;
    }
    return rows;
  }

  // the marks a channel gets (the same rules as pages.channel_trouble)
  var GROWING_POLLS = 3;  // history.GROWING_POLLS

  function growing(series) {
    if (!series || series.length < GROWING_POLLS + 1) { return false; }
    var tail = series.slice(-(GROWING_POLLS + 1));
    for (var i = 0; i < tail.length; i++) {
      if (tail[i] === null || tail[i] === undefined) { return false; }
      if (i && !(tail[i] > tail[i - 1])) { return false; }
    }
    return true;
  }

  function troubles(c, h, prefix, rows) {
    if ((c.depth || 0) > 0 && !(c.client_count) && !c.paused) { rows[prefix + ':backlog'] = {obj: {}, paused: false}; }
    if ((c.client_count || 0) > 0 && !c.paused && growing(h && h.depth)) {
      rows[prefix + ':growing'] = {obj: {}, paused: false};
    }
    var tc = h && h.timeout_count;
    if (tc && tc.length > 1 && tc[tc.length - 1] !== null && tc[tc.length - 2] !== null &&
        tc[tc.length - 1] > tc[tc.length - 2]) {
      rows[prefix + ':timeouts'] = {obj: {}, paused: false};
    }
  }

  function signature(keys) {
    var seen = {};
    var out = [];
    keys.forEach(function (k) { if (!seen[k]) { seen[k] = true; out.push(k); } });
    return out.sort().join('\n');
  }

  // nsqtw's replication panel (node page): a row per peer, shadow and adoption; a peer's sync
  // state and the node's status are in the row keys, so a change re-renders the panel
  function replicationRows(rep, rows) {
    if (!rep) { return; }
    if (rep.peers) {
      rows['replication:' + rep.status] = {obj: {}, paused: false};
      rep.peers.forEach(function (p) {
        rows['peer:' + p.address + ':' + p.sync_state] = {obj: {
          lag_messages: p.lag_messages, unacked_batches: p.unacked_batches,
          lag_seconds_text: Number(p.lag_seconds || 0).toFixed(3) + 's'}, paused: false};
      });
    }
    (rep.shadows || []).forEach(function (s) { rows['shadow:' + s.origin_node_id] = {obj: s, paused: false}; });
    (rep.adopted || []).forEach(function (a) {
      rows['adopted:' + a.origin_node_id + ':' + a.epoch] = {obj: a, paused: false};
    });
  }

  function domSignature() {
    var keys = [];
    main.querySelectorAll('[data-row]').forEach(function (el) {
      keys.push(el.dataset.row + (el.dataset.paused ? '!' : ''));
    });
    return signature(keys);
  }

  function dataSignature(rows) {
    return signature(Object.keys(rows).map(function (k) { return k + (rows[k].paused ? '!' : ''); }));
  }

  // ---- cells ----------------------------------------------------------------------------

  function resolve(doc, path) {
    if (!doc || !path) { return null; }
    var parts = path.split('/');
    var cur = doc;
    for (var i = 0; i < parts.length; i++) {
      if (cur === null || cur === undefined) { return null; }
      cur = cur[parts[i]];
    }
    return cur === undefined ? null : cur;
  }

  // the newest point of a series, or (when the newest poll had none) {stale: the last one seen}
  function current(series) {
    if (!series || !series.length) { return {value: null, stale: null}; }
    var v = series[series.length - 1];
    if (v !== null && v !== undefined) { return {value: v, stale: null}; }
    return {value: null, stale: last(series)};
  }

  function cellText(field, obj, h) {
    if (field === 'rate') {
      var r = current(h && h.rate);
      if (r.value === null && r.stale !== null && page === 'topics') { return {stale: fmtRate(r.stale)}; }
      return fmtRate(r.value);
    }
    if (field === 'mem_disk') {
      return commafy(obj.memory_depth) + ' + ' + commafy(obj.backend_depth);
    }
    if (field.indexOf('e2e:') === 0) {
      var quant = parseFloat(field.slice(4));
      var e2e = obj.e2e_processing_latency || {};
      var ps = e2e.percentiles || [];
      for (var i = 0; i < ps.length; i++) {
        if (Math.abs(ps[i].quantile - quant) < 1e-9) {
          return nanotohuman(ps[i].average !== undefined ? ps[i].average : ps[i].value);
        }
      }
      return '';
    }
    if (field === 'oldest') {
      var ts = obj.oldest_message_ts;
      return (ts === null || ts === undefined) ? '\u2013' : fmtSeconds(Date.now() / 1000 - ts);
    }
    if (field === 'connected') { return nanotohuman(obj.connected); }
    if (field === 'state') { return obj.state === undefined ? '\u2013' : (STATES[obj.state] || String(obj.state)); }
    if (field === 'channel_count' && obj.channel_count === undefined) {
      if (obj.channels) { return commafy(obj.channels.length); }
      if (h && h.channel_count !== null && h.channel_count !== undefined) { return commafy(h.channel_count); }
      return (h && h.channel_count === null) ? '' : undefined;
    }
    var v = obj[field];
    if (v === undefined && h) {
      var cv = current(h[field]);
      if (cv.value !== null) { return commafy(cv.value); }
      return cv.stale === null ? '\u2013' : {stale: commafy(cv.stale)};
    }
    if (typeof v === 'number') { return commafy(v); }
    if (v === undefined || v === null) { return undefined; }
    return String(v);
  }

  function setCell(cell, text) {
    if (text === undefined) { return; }
    if (typeof text === 'object') {
      // a value no node vouches for now: greyed and labelled, never shown as current
      if (cell.textContent === 'last ' + text.stale) { return; }
      cell.textContent = '';
      var span = document.createElement('span');
      span.className = 'stale';
      span.title = 'no node holding this answered the newest poll; this is the last value seen';
      span.textContent = 'last ' + text.stale;
      cell.appendChild(span);
      return;
    }
    if (cell.textContent !== text) {
      cell.textContent = text;
      cell.classList.remove('changed');
      void cell.offsetWidth;
      cell.classList.add('changed');
    }
  }

  function fillCells(rows, hist) {
    main.querySelectorAll('[data-row]').forEach(function (rowEl) {
      var row = rows[rowEl.dataset.row];
      if (!row) { return; }
      var h = resolve(hist, rowEl.dataset.hist);
      rowEl.querySelectorAll('[data-v]').forEach(function (cell) {
        if (cell.closest('[data-row]') !== rowEl) { return; }
        setCell(cell, cellText(cell.dataset.v, row.obj, h));
      });
    });
  }

  // ---- sparklines -------------------------------------------------------------------

  var SVGNS = 'http://www.w3.org/2000/svg';

  function drawSpark(svg, series, timestamps) {
    var vb = (svg.getAttribute('viewBox') || '0 0 120 24').split(' ');
    var w = parseFloat(vb[2]);
    var h = parseFloat(vb[3]);
    while (svg.firstChild) { svg.removeChild(svg.firstChild); }
    var values = series || [];
    var n = values.length;
    var max = 0;
    var seen = 0;
    for (var i = 0; i < n; i++) {
      if (values[i] !== null && values[i] !== undefined) { seen++; if (values[i] > max) { max = values[i]; } }
    }
    var title = document.createElementNS(SVGNS, 'title');
    var lv = last(values);
    title.textContent = seen ? ('now ' + (Math.round(lv * 100) / 100) + ', max ' + (Math.round(max * 100) / 100) +
                                ' over ' + n + ' samples') : 'no samples yet';
    svg.appendChild(title);
    var caption0 = svg.nextElementSibling;
    if (seen < 1 || n < 2) {
      svg.classList.add('empty');
      if (caption0 && caption0.classList.contains('spark-caption')) { caption0.textContent = emptyWhy(n); }
      return;
    }
    svg.classList.remove('empty');
    var pad = 2;
    var scale = max > 0 ? (h - 2 * pad) / max : 0;
    var line = '';
    var area = '';
    var startX = null;
    var prevX = null;
    var pen = false;
    for (var k = 0; k < n; k++) {
      var v = values[k];
      var x = (k / (n - 1)) * w;
      if (v === null || v === undefined) {
        if (pen) { area += 'L' + prevX.toFixed(1) + ',' + h + 'Z'; }
        pen = false;
        continue;
      }
      var y = h - pad - v * scale;
      if (!pen) {
        line += 'M' + x.toFixed(1) + ',' + y.toFixed(1);
        area += 'M' + x.toFixed(1) + ',' + h + 'L' + x.toFixed(1) + ',' + y.toFixed(1);
        startX = x;
        pen = true;
      } else {
        line += 'L' + x.toFixed(1) + ',' + y.toFixed(1);
        area += 'L' + x.toFixed(1) + ',' + y.toFixed(1);
      }
      prevX = x;
    }
    if (pen) { area += 'L' + prevX.toFixed(1) + ',' + h + 'Z'; }
    var a = document.createElementNS(SVGNS, 'path');
    a.setAttribute('d', area);
    a.setAttribute('class', 'area');
    svg.appendChild(a);
    var l = document.createElementNS(SVGNS, 'path');
    l.setAttribute('d', line);
    l.setAttribute('class', 'line');
    l.setAttribute('vector-effect', 'non-scaling-stroke');
    svg.appendChild(l);
    var caption = svg.nextElementSibling;
    if (caption && caption.classList.contains('spark-caption')) {
      var span = (timestamps && timestamps.length > 1) ? (timestamps[timestamps.length - 1] - timestamps[0]) : 0;
      var newest = values[n - 1];
      caption.textContent = 'peak ' + fmtRate(max) + ', now ' +
        (newest === null || newest === undefined ? '\u2013 (' + emptyWhy(n).replace(/^No rate/, 'no rate')
          .replace(/\.$/, '') + ')' : fmtRate(lv)) +
        (span ? ' \u00b7 last ' + (span >= 120 ? Math.round(span / 60) + ' min' : span + ' s') : '');
    }
  }

  // a series with its partial samples (a node of its scope did not answer: the "gaps" beside it) left out,
  // so a hang breaks the line instead of dipping it
  function withGaps(hist, path) {
    var values = resolve(hist, path);
    var gaps = resolve(hist, path.replace(/[^\/]*$/, 'gaps'));
    if (!values || !gaps || !gaps.length) { return values; }
    return values.map(function (v, i) { return gaps[i] ? null : v; });
  }

  // why the cluster's rate chart is blank (the Counter page)
  function emptyWhy(n) {
    var h = lastHist || {};
    var gaps = (h.total && h.total.gaps) || [];
    if (n < 2) { return 'No rate yet: it needs two samples of the history (one every ' + (h.interval || '?') + 's).'; }
    if (gaps.length && gaps[gaps.length - 1]) {
      return 'No rate while a node does not answer: a sum over the others would look like a drop (see the nodes above).';
    }
    if (lastData && lastData.stats && !Object.keys(lastData.stats).length) {
      return 'No rate: the cluster has no channels yet (messages are counted as channels deliver them).';
    }
    return 'No rate yet: no channel counted a message in the samples so far.';
  }

  function drawSparks(hist) {
    if (!hist) { return; }
    main.querySelectorAll('svg[data-spark]').forEach(function (svg) {
      drawSpark(svg, withGaps(hist, svg.dataset.spark), hist.timestamps);
    });
  }

  // ---- charts: time and value axes, gaps where a node did not answer, hover read-out ---------------

  var chartRange = 300;
  var lastCharts = null;

  function niceMax(v) {
    if (!(v > 0)) { return 1; }
    var p = Math.pow(10, Math.floor(Math.log10(v)));
    var steps = [1, 2, 2.5, 5, 10];
    for (var i = 0; i < steps.length; i++) { if (v <= steps[i] * p) { return steps[i] * p; } }
    return 10 * p;
  }

  function fmtValue(v, unit) {
    if (v === null || v === undefined) { return 'no answer'; }
    if (unit === 'rate') { return (Math.round(v * 10) / 10) + '/s'; }
    if (unit === 'ns') { return nanotohuman(v); }
    return commafy(Math.round(v));
  }

  function fmtAxis(v, unit) {
    if (unit === 'ns') { return nanotohuman(v); }
    var a = Math.abs(v);
    var t = a >= 1e6 ? (Math.round(v / 1e5) / 10) + 'M' : a >= 1e4 ? (Math.round(v / 100) / 10) + 'k'
      : String(Math.round(v * 100) / 100);
    return unit === 'rate' ? t + '/s' : t;
  }

  function hhmm(ts, span) {
    var d = new Date(ts * 1000);
    var two = function (n) { return (n < 10 ? '0' : '') + n; };
    return two(d.getHours()) + ':' + two(d.getMinutes()) + (span <= 900 ? ':' + two(d.getSeconds()) : '');
  }

  function svgEl(name, attrs, text) {
    var e = document.createElementNS(SVGNS, name);
    Object.keys(attrs || {}).forEach(function (k) { e.setAttribute(k, attrs[k]); });
    if (text !== undefined) { e.textContent = text; }
    return e;
  }

  // the path of one series: x from time, y from value, a new "M" after every gap
  function chartPath(ts, values, x, y) {
    var d = '';
    var pen = false;
    for (var i = 0; i < values.length; i++) {
      var v = values[i];
      if (v === null || v === undefined) { pen = false; continue; }
      var px = x(ts[i]).toFixed(1);
      var py = y(v).toFixed(1);
      var next = values[i + 1];
      if (!pen) {
        d += 'M' + px + ',' + py;
        // a lone point between gaps still shows, as a short dash
        if (next === null || next === undefined) { d += 'h2'; }
        pen = true;
      } else {
        d += 'L' + px + ',' + py;
      }
    }
    return d;
  }

  function drawChart(fig, doc) {
    var svg = fig.querySelector('svg.chart');
    var unit = fig.dataset.unit;
    var names = fig.dataset.series.split(',');
    var labels = (fig.dataset.labels || '').split(',');
    var series = doc.series || {};
    if (names[0] === 'e2e:*') {
      names = Object.keys(series).filter(function (k) { return k.indexOf('e2e:') === 0; });
      labels = names.map(function (k) { return 'p' + Math.round(parseFloat(k.slice(4)) * 1000) / 10; });
      fig.hidden = names.length === 0;
      if (!names.length) { return; }
    }
    var ts = doc.timestamps || [];
    // draw in the svg's own pixels, so text is never stretched
    var W = Math.max(200, Math.round(svg.getBoundingClientRect().width) || 480), H = 170, L = 56, R = 8, T = 8, B = 22;
    svg.setAttribute('viewBox', '0 0 ' + W + ' ' + H);
    var title = svg.querySelector('title');
    while (svg.lastChild) { svg.removeChild(svg.lastChild); }
    if (title) { svg.appendChild(title); }
    var max = 0;
    names.forEach(function (n) { (series[n] || []).forEach(function (v) { if (v !== null && v > max) { max = v; } }); });
    var top = niceMax(max);
    var t0 = ts.length ? Math.min(ts[0], Math.floor(Date.now() / 1000) - chartRange) : 0;
    var t1 = ts.length ? ts[ts.length - 1] : 1;
    if (ts.length) { t0 = Math.max(t0, t1 - chartRange); }
    var span = Math.max(1, t1 - t0);
    var x = function (t) { return L + (t - t0) / span * (W - L - R); };
    var y = function (v) { return T + (1 - v / top) * (H - T - B); };
    // value axis: 0, half, top; time axis: start, middle, end
    [0, top / 2, top].forEach(function (v) {
      svg.appendChild(svgEl('line', {x1: L, x2: W - R, y1: y(v), y2: y(v), 'class': 'grid-line'}));
      svg.appendChild(svgEl('text', {x: L - 5, y: y(v) + 4, 'class': 'axis y'}, fmtAxis(v, unit)));
    });
    [t0, t0 + span / 2, t1].forEach(function (t, i) {
      svg.appendChild(svgEl('text', {x: x(t), y: H - 5, 'class': 'axis x' + (i === 0 ? ' first' : i === 2 ? ' last' : '')},
                            hhmm(t, span)));
    });
    // gaps: shade every sample in which a node of this chart did not answer (a rate that merely has no
    // previous sample yet is left blank, not shaded)
    // partial samples (a node of this chart had left nsqlookupd: the line is what the others hold) are
    // shaded in another colour, so a killed node's share dropping out does not read as a drain
    var gaps = doc.gaps || [];
    var partial = doc.partial || [];
    for (var g = 0; g < ts.length; g++) {
      if (gaps[g] || partial[g]) {
        var gx0 = x(g > 0 ? (ts[g - 1] + ts[g]) / 2 : ts[g]);
        var gx1 = x(g < ts.length - 1 ? (ts[g] + ts[g + 1]) / 2 : ts[g]);
        svg.appendChild(svgEl('rect', {x: gx0, y: T, width: Math.max(1, gx1 - gx0), height: H - T - B,
                                       'class': gaps[g] ? 'gap' : 'partial'}));
      }
    }
    var note = fig.querySelector('.chart-note');
    if (note) {
      var why = [];
      if (partial.some(Boolean)) {
        why.push('shaded amber: partial, ' + (doc.gone || []).join(', ') + ' left nsqlookupd (its share is missing)');
      }
      if (doc.created && ts.length && doc.created > ts[0]) {
        why.push((chartsUrl() || '').indexOf('/api/charts/nodes/') >= 0 ? 'first seen ' + hhmm(doc.created, 0)
          : 'created ' + hhmm(doc.created, 0));
        svg.appendChild(svgEl('line', {x1: x(doc.created), x2: x(doc.created), y1: T, y2: H - B, 'class': 'created'}));
      }
      note.textContent = why.join(' \u00b7 ');
    }
    names.forEach(function (n, i) {
      svg.appendChild(svgEl('path', {d: chartPath(ts, series[n] || [], x, y), 'class': 'series s' + i,
                                     'data-series': n, 'vector-effect': 'non-scaling-stroke'}));
    });
    var legend = fig.querySelector('.legend');
    if (legend) {
      legend.textContent = '';
      names.forEach(function (n, i) {
        var item = document.createElement('span');
        item.className = 'key s' + i;
        item.textContent = labels[i] || n;
        legend.appendChild(item);
      });
    }
    var cursor = svgEl('line', {x1: 0, x2: 0, y1: T, y2: H - B, 'class': 'cursor', visibility: 'hidden'});
    svg.appendChild(cursor);
    var readout = fig.querySelector('.readout');
    svg.onmousemove = function (ev) {
      if (!ts.length) { return; }
      var box = svg.getBoundingClientRect();
      var px = (ev.clientX - box.left) / box.width * W;
      var best = 0;
      for (var k = 1; k < ts.length; k++) { if (Math.abs(x(ts[k]) - px) < Math.abs(x(ts[best]) - px)) { best = k; } }
      cursor.setAttribute('x1', x(ts[best]));
      cursor.setAttribute('x2', x(ts[best]));
      cursor.setAttribute('visibility', 'visible');
      readout.textContent = hhmm(ts[best], 0) + ' \u00b7 ' + names.map(function (n, i) {
        return (labels[i] || n) + ' ' + fmtValue((series[n] || [])[best], unit);
      }).join(' \u00b7 ');
    };
    svg.onmouseleave = function () { cursor.setAttribute('visibility', 'hidden'); readout.textContent = ''; };
  }

  function drawCharts(doc) {
    if (!doc) { return; }
    lastCharts = doc;
    main.querySelectorAll('figure[data-chart]').forEach(function (fig) { drawChart(fig, doc); });
  }

  function chartsUrl() {
    var panel = main.querySelector('[data-charts]');
    return panel ? panel.dataset.charts + '?range=' + chartRange : null;
  }

  function pollCharts() {
    var url = chartsUrl();
    if (!url) { return Promise.resolve(null); }
    return sharedGet(url).then(function (doc) { stats.charts = (stats.charts || 0) + 1; drawCharts(doc); });
  }

  document.addEventListener('click', function (ev) {
    var btn = ev.target.closest('button[data-range]');
    if (!btn || !main.contains(btn)) { return; }
    chartRange = parseInt(btn.dataset.range, 10) || 300;
    main.querySelectorAll('button[data-range]').forEach(function (b) {
      b.classList.toggle('active', b === btn);
      b.setAttribute('aria-pressed', b === btn ? 'true' : 'false');
    });
    pollCharts();
  });

  // ---- refresh ------------------------------------------------------------------------

  function refreshFragment() {
    if (refreshing) { return Promise.resolve(); }
    refreshing = true;
    var url = new URL(window.location.href);
    url.searchParams.set('fragment', '1');
    return fetch(url.toString(), {credentials: 'same-origin', cache: 'no-store'})
      .then(function (r) {
        // what this page shows is gone (deleted elsewhere): show the server's own page for it
        if (!r.ok) { window.location.reload(); return new Promise(function () {}); }
        return r.text();
      })
      .then(function (html) {
        stats.fragments++;
        var form = main.querySelector('#policy-form');
        var typed = form && !form.dataset.saved ? policyChanges(form) : {};
        main.innerHTML = html;
        var fresh = main.querySelector('#policy-form');
        Object.keys(typed).forEach(function (name) {
          if (fresh && fresh.elements[name]) { fresh.elements[name].value = typed[name]; }
        });
        drawSparks(lastHist);
        localTimes();
        applySort();
        main.querySelectorAll('button[data-range]').forEach(function (b) {
          var on = parseInt(b.dataset.range, 10) === chartRange;
          b.classList.toggle('active', on);
          b.setAttribute('aria-pressed', on ? 'true' : 'false');
        });
        drawCharts(lastCharts);
      })
      .finally(function () { refreshing = false; });
  }

  function update(data, hist) {
    if (page === 'error') { window.location.reload(); return null; }
    if (hist) { lastHist = hist; }
    if (data) { lastData = data; }
    var trouble = upstreamTrouble(data, hist);
    setLive(trouble ? 'warn' : true, trouble);
    localTimes();
    if (page === 'counter') { return updateCounter(data, hist); }
    var rows = rowsFor(data, hist);
    if (rows && dataSignature(rows) !== domSignature()) {
      return refreshFragment();
    }
    if (rows) { fillCells(rows, hist); }
    drawSparks(hist);
    applySort();
    return null;
  }

  var acting = false;  // an action is under way: no refresh races it (a delete would 404 the page)

  function poll() {
    clearTimeout(timer);
    if (acting) { timer = setTimeout(poll, refreshMs); return Promise.resolve(); }
    // a tab nobody looks at does not poll (it polls at once when shown again): many open tabs cost
    // nsqadmin, and through it every nsqd, what the visible ones cost
    if (document.hidden) { stats.skipped = (stats.skipped || 0) + 1; timer = setTimeout(poll, refreshMs); return Promise.resolve(); }
    var wants = [cfg.api ? sharedGet(cfg.api) : Promise.resolve(null),
                 cfg.history ? sharedGet(cfg.history) : Promise.resolve(null),
                 pollCharts().catch(function () { return null; })];
    return Promise.all(wants)
      .then(function (res) { stats.polls++; bypassShare = false; return update(res[0], res[1]); })
      .catch(function (err) { stats.errors++; setLive(false, err.message); })
      .finally(function () { timer = setTimeout(poll, refreshMs); });
  }

  // ---- counter ---------------------------------------------------------------------------

  var shown = null;
  var anim = null;

  function updateCounter(data, hist) {
    var el = document.getElementById('counter');
    if (!el || !data) { return; }
    if (!!data.partial !== !!document.getElementById('counter-partial')) {
      // a node stopped (or started again) answering: the page says which counts are the last seen
      return refreshFragment();
    }
    var total = 0;
    var stats = data.stats || {};
    Object.keys(stats).forEach(function (k) { total += stats[k].message_count || 0; });
    if (shown === null) { shown = parseInt(el.dataset.total, 10) || 0; }
    var from = shown;
    var start = null;
    var span = Math.min(refreshMs, 4000);
    if (anim) { cancelAnimationFrame(anim); }
    function frame(ts) {
      if (start === null) { start = ts; }
      var p = Math.min(1, (ts - start) / span);
      shown = Math.round(from + (total - from) * p);
      el.textContent = commafy(shown);
      if (p < 1) { anim = requestAnimationFrame(frame); } else { anim = null; }
    }
    if (total !== from) { anim = requestAnimationFrame(frame); }
    el.dataset.total = String(total);
    var rateEl = document.getElementById('counter-rate');
    if (rateEl && hist && hist.total) { rateEl.textContent = fmtRate(last(hist.total.rate)); }
    drawSparks(hist);
  }

  // ---- sortable tables: click (or Enter on) a heading; the order survives live refreshes ------------

  var sortState = null;  // {table: index of the table on the page, col: column, dir: 1 or -1}

  function sortKey(cell) {
    if (!cell) { return ''; }
    if (cell.dataset.sort !== undefined) {
      var f = parseFloat(cell.dataset.sort);
      return isNaN(f) ? cell.dataset.sort.toLowerCase() : f;
    }
    var text = cell.textContent.trim();
    var num = text.replace(/^last /, '').replace(/,/g, '').replace(/\/s$/, '').replace(/ \+ .*$/, '');
    if (num !== '' && !isNaN(Number(num))) { return Number(num); }
    var dur = /^(?:(\d+)h)?(?:(\d+)m(?!s))?(?:([\d.]+)(s|ms|us|ns))?$/.exec(text);
    if (dur && text) {
      var mult = {s: 1e9, ms: 1e6, us: 1e3, ns: 1}[dur[4] || 's'];
      return (Number(dur[1] || 0) * 3600e9) + (Number(dur[2] || 0) * 60e9) + Number(dur[3] || 0) * mult;
    }
    if (text === '\u2013' || text === '') { return -1; }
    return text.toLowerCase();
  }

  function applySort() {
    if (!sortState) { return; }
    var tables = main.querySelectorAll('table.sortable-table');
    var table = tables[sortState.table];
    if (!table) { return; }
    var tbody = table.tBodies[0];
    var rows = Array.prototype.slice.call(tbody.rows);
    var col = sortState.col;
    var dir = sortState.dir;
    var sorted = rows.slice().sort(function (a, b) {
      if (a.classList.contains('total')) { return 1; }
      if (b.classList.contains('total')) { return -1; }
      var ka = sortKey(a.cells[col]);
      var kb = sortKey(b.cells[col]);
      if (typeof ka !== typeof kb) { ka = String(ka); kb = String(kb); }
      return (ka < kb ? -1 : ka > kb ? 1 : 0) * dir;
    });
    var same = sorted.every(function (r, i) { return r === rows[i]; });
    if (!same) { sorted.forEach(function (r) { tbody.appendChild(r); }); }
    table.querySelectorAll('th.sortable').forEach(function (th, i) {
      th.setAttribute('aria-sort', i === col ? (dir > 0 ? 'ascending' : 'descending') : 'none');
    });
  }

  function sortBy(th) {
    var table = th.closest('table');
    var tables = Array.prototype.slice.call(main.querySelectorAll('table.sortable-table'));
    var t = tables.indexOf(table);
    var col = Array.prototype.indexOf.call(th.parentNode.children, th);
    var dir = th.classList.contains('num') ? -1 : 1;  // numbers: biggest first
    if (sortState && sortState.table === t && sortState.col === col) { dir = -sortState.dir; }
    sortState = {table: t, col: col, dir: dir};
    applySort();
  }

  document.addEventListener('click', function (ev) {
    var th = ev.target.closest('th.sortable');
    if (th && main.contains(th)) { sortBy(th); }
  });
  document.addEventListener('keydown', function (ev) {
    var th = ev.target.closest && ev.target.closest('th.sortable');
    if (th && (ev.key === 'Enter' || ev.key === ' ')) { ev.preventDefault(); sortBy(th); }
  });

  // ---- an outcome message that must survive a navigation (after a delete) ---------------------

  function flashAfterNavigation(kind, text, url) {
    acting = true;  // leaving: no more refreshes of a page that is gone
    try { sessionStorage.setItem('nsqadmin.flash', JSON.stringify({kind: kind, text: text})); } catch (e) { /* private mode */ }
    window.location.href = url;
  }

  (function pendingFlash() {
    var raw = null;
    try { raw = sessionStorage.getItem('nsqadmin.flash'); sessionStorage.removeItem('nsqadmin.flash'); } catch (e) { raw = null; }
    if (!raw) { return; }
    try { var f = JSON.parse(raw); flash(f.kind, f.text); } catch (e) { /* ignore */ }
  }());

  // ---- actions ------------------------------------------------------------------------------

  // ---- confirmations: the same text as pages.confirm_text, from the newest live refresh -----------------

  var lastData = null;  // the page's newest API answer (what the table shows)

  function plural(n, word) { return commafy(n) + ' ' + word + (n === 1 ? '' : 's'); }
  function onNodes(n) { return 'on ' + n + ' node' + (n === 1 ? '' : 's'); }
  function num(doc, key) { return Math.trunc(Number(doc[key]) || 0); }

  function missingNote(doc) {
    var missing = doc.nodes_missing || [];
    if (!missing.length) { return ''; }
    var one = missing.length === 1;
    var names = missing.map(function (m) { return (m.node || '') + ' ' + (m.status || ''); }).join(', ');
    return ' ' + plural(missing.length, 'more node') + ' holding it ' + (one ? 'does' : 'do') + ' not answer (' +
      names + '): ' + (one ? 'its' : 'their') + ' messages are not counted here and this does not reach ' +
      (one ? 'it' : 'them') + '.';
  }

  function confirmText(action, topic, channel, doc) {
    var where = onNodes((doc.nodes || []).length);
    var note = missingNote(doc);
    if (channel && (action === 'redrive' || action === 'empty_dead')) {
      var dead = num(doc, 'dead_count');
      var msgs = commafy(dead) + ' dead message' + (dead === 1 ? '' : 's');
      if (action === 'redrive') {
        return 'Put the ' + msgs + ' of ' + topic + '/' + channel + ' ' + where + ' back into the channel with fresh ' +
          'attempts; consumers receive them again.' + note;
      }
      var dlt = (doc.policy || {}).dead_letter_topic;
      return 'Drop the ' + msgs + ' of ' + topic + '/' + channel + ' ' + where + ' for good; they cannot be recovered.' +
        (dlt ? ' Copies already published to the dead-letter topic ' + dlt + ' stay there.' : '') + note;
    }
    if (channel) {
      var label = topic + '/' + channel;
      var q = num(doc, 'depth'), f = num(doc, 'in_flight_count'), d = num(doc, 'deferred_count');
      var held = commafy(q) + ' queued, ' + commafy(f) + ' in flight, ' + commafy(d) + ' deferred';
      if (action === 'empty') {
        return 'Empty channel ' + label + ': discard all ' + commafy(q + f + d) + ' messages ' + where + ' (' + held +
          ')? In-flight and deferred messages are dropped too; consumers cannot finish the ones they hold.' + note;
      }
      if (action === 'delete') {
        return 'Delete channel ' + label + ' everywhere: all ' + commafy(q + f + d) + ' messages ' + where + ' (' +
          held + ') are discarded and its ' + plural(num(doc, 'client_count'), 'consumer') + ' disconnected.' + note;
      }
      if (action === 'pause') {
        return 'Pause channel ' + label + ' ' + where + '? Consumers get no messages until it is unpaused; ' +
          'messages keep queueing.' + note;
      }
      return 'Unpause channel ' + label + ' ' + where + '? Consumers get messages again.' + note;
    }
    var channels = doc.channels || [];
    if (action === 'empty') {
      return 'Empty topic ' + topic + ': discard the ' + commafy(num(doc, 'depth')) + ' messages queued at the topic ' +
        where + '? Its channels keep theirs.' + note;
    }
    if (action === 'delete') {
      var everything = num(doc, 'depth');
      channels.forEach(function (c) { everything += num(c, 'depth') + num(c, 'in_flight_count') + num(c, 'deferred_count'); });
      return 'Delete topic ' + topic + ' everywhere: its ' + plural(channels.length, 'channel') + ' and all ' +
        commafy(everything) + ' messages ' + where + ' (at the topic and in its channels: queued, in flight ' +
        'and deferred) are discarded, and nsqlookupd forgets it.' + note;
    }
    if (action === 'pause') {
      return 'Pause topic ' + topic + ' ' + where + '? New messages queue at the topic and its channels get nothing ' +
        'until it is unpaused.' + note;
    }
    return 'Unpause topic ' + topic + ' ' + where + '? Messages flow to its channels again.' + note;
  }
  stats.confirmText = confirmText;

  function confirmFor(btn) {
    var d = btn.dataset;
    var live = (page === 'topic' || page === 'channel') && lastData && d.topic &&
      ['empty', 'delete', 'pause', 'unpause', 'redrive', 'empty_dead'].indexOf(d.action) >= 0 &&
      !!d.channel === (page === 'channel');
    if (live) { return confirmText(d.action, d.topic, d.channel || '', lastData); }
    return d.confirm || ('Really ' + d.action + '?');
  }

  function confirmAction(text) {
    var dlg = document.getElementById('confirm');
    if (!dlg || typeof dlg.showModal !== 'function') { return Promise.resolve(window.confirm(text)); }
    document.getElementById('confirm-text').textContent = text;
    dlg.returnValue = '';
    return new Promise(function (resolve) {
      dlg.addEventListener('close', function () { resolve(dlg.returnValue === 'ok'); }, {once: true});
      dlg.showModal();
      document.getElementById('confirm-no').focus();
    });
  }

  var DONE = {pause: 'paused', unpause: 'unpaused', empty: 'emptied', 'delete': 'deleted',
              tombstone: 'tombstoned', forget: 'forgotten', redrive: 'redriven', empty_dead: 'emptied of dead letters',
              drain: 'draining (its progress below)', undrain: 'serving again'};

  function runAction(btn) {
    var d = btn.dataset;
    var action = d.action;
    var topic = d.topic || '';
    var channel = d.channel || '';
    var what = channel ? ('channel ' + topic + '/' + channel) : ('topic ' + topic);
    var req;
    if (action === 'tombstone') {
      what = 'topic ' + topic + ' on ' + d.node;
      req = send('DELETE', base + '/api/nodes/' + enc(d.node), {topic: topic});
    } else if (action === 'forget' || action === 'drain' || action === 'undrain') {
      what = 'node ' + d.node;
      req = send('POST', base + '/api/nodes/' + enc(d.node), {action: action});
    } else {
      var url = base + '/api/topics/' + enc(topic) + (channel ? '/' + enc(channel) : '');
      req = action === 'delete' ? send('DELETE', url) : send('POST', url, {action: action});
    }
    btn.disabled = true;
    acting = true;
    return req.then(function (res) {
      btn.disabled = false;
      acting = false;
      bypassShare = true;
      if (!res.ok) {
        flash('error', 'Could not ' + action + ' ' + what + ': ' + (res.message || res.status));
        return null;
      }
      var kind = res.message ? 'warning' : 'ok';
      var text = res.message ? (what + ' ' + DONE[action] + ' \u2013 ' + res.message)
        : (what.charAt(0).toUpperCase() + what.slice(1) + ' ' + DONE[action] + '.');
      if (action === 'redrive' || action === 'empty_dead') {
        var n = num(res.doc, action === 'redrive' ? 'redriven' : 'emptied');
        text = (action === 'redrive' ? 'Redrove ' : 'Dropped ') + commafy(n) + ' dead message' + (n === 1 ? '' : 's') +
          ' of ' + what + (res.message ? ' \u2013 ' + res.message : '.');
      }
      if (action === 'delete' && page === 'topic' && !channel) {
        flashAfterNavigation(kind, text, base + '/topics');
        return null;
      }
      if (action === 'delete' && page === 'channel' && channel) {
        flashAfterNavigation(kind, text, base + '/topics/' + enc(topic));
        return null;
      }
      flash(kind, text);
      return refreshFragment();
    }, function (err) {
      btn.disabled = false;
      acting = false;
      flash('error', 'Could not ' + action + ' ' + what + ': ' + err.message);
    });
  }

  document.addEventListener('click', function (ev) {
    var btn = ev.target.closest('button[data-action]');
    if (!btn || !main.contains(btn)) { return; }
    ev.preventDefault();
    confirmAction(confirmFor(btn)).then(function (yes) {
      if (yes) { runAction(btn); }
    });
  });

  document.addEventListener('submit', function (ev) {
    var form = ev.target;
    if (form.id !== 'create-form') { return; }
    ev.preventDefault();
    var topic = form.elements.topic.value.trim();
    var channel = form.elements.channel.value.trim();
    var what = channel ? ('channel ' + topic + '/' + channel) : ('topic ' + topic);
    confirmAction('Create ' + what + '?').then(function (yes) {
      if (!yes) { return null; }
      return send('POST', base + '/api/topics', {topic: topic, channel: channel}).then(function (res) {
        bypassShare = true;
        if (!res.ok) { flash('error', 'Could not create ' + what + ': ' + (res.message || res.status)); return null; }
        flash(res.message ? 'warning' : 'ok', 'Created ' + what + (res.message ? ' \u2013 ' + res.message : '.'));
        form.reset();
        return refreshFragment();
      });
    });
  });

  // ---- a channel's policy (nsqtw): only the settings changed are sent, after a confirmation naming each ------

  var POLICY_LABEL = {max_attempts: 'max attempts', max_age: 'max age', max_depth: 'max depth', overflow: 'overflow',
                      max_rate: 'max rate', dead_letter_topic: 'dead-letter topic'};

  function policyEffect(name, value, topic) {
    if (name === 'max_attempts') {
      return value ? 'a message delivered ' + value + ' times becomes a dead letter instead of being delivered again'
        : 'messages are delivered again without limit';
    }
    if (name === 'max_age') {
      return value ? 'a queued message older than ' + value + ' is not delivered (a dead letter when the channel ' +
        'keeps them, else dropped); messages in flight are not pulled back' : 'messages never expire';
    }
    if (name === 'max_depth') {
      return value ? 'the channel queues at most ' + value + ' messages (see overflow)' : 'the channel queues without bound';
    }
    if (name === 'overflow') {
      return value === 'refuse' ? 'at max depth, publishes to topic ' + topic + ' fail (E_PUB_FAILED, HTTP 503)'
        : 'at max depth, the oldest queued message is dropped for each new one';
    }
    if (name === 'max_rate') {
      return value ? 'at most ' + value + ' messages a second go to all its consumers together'
        : 'no delivery rate limit';
    }
    return value ? 'each dead message is also published to topic ' + value : 'dead messages are not published to a topic';
  }

  function policyChanges(form) {
    var changes = {};
    Array.prototype.forEach.call(form.elements, function (e) {
      if (!e.name || !POLICY_LABEL[e.name]) { return; }
      var initial = e.tagName === 'SELECT' ? e.dataset.initial : e.defaultValue;
      var value = e.value.trim();
      if (value !== initial) { changes[e.name] = value; }
    });
    return changes;
  }
  stats.policyChanges = policyChanges;

  function policyConfirm(form, changes) {
    var d = form.dataset;
    var n = parseInt(d.nodes, 10) || 0;
    var lines = Object.keys(changes).map(function (name) {
      var value = changes[name];
      return POLICY_LABEL[name] + ' ' + (value || 'off') + ': ' + policyEffect(name, value, d.topic) + '.';
    });
    return 'Set the policy of channel ' + d.topic + '/' + d.channel + ' ' + onNodes(n) + '?\n' + lines.join('\n');
  }

  document.addEventListener('submit', function (ev) {
    var form = ev.target;
    if (form.id !== 'policy-form') { return; }
    ev.preventDefault();
    var changes = policyChanges(form);
    var what = 'channel ' + form.dataset.topic + '/' + form.dataset.channel;
    if (!Object.keys(changes).length) { flash('warning', 'Nothing changed in the policy of ' + what + '.'); return; }
    confirmAction(policyConfirm(form, changes)).then(function (yes) {
      if (!yes) { return null; }
      acting = true;
      var url = base + '/api/topics/' + enc(form.dataset.topic) + '/' + enc(form.dataset.channel) + '/policy';
      return send('POST', url, changes).then(function (res) {
        acting = false;
        bypassShare = true;
        if (!res.ok) { flash('error', 'Could not set the policy of ' + what + ': ' + (res.message || res.status)); return null; }
        flash(res.message ? 'warning' : 'ok', 'Policy of ' + what + ' set' + (res.message ? ' \u2013 ' + res.message : '.'));
        form.dataset.saved = '1';
        return refreshFragment();
      }, function (err) {
        acting = false;
        flash('error', 'Could not set the policy of ' + what + ': ' + err.message);
      });
    });
  });

  // ---- start ----------------------------------------------------------------------------

  localTimes();
  if (cfg.api || cfg.history) {
    poll();
  }
  document.addEventListener('visibilitychange', function () {
    if (!document.hidden && (cfg.api || cfg.history)) { poll(); }
  });
}());
