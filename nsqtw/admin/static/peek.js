/* nsqadmin's Messages panel: what nsqd's peek (GET /channel/peek, /topic/peek) lists, node by node, as
 * nsqadmin's /api/topics/<t>/<c>/peek gathers it.  Each node's part is in the order that node delivers
 * (never re-sorted across nodes), under a line with its counts; a node that could not be peeked says why.
 * Loaded only when the button is pressed (never on a timer); nothing here changes what consumers
 * receive.  No external code. */
(function () {
  'use strict';
  var panel = document.querySelector('section.peek[data-peek]');
  if (!panel || panel.dataset.ready) { return; }
  panel.dataset.ready = '1';
  var out = panel.querySelector('.peek-out');
  var button = panel.querySelector('.peek-load');

  function node(tag, text, cls) {
    var e = document.createElement(tag);
    if (text !== undefined && text !== null) { e.textContent = text; }
    if (cls) { e.className = cls; }
    return e;
  }
  function commafy(n) {
    return String(Math.trunc(Number(n) || 0)).replace(/\B(?=(\d{3})+(?!\d))/g, ',');
  }
  function duration(ns) {
    var s = Math.abs(ns) / 1e9;
    var sign = ns < 0 ? '-' : '';
    if (s < 1) { return sign + Math.round(s * 1000) + 'ms'; }
    if (s < 60) { return sign + s.toFixed(1) + 's'; }
    if (s < 3600) { return sign + Math.floor(s / 60) + 'm' + Math.floor(s % 60) + 's'; }
    return sign + Math.floor(s / 3600) + 'h' + Math.floor((s % 3600) / 60) + 'm';
  }
  function decode(b64) {
    var raw = atob(b64 || '');
    var bytes = new Uint8Array(raw.length);
    for (var i = 0; i < raw.length; i++) { bytes[i] = raw.charCodeAt(i); }
    return bytes;
  }
  // UTF-8 text, or null; a body cut by --peek-max-body-size may end inside a character: the text up to it
  function utf8(bytes, cut) {
    var dec = new TextDecoder('utf-8', {fatal: true});
    try { return dec.decode(bytes); } catch (e) { /* not (all) UTF-8 */ }
    if (cut) {
      for (var k = 1; k <= 3 && k < bytes.length; k++) {
        try { return dec.decode(bytes.subarray(0, bytes.length - k)); } catch (e) { /* try one byte fewer */ }
      }
    }
    return null;
  }
  // {kind, line: one line for the row, full: pretty JSON, the text, or hex}
  function preview(m) {
    var bytes = decode(m.body);
    var cut = m.body_size > bytes.length;
    var text = utf8(bytes, cut);
    var more = cut ? ' \u2026' : '';
    if (text !== null && !cut) {
      try {
        var doc = JSON.parse(text);
        return {kind: 'json', line: JSON.stringify(doc), full: JSON.stringify(doc, null, 2)};
      } catch (e) { /* not JSON */ }
    }
    if (text !== null) { return {kind: 'text', line: text.replace(/\s+/g, ' ') + more, full: text + more}; }
    var hex = [];
    for (var j = 0; j < bytes.length; j++) { hex.push(('0' + bytes[j].toString(16)).slice(-2)); }
    return {kind: 'hex', line: hex.join(' ') + more, full: hex.join(' ') + more};
  }
  // for the browser tests (and a curious operator, in the console)
  window.nsqadminPeek = {preview: preview};

  var LABEL = {queued: 'queued', in_flight: 'in flight', deferred: 'deferred', dead: 'dead'};

  function bodyCell(m) {
    var p = preview(m);
    var td = node('td', null, 'body');
    var pre = node('pre', p.full, 'peek-body ' + p.kind);
    pre.dataset.kind = p.kind;
    if (p.full === p.line && p.line.length <= 120) {
      pre.classList.add('one');
      td.appendChild(pre);
      return td;
    }
    // one line in the row; the whole body (pretty JSON) when opened
    var details = node('details', null, 'peek-details');
    details.appendChild(node('summary', p.line, 'peek-line'));
    details.appendChild(pre);
    td.appendChild(details);
    return td;
  }

  function table(msgs, nowNs) {
    var t = node('table', null, 'grid peek-table');
    var head = node('tr');
    ['nsqd host', 'State', 'ID', 'Age', 'Attempts', 'Due in', 'Held by', 'Size', 'Body'].forEach(function (h) {
      head.appendChild(node('th', h));
    });
    var thead = node('thead'); thead.appendChild(head); t.appendChild(thead);
    var tbody = node('tbody');
    msgs.forEach(function (m) {
      var tr = node('tr', null, 'peek-msg state-' + m.state);
      tr.dataset.id = m.id;
      tr.dataset.node = m.node;
      tr.appendChild(node('td', m.node));
      tr.appendChild(node('td', LABEL[m.state] || m.state));
      tr.appendChild(node('td', m.id, 'mono'));
      tr.appendChild(node('td', duration(nowNs - m.timestamp), 'num'));
      tr.appendChild(node('td', String(m.attempts), 'num'));
      tr.appendChild(node('td', m.deliver_at ? duration(m.deliver_at - nowNs) : '', 'num'));
      tr.appendChild(node('td', m.client_id || ''));
      tr.appendChild(node('td', String(m.body_size), 'num'));
      tr.appendChild(bodyCell(m));
      tbody.appendChild(tr);
    });
    t.appendChild(tbody);
    var wrap = node('div', null, 'table-wrap');
    wrap.appendChild(t);
    return wrap;
  }

  // "queued 6,000 · in flight 2 · deferred 1", and what of it is listed
  function counts(n, msgs) {
    var listed = {queued: 0, in_flight: 0, deferred: 0, dead: 0};
    msgs.forEach(function (m) { listed[m.state] = (listed[m.state] || 0) + 1; });
    var have = {queued: n.depth, in_flight: n.in_flight_count, deferred: n.deferred_count, dead: n.dead_count};
    var parts = [];
    var hidden = [];
    ['queued', 'in_flight', 'deferred', 'dead'].forEach(function (st) {
      if (have[st] === null || have[st] === undefined) { return; }
      if (st === 'in_flight' && !panel.querySelector('.peek-state') && !have[st]) { return; }
      parts.push(LABEL[st] + ' ' + commafy(have[st]));
      if (have[st] > listed[st]) { hidden.push(commafy(have[st] - listed[st]) + ' ' + LABEL[st]); }
    });
    var text = parts.join(' \u00b7 ');
    if (hidden.length) { text += ' \u2014 not listed: ' + hidden.join(', '); }
    return text;
  }

  function render(doc) {
    out.textContent = '';
    var nowNs = Date.now() * 1e6;
    var nodes = doc.nodes || [];
    var peeked = nodes.filter(function (n) { return n.ok; });
    if (!nodes.length) {
      out.appendChild(node('p', 'No nsqd holds this now.', 'peek-empty'));
      return;
    }
    if (!peeked.length) {
      out.appendChild(node('p', 'No node could be peeked, so nothing can be said about the messages here:',
                           'alert warning peek-none'));
    }
    nodes.forEach(function (n) {
      var part = node('div', null, 'peek-node');
      part.dataset.node = n.node;
      var h = node('h3', n.node, 'peek-node-head');
      part.appendChild(h);
      if (!n.ok) {
        part.appendChild(node('p', n.node + ': ' + n.error, 'alert warning peek-node-error'));
        out.appendChild(part);
        return;
      }
      var msgs = n.messages || [];
      h.appendChild(node('span', ' ' + counts(n, msgs), 'muted peek-counts'));
      if (!msgs.length) {
        part.appendChild(node('p', 'Nothing ' + (doc.state && doc.state !== 'all' ? LABEL[doc.state] || doc.state
                                                  : 'queued, in flight or deferred') + ' on this node.', 'hint peek-empty'));
      } else {
        part.appendChild(table(msgs, nowNs));
      }
      if (n.truncated) {
        part.appendChild(node('p', 'More on this node than shown (at most ' + doc.n + ' per state; raise the count to see more).',
                              'hint peek-truncated'));
      }
      out.appendChild(part);
    });
  }

  function load() {
    var n = panel.querySelector('.peek-n');
    var st = panel.querySelector('.peek-state');
    var url = panel.dataset.peek + '?n=' + encodeURIComponent(n ? n.value : '20') +
      (st ? '&state=' + encodeURIComponent(st.value) : '');
    button.disabled = true;
    fetch(url, {headers: {Accept: 'application/json'}, credentials: 'same-origin'})
      .then(function (r) { return r.json().then(function (doc) { return {ok: r.ok, doc: doc}; }); })
      .then(function (res) {
        if (!res.ok) { out.textContent = ''; out.appendChild(node('p', res.doc.message || 'error', 'alert warning')); return; }
        render(res.doc);
      })
      .catch(function (e) { out.textContent = ''; out.appendChild(node('p', String(e), 'alert warning')); })
      .then(function () { button.disabled = false; panel.dataset.loaded = String(Date.now()); });
  }
  button.addEventListener('click', load);
})();
