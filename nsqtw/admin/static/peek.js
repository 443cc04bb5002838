/* nsqadmin's Messages panel: what nsqd's peek (GET /channel/peek, /topic/peek) lists, merged
 * across the nodes by nsqadmin's /api/topics/<t>/<c>/peek.  Loaded only when the button is
 * pressed (never on a timer); nothing here changes what consumers receive.  No external code. */
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
  // pretty JSON when it parses, text when it is UTF-8, else hex
  function preview(m) {
    var bytes = decode(m.body);
    var cut = m.body_size > bytes.length;
    var text = null;
    try { text = new TextDecoder('utf-8', {fatal: true}).decode(bytes); } catch (e) { text = null; }
    if (text !== null && !cut) {
      try { return {kind: 'json', text: JSON.stringify(JSON.parse(text), null, 2)}; } catch (e) { /* not JSON */ }
    }
    if (text !== null) { return {kind: 'text', text: text + (cut ? ' …' : '')}; }
    var hex = [];
    for (var j = 0; j < bytes.length; j++) { hex.push(('0' + bytes[j].toString(16)).slice(-2)); }
    return {kind: 'hex', text: hex.join(' ') + (cut ? ' …' : '')};
  }

  function render(doc) {
    out.textContent = '';
    var nowNs = Date.now() * 1e6;
    (doc.nodes || []).forEach(function (n) {
      if (!n.ok) {
        out.appendChild(node('p', n.node + ': ' + n.error, 'alert warn peek-node-error'));
      }
    });
    var msgs = doc.messages || [];
    if (!msgs.length) {
      out.appendChild(node('p', 'No messages queued, in flight or deferred.', 'peek-empty'));
      return;
    }
    var table = node('table', null, 'grid peek-table');
    var head = node('tr');
    ['nsqd host', 'State', 'ID', 'Age', 'Attempts', 'Due in', 'Held by', 'Size', 'Body'].forEach(function (h) {
      head.appendChild(node('th', h));
    });
    var thead = node('thead'); thead.appendChild(head); table.appendChild(thead);
    var tbody = node('tbody');
    msgs.forEach(function (m) {
      var tr = node('tr', null, 'peek-msg state-' + m.state);
      tr.dataset.id = m.id;
      tr.appendChild(node('td', m.node));
      tr.appendChild(node('td', m.state.replace('_', ' ')));
      tr.appendChild(node('td', m.id, 'mono'));
      tr.appendChild(node('td', duration(nowNs - m.timestamp), 'num'));
      tr.appendChild(node('td', String(m.attempts), 'num'));
      tr.appendChild(node('td', m.deliver_at ? duration(m.deliver_at - nowNs) : '', 'num'));
      tr.appendChild(node('td', m.client_id || ''));
      tr.appendChild(node('td', String(m.body_size), 'num'));
      var p = preview(m);
      var td = node('td', null, 'body');
      var pre = node('pre', p.text, 'peek-body ' + p.kind);
      pre.dataset.kind = p.kind;
      td.appendChild(pre);
      tr.appendChild(td);
      tbody.appendChild(tr);
    });
    table.appendChild(tbody);
    var wrap = node('div', null, 'table-wrap');
    wrap.appendChild(table);
    out.appendChild(wrap);
    if (doc.truncated) {
      out.appendChild(node('p', 'More messages than shown (raise the count to see more).', 'hint peek-truncated'));
    }
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
        if (!res.ok) { out.textContent = ''; out.appendChild(node('p', res.doc.message || 'error', 'alert warn')); return; }
        render(res.doc);
      })
      .catch(function (e) { out.textContent = ''; out.appendChild(node('p', String(e), 'alert warn')); })
      .then(function () { button.disabled = false; panel.dataset.loaded = String(Date.now()); });
  }
  button.addEventListener('click', load);
})();
