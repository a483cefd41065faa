// Dispatch: the little the page does beyond htmx and its ws extension, and only what
// htmx cannot do. What the page shows is the server's: each fragment carries its
// element's final classes, and what follows from the state the server sent (the empty
// tab's hint, approval buttons once nothing waits, the partial first bubble, the current
// tab's dot) is CSS. See ARCHITECTURE.md, "The page's JavaScript".
//
// - Inserts are idempotent: an inserted element whose id is already on the page
//   replaces it in place (a frame may arrive twice around a reconnect).
// - On every (re)connect the page says what it holds, so the server sends what
//   is missing (ARCHITECTURE.md, One turn, step 8).
// - The log follows the stream only while the reader is at the bottom, keeps a
//   bounded number of chunks, and loads older pages without jumping.
(function () {
  'use strict';

  // Within this many pixels of the bottom the reader is "at the bottom": about a line.
  var FOLLOW_SLACK_PX = 48;
  // The composer grows with its text up to this share of the window, then scrolls.
  var COMPOSER_MAX_SHARE = 0.4;

  function $(id) { return document.getElementById(id); }
  function all(root, selector) { return Array.prototype.slice.call(root.querySelectorAll(selector)); }
  function scroller() { return document.scrollingElement || document.documentElement; }
  function atBottom() {
    var s = scroller();
    return s.scrollHeight - s.scrollTop - s.clientHeight <= FOLLOW_SLACK_PX;
  }
  function toBottom() { var s = scroller(); s.scrollTop = s.scrollHeight; }

  // --- Idempotent inserts ----------------------------------------------------------

  // What the reader did to an element survives its replacement.
  function carryState(old, el) {
    if (old.tagName === 'DETAILS' && el.tagName === 'DETAILS' && old.hasAttribute('data-seen')) {
      el.open = old.open;
      el.setAttribute('data-seen', '');
    }
    // A card sent again comes without the results that streamed into it since.
    var oldSlot = old.querySelector('.slot');
    var newSlot = el.querySelector('.slot');
    if (oldSlot && newSlot && !newSlot.firstElementChild) {
      while (oldSlot.firstChild) newSlot.appendChild(oldSlot.firstChild);
    }
  }

  function upsert(el, parent) {
    var old = el.id ? document.getElementById(el.id) : null;
    if (old) {
      carryState(old, el);
      old.replaceWith(el);
    } else {
      parent.appendChild(el);
    }
    htmx.process(el);
  }

  document.addEventListener('htmx:oobBeforeSwap', function (evt) {
    var d = evt.detail;
    var frag = d.fragment;
    if (!frag || !frag.children) return;
    var replaced = false;
    Array.prototype.slice.call(frag.children).forEach(function (el) {
      if (!el.id) return;
      var old = document.getElementById(el.id);
      // The target itself is an ordinary replace (hx-swap-oob="true").
      if (!old || old === d.target) return;
      upsert(el);
      replaced = true;
    });
    if (replaced && !frag.firstElementChild && !(frag.textContent || '').trim()) {
      d.shouldSwap = false;
      return;
    }
    // Detached from the live end (see trimNewest): a new chunk would land after a gap.
    // A whole new log (the socket's catch-up of a page far behind) is the live end.
    var wholeLog = frag.firstElementChild && frag.firstElementChild.id === 'log';
    if (detached() && d.target && d.target.id === 'log' && !wholeLog) {
      skipped(frag);
      d.shouldSwap = false;
      return;
    }
    // A result goes to the first card with its key that has no result yet
    // (servers that repeat call ids make several cards share a key).
    var key = d.target.getAttribute && d.target.getAttribute('data-slot');
    if (key && frag.firstElementChild) {
      var slots = all(document, '.slot[data-slot="' + key + '"]');
      if (slots.length > 1) {
        var free = slots.filter(function (s) { return !s.querySelector(':scope > .has-result'); })[0];
        if ((free || slots[slots.length - 1]) !== d.target) d.shouldSwap = false;
      }
    }
  });

  // An insert aimed at a card that is not on the page (paged out) lands in the log.
  document.addEventListener('htmx:oobErrorNoTarget', function (evt) {
    var content = evt.detail.content;
    var fallback = content && content.getAttribute && content.getAttribute('data-fallback');
    var target = fallback && document.querySelector(fallback);
    if (detached() && content) skipped(content);
    if (!target || detached()) return;
    Array.prototype.slice.call(content.children).forEach(function (el) { upsert(el, target); });
  });

  // A search result's window (data-live-seq, from the server) is detached on purpose:
  // chunks the socket sends past it are left out but counted as held, so a reconnect's
  // hello does not make the server replace the window with the latest page.
  function skipped(frag) {
    var log = $('log');
    if (!log || !log.hasAttribute('data-live-seq')) return;
    var live = parseInt(log.getAttribute('data-live-seq'), 10) || 0;
    all(frag, '[data-seq]').forEach(function (el) {
      var n = parseInt(el.getAttribute('data-seq'), 10);
      if (n > live) live = n;
    });
    log.setAttribute('data-live-seq', String(live));
  }

  // --- Reconnect: say what the page holds now -----------------------------------------

  document.addEventListener('htmx:wsOpen', function (evt) {
    var log = $('log');
    if (!log) return;
    var last = 0;
    all(log, '[data-seq]').forEach(function (el) {
      var n = parseInt(el.getAttribute('data-seq'), 10);
      if (n > last) last = n;
    });
    var live = parseInt(log.getAttribute('data-live-seq') || '0', 10);
    if (detached() && live > last) last = live;
    var open = all(log, '.chunk.open').pop();
    var id = open ? open.id.slice('chunk-'.length) : '';
    var body = id ? $('body-' + id) : null;
    evt.detail.socketWrapper.send(JSON.stringify({
      type: 'hello',
      last_seq: last,
      open_id: id,
      // Code points, as the server counts them (not UTF-16 units).
      open_len: body ? [...body.textContent].length : 0
    }), evt.detail.elt);
  });

  // --- The log: thinking, following, the DOM window ------------------------------------

  // Thinking that streamed in opens as the reader's setting says, once: after that it is
  // the reader's to open or close (carryState keeps it through the seal). A page render
  // applies the setting itself; live fragments do not know it.
  function openThinking() {
    var log = $('log');
    if (!log) return;
    var expand = log.getAttribute('data-expand-thinking') === '1';
    all(log, 'details.t-thinking:not([data-seen])').forEach(function (el) {
      el.open = expand;
      el.setAttribute('data-seen', '');
    });
  }

  // The server's markup for a DOM window marker (a <template> in chat/tab.html).
  function marker(name) {
    return $(name + '-template').content.firstElementChild.cloneNode(true);
  }

  // After the oldest chunks went, "older" loads the page before the first one left.
  function restoreOlder(log) {
    var min = Infinity;
    all(log, '[data-seq]').forEach(function (el) {
      var n = parseInt(el.getAttribute('data-seq'), 10);
      if (n < min) min = n;
    });
    var older = $('older');
    if (older) older.remove();
    if (!isFinite(min)) return;
    older = marker('older');
    older.setAttribute('hx-get', older.getAttribute('hx-get') + min);
    log.insertBefore(older, log.firstChild);
    htmx.process(older);
  }

  function runningTurn() {
    var status = $('status');
    return status && status.getAttribute('data-state') !== 'idle' ? status.getAttribute('data-turn') : '';
  }

  // Drop the oldest chunks past the window; never the running turn's.
  function trim() {
    var log = $('log');
    var max = log ? parseInt(log.getAttribute('data-dom-window'), 10) : 0;
    if (!max) return;
    var count = log.querySelectorAll('.chunk').length;
    if (count <= max) return;
    var running = runningTurn();
    var el = log.querySelector(':scope > .chunk');
    var removed = false;
    while (el && count > max) {
      if (running && el.getAttribute('data-turn') === running) break;
      var next = el.nextElementSibling;
      count -= 1 + el.querySelectorAll('.chunk').length;
      // Branches cut before the first message have their control above it.
      var before = el.previousElementSibling;
      if (before && before.classList.contains('forks')) before.remove();
      el.remove();
      removed = true;
      el = next;
      // A "branches" control goes with the chunk it follows.
      while (el && !el.classList.contains('chunk') && el.id !== 'newer') {
        next = el.nextElementSibling;
        el.remove();
        el = next;
      }
    }
    // A first bubble whose turn began among the dropped chunks now shows as partial (app.css).
    if (removed) restoreOlder(log);
  }

  // Older pages past the window push out the newest chunks instead (never the running
  // turn's). The page is then detached from the live end: new chunks are not added
  // (they would follow a gap) until the reader jumps back to the latest page.
  function trimNewest() {
    var log = $('log');
    var max = log ? parseInt(log.getAttribute('data-dom-window'), 10) : 0;
    if (!max) return;
    var count = log.querySelectorAll('.chunk').length;
    var running = runningTurn();
    var chunks = all(log, ':scope > .chunk');
    var removed = false;
    while (count > max && chunks.length) {
      var el = chunks.pop();
      if (running && el.getAttribute('data-turn') === running) break;
      count -= 1 + el.querySelectorAll('.chunk').length;
      // A "branches" control goes with the chunk it follows.
      var after = el.nextElementSibling;
      while (after && (after.classList.contains('forks') || after.classList.contains('versions'))) {
        after.remove();
        after = el.nextElementSibling;
      }
      el.remove();
      removed = true;
    }
    if (removed && !detached()) log.appendChild(marker('newer'));
  }

  function detached() { return !!$('newer'); }

  // A message that only added text to open bodies (deltas) brought no chunk and took none:
  // nothing to open or trim, and its scroll waits for the next animation frame, so a
  // burst of deltas costs one layout, not a forced layout of the whole growing text each.
  var follow = true;
  var textOnly = true;
  var scrollPending = false;
  function isBody(el) { return !!(el && el.id && el.id.lastIndexOf('body-', 0) === 0); }
  document.addEventListener('htmx:oobBeforeSwap', function (evt) {
    if (!isBody(evt.detail.target)) textOnly = false;
  });
  document.addEventListener('htmx:oobErrorNoTarget', function () { textOnly = false; });
  document.addEventListener('htmx:wsBeforeMessage', function () {
    textOnly = true;
    // With a scroll pending the text has grown under a reader who was at the bottom:
    // measuring now would force a layout and say they are not.
    if (!scrollPending) follow = atBottom();
  });
  document.addEventListener('htmx:wsAfterMessage', function () {
    if (!textOnly) {
      openThinking();
      if (follow) {
        trim();
        toBottom();
      }
    } else if (follow && !scrollPending) {
      scrollPending = true;
      requestAnimationFrame(function () {
        scrollPending = false;
        if (follow) toBottom();
      });
    }
  });

  // A whole new log (the socket's catch-up of a page far behind) starts at its newest
  // message, as a page load does, before htmx looks whether its "older" trigger shows.
  document.addEventListener('htmx:oobAfterSwap', function (evt) {
    if (evt.target && evt.target.id === 'log') {
      follow = true;
      toBottom();
    }
  });

  // Older pages go in above what the reader looks at: the chunk that was first stays
  // where it was on the screen. Not a result shown on its own: the older page brings its
  // call's card with it and takes it from here.
  var loadingOlder = false;
  var anchor = null;
  var anchorTop = 0;
  document.addEventListener('htmx:beforeSwap', function (evt) {
    if (evt.detail.target && evt.detail.target.id === 'older') {
      loadingOlder = true;
      anchor = $('log').querySelector(':scope > .chunk:not(.t-tool-result)');
      anchorTop = anchor ? anchor.getBoundingClientRect().top : 0;
    }
  });
  document.addEventListener('htmx:afterSwap', function () {
    if (!loadingOlder) return;
    loadingOlder = false;
    trimNewest();
    if (anchor && anchor.isConnected) scroller().scrollTop += anchor.getBoundingClientRect().top - anchorTop;
    anchor = null;
  });

  // --- The tab list on a narrow screen -------------------------------------------------

  // app.css's breakpoint: below it the sidebar is folded away behind the ☰ button.
  var narrow = window.matchMedia('(max-width: 760px)');

  function navShown() { var t = $('nav-toggle'); return !!t && t.checked; }

  // The folded list is out of the Tab order and of the accessibility tree (inert); the
  // open one is a drawer over the page, which is inert behind it. The buttons say which.
  function syncNav() {
    var sidebar = $('sidebar');
    if (!sidebar) return;
    var open = navShown();
    sidebar.inert = narrow.matches && !open;
    var main = document.querySelector('.main');
    if (main) main.inert = narrow.matches && open;
    all(document, '[data-nav="open"]').forEach(function (b) { b.setAttribute('aria-expanded', String(open)); });
  }

  // `focus`: into the list when it opens (its current tab, else "New tab"), back to the
  // ☰ button when it closes (from the list, or the scrim, which holds no focus).
  function setNav(open, focus) {
    var toggle = $('nav-toggle');
    var sidebar = $('sidebar');
    if (!toggle || !sidebar) return;
    toggle.checked = open;
    syncNav();
    if (!focus || !narrow.matches) return;
    var target = open
      ? sidebar.querySelector('.tab-link.current') || sidebar.querySelector('.new-tab button')
      : document.querySelector('.main [data-nav="open"]');
    if (target) target.focus();
  }

  // Search, from its shortcuts: the one way in, whatever the search looks like. Returns
  // whether there is one on the page.
  function openSearch() {
    var box = $('search-q');
    if (!box) return false;
    if (narrow.matches) setNav(true, false);  // the box is in the folded list
    box.focus();
    box.select();
    return true;
  }

  document.addEventListener('click', function (e) {
    var button = e.target.closest && e.target.closest('[data-nav]');
    if (button) setNav(button.getAttribute('data-nav') === 'open', true);
  });
  // The scrim is the checkbox's label: a tap beside the open list closes it.
  document.addEventListener('change', function (e) {
    if (e.target && e.target.id === 'nav-toggle') setNav(e.target.checked, true);
  });
  // A list opened on a narrow screen is not left open for the next time it narrows.
  narrow.addEventListener('change', function () {
    var toggle = $('nav-toggle');
    if (toggle && !narrow.matches) toggle.checked = false;
    syncNav();
  });
  // Folded at first, whatever the browser restored into the checkbox on a reload.
  if ($('nav-toggle')) $('nav-toggle').checked = false;
  syncNav();

  // --- The composer -------------------------------------------------------------------

  var touch = window.matchMedia && window.matchMedia('(pointer: coarse)').matches;

  function grow(textarea) {
    textarea.style.height = 'auto';
    var max = Math.round(window.innerHeight * COMPOSER_MAX_SHARE);
    textarea.style.height = Math.min(textarea.scrollHeight + 2, max) + 'px';
  }

  document.addEventListener('keydown', function (e) {
    var t = e.target;
    // Search: "/" where it would type nothing, Ctrl+K (Cmd+K) anywhere; Esc clears it.
    var typing = t && (/^(INPUT|TEXTAREA|SELECT)$/.test(t.tagName) || t.isContentEditable);
    // (Chrome's autofill sends keydowns without a key.)
    if (((e.key === '/' && !typing && !e.ctrlKey && !e.metaKey && !e.altKey) ||
         ((e.key || '').toLowerCase() === 'k' && (e.ctrlKey || e.metaKey) && !e.altKey)) && openSearch()) {
      e.preventDefault();
      return;
    }
    if (e.key === 'Escape' && t && (t.id === 'search-q' || (t.closest && t.closest('.search-dialog')))) {
      t = $('search-q');
      e.preventDefault();
      t.value = '';
      $('search-results').textContent = '';
      t.blur();
      return;
    }
    // On touch keyboards Enter is the only way to start a new line: Send is a tap away.
    if (t && t.id === 'composer-text' && e.key === 'Enter' && !e.shiftKey && !e.isComposing && !touch) {
      e.preventDefault();
      t.form.requestSubmit();
      return;
    }
    if (e.key === 'Escape' && narrow.matches && navShown()) {
      e.preventDefault();
      setNav(false, true);
      return;
    }
    if (e.key === 'Escape') {
      var menu = document.querySelector('details.menu[open]');
      if (menu) {
        menu.open = false;
        return;
      }
      var stop = document.querySelector('[data-stop]');
      if (stop) {
        e.preventDefault();
        stop.click();
      }
    }
  });

  document.addEventListener('input', function (e) {
    if (e.target && e.target.id === 'composer-text') grow(e.target);
  });

  // The search's results are a dialog: a click outside it and the search field closes it.
  document.addEventListener('click', function (e) {
    var results = $('search-results');
    if (!results || !results.firstElementChild || !e.target.closest) return;
    if (e.target.closest('.search-dialog') || e.target.closest('#search-q')) return;
    results.textContent = '';
  });

  document.addEventListener('htmx:afterRequest', function (evt) {
    var form = evt.detail.elt;
    // A 422 swaps its error message but is no success: the text stays for fixing.
    if (form && form.id === 'composer' && evt.detail.successful && evt.detail.xhr.status < 300) {
      // Scrolled far back, the page shows no new chunks: go to the latest to see the answer.
      if (detached()) {
        window.location.assign($('newer').querySelector('a').href);
        return;
      }
      // The reset must not bring back an edit's draft, the textarea's default text.
      $('composer-text').defaultValue = '';
      form.reset();
      takeSent(evt.detail.requestConfig.formData.getAll('attachment'));
      grow($('composer-text'));
      follow = true;
      toBottom();
    }
  });

  // A menu closes when the reader clicks elsewhere.
  document.addEventListener('click', function (e) {
    all(document, 'details.menu[open]').forEach(function (menu) {
      if (!menu.contains(e.target)) menu.open = false;
    });
  });

  document.addEventListener('change', function (e) {
    if (e.target && e.target.matches('[data-autosubmit]')) e.target.form.requestSubmit();
  });

  // --- Copy ----------------------------------------------------------------------------

  // How long a copy button says "Copied".
  var COPIED_MS = 1500;

  // What a copy button copies: a message's markdown (its <template class="src">), a code
  // block's text, or a tool's output (else the result the model got).
  function copySource(btn) {
    var kind = btn.getAttribute('data-copy');
    if (kind === 'code') {
      var pre = btn.parentElement.querySelector('pre');
      return pre ? pre.textContent : '';
    }
    var chunk = btn.closest('.chunk');
    if (!chunk) return '';
    if (kind === 'md') {
      var src = chunk.querySelector(':scope > template.src');
      return src ? src.content.textContent : '';
    }
    var out = chunk.querySelector('.term, .result');
    return out ? out.textContent : '';
  }

  // navigator.clipboard exists only in secure contexts (https, localhost): on plain http to
  // a LAN address the copy goes through a selected textarea and the older copy command.
  function copyText(text) {
    if (navigator.clipboard && window.isSecureContext) {
      return navigator.clipboard.writeText(text).catch(function () {
        if (!legacyCopy(text)) throw new Error('copy refused');
      });
    }
    return legacyCopy(text) ? Promise.resolve() : Promise.reject(new Error('copy refused'));
  }

  function legacyCopy(text) {
    var focused = document.activeElement;
    var area = document.createElement('textarea');
    area.value = text;
    area.setAttribute('readonly', '');
    area.className = 'copy-buffer';
    document.body.appendChild(area);
    area.select();
    var ok = false;
    try {
      ok = document.execCommand('copy');
    } catch (err) {
      ok = false;
    }
    area.remove();
    if (focused && focused.focus) focused.focus();
    return ok;
  }

  // An icon button says it in its label (beside the icon for the moment), others in their text.
  function flash(btn, state, label) {
    var target = btn.querySelector('.act-label') || btn;
    var text = btn.getAttribute('data-label') || target.textContent;
    if (text) {
      btn.setAttribute('data-label', text);
      target.textContent = label;
    }
    btn.classList.add(state);
    setTimeout(function () {
      btn.classList.remove(state);
      if (text) target.textContent = text;
    }, COPIED_MS);
  }

  document.addEventListener('click', function (e) {
    var btn = e.target.closest && e.target.closest('[data-copy]');
    if (!btn) return;
    copyText(copySource(btn)).then(
      function () { flash(btn, 'copied', 'Copied'); },
      function () { flash(btn, 'copy-failed', 'Copy failed'); }
    );
  });

  // --- Connection state ----------------------------------------------------------------
  //
  // The status line is the server's word, and while the socket is down nothing tells the
  // page what happens: the line is marked stale (app.css hides it) until the catch-up after
  // the next connect replaces it, and #conn says since when the page has been cut off.
  // Send is an HTTP POST, not a socket message, but with the socket down the server is
  // most likely down too, and the page could not show the answer anyway: a message sent
  // then waits in the composer, visibly, and goes once the page is caught up again. It
  // goes once (the flag is cleared before the request), and a request that fails says so
  // and leaves the text where it is.

  // htmx's reconnect delay is random ("full jitter", so that the pages of a restarted server
  // do not all come back at once) up to 64 s; capped here so that a page finds its server
  // within seconds of a restart.
  var RECONNECT_MAX_MS = 5000;
  var RECONNECT_FIRST_MS = 500;
  // Close codes after which the ws extension tries again by itself (hx-ws-2.js).
  var HTMX_RETRIES = [1006, 1011, 1012, 1013];
  // chat/consumers.py: the socket refused the page (not its tab), or asked it to reconnect
  // and start over with a hello.
  var CLOSE_FORBIDDEN = 4403;
  var CLOSE_RESYNC = 4409;
  // No session, or it ended (signed out, password changed, account deactivated): a reload
  // lets the server decide, and it sends a signed-out page to sign-in (a page whose
  // session was only renewed, by its own password change, just reloads). Once in a while
  // only: a server that serves the page signed in but whose socket finds no session (a
  // proxy dropping the cookie on the upgrade) must not reload it for ever. The page's
  // tab was deleted: nothing to reconnect to.
  var CLOSE_SIGNED_OUT = 4401;
  var CLOSE_TAB_GONE = 4404;
  var SIGNED_OUT_RELOAD_MS = 10000;

  htmx.config.wsReconnectDelay = function (retries) {
    return Math.random() * Math.min(RECONNECT_MAX_MS, RECONNECT_FIRST_MS * Math.pow(2, retries));
  };

  // up: the status line is true; down: cut off since `since`, reconnecting; syncing:
  // connected again, the catch-up not in yet; gone: refused, a reload is the way back.
  var conn = { state: 'up', since: 0, ticker: 0, pending: false, leaving: false, tabGone: false };

  function connText() {
    var box = $('conn');
    if (!box) return;
    var text = '';
    if (conn.state === 'down') {
      var seconds = Math.max(0, Math.floor((Date.now() - conn.since) / 1000));
      text = 'Disconnected — reconnecting (' + seconds + ' s)';
    } else if (conn.state === 'syncing') {
      text = 'Reconnected — catching up…';
    } else if (conn.state === 'gone') {
      text = conn.tabGone ? 'This tab was deleted.' : 'Disconnected: signed out, or this tab was deleted.';
    }
    if (conn.pending) text += ' · will send when reconnected';
    box.querySelector('.conn-text').textContent = text;
    box.querySelector('.conn-cancel').hidden = !conn.pending;
    box.querySelector('.conn-reload').hidden = conn.state !== 'gone' || conn.tabGone;
    box.hidden = conn.state === 'up';
    box.setAttribute('data-state', conn.state);
  }

  function sendButton() {
    var form = $('composer');
    var btn = form && form.querySelector('.send');
    if (!btn) return;
    btn.disabled = conn.pending || conn.state === 'gone';
    if (conn.pending) {
      btn.title = 'Will send when reconnected';
    } else if (conn.state === 'gone') {
      btn.title = 'Not connected: reload the page first (the text is kept)';
    } else if (conn.state !== 'up') {
      btn.title = 'Not connected: the message will wait here and go once the page is reconnected';
    } else {
      btn.title = btn.getAttribute('data-title') || btn.title;
    }
  }

  function setConn(state) {
    conn.state = state;
    if (state === 'down' && !conn.ticker) {
      conn.ticker = setInterval(connText, 1000);
    } else if (state !== 'down' && conn.ticker) {
      clearInterval(conn.ticker);
      conn.ticker = 0;
    }
    connText();
    sendButton();
  }

  var sendBtn = document.querySelector('#composer .send');
  if (sendBtn) sendBtn.setAttribute('data-title', sendBtn.title);

  // A page going away closes its socket: not a disconnection to show (unless it comes
  // back from the back-forward cache).
  window.addEventListener('pagehide', function () { conn.leaving = true; });
  window.addEventListener('pageshow', function () { conn.leaving = false; });

  // A form posted the ordinary way (Log out; htmx's forms prevent the default) is about
  // to replace the page: the close its own request caused (the sign-out's) must not
  // reload the page over that navigation.
  var SUBMIT_GRACE_MS = 10000;
  var submittedAt = 0;
  document.addEventListener('submit', function (evt) {
    if (!evt.defaultPrevented) submittedAt = Date.now();
  });

  function signedOutReload() {
    if (Date.now() - submittedAt < SUBMIT_GRACE_MS) return false;
    var key = 'dispatch-signed-out-reload';
    var last = 0;
    try { last = Number(window.sessionStorage.getItem(key)) || 0; } catch (err) { last = 0; }
    if (Date.now() - last < SIGNED_OUT_RELOAD_MS) return false;
    try { window.sessionStorage.setItem(key, String(Date.now())); } catch (err) { /* reload anyway */ }
    conn.leaving = true;
    window.location.reload();
    return true;
  }

  document.addEventListener('htmx:wsClose', function (evt) {
    if (conn.leaving) return;
    var code = evt.detail.event && evt.detail.event.code;
    var wrapper = evt.detail.socketWrapper;
    var status = $('status');
    if (code === CLOSE_RESYNC) {
      wrapper.reconnect();
      return;
    }
    if (code === CLOSE_SIGNED_OUT && signedOutReload()) return;
    if (status) status.setAttribute('data-stale', '');
    if (code === CLOSE_FORBIDDEN || code === CLOSE_TAB_GONE || code === CLOSE_SIGNED_OUT) {
      conn.tabGone = code === CLOSE_TAB_GONE;
      setConn('gone');
      return;
    }
    if (conn.state !== 'down') conn.since = Date.now();
    setConn('down');
    // A clean close (a server shutting down may send one) is not retried by htmx.
    if (HTMX_RETRIES.indexOf(code) < 0) {
      setTimeout(function () { wrapper.reconnect(); }, htmx.config.wsReconnectDelay(0));
    }
  });

  document.addEventListener('htmx:wsOpen', function () {
    var status = $('status');
    setConn(status && status.hasAttribute('data-stale') ? 'syncing' : 'up');
  });

  // The catch-up ends with a status frame: a status line without the stale mark is true again.
  document.addEventListener('htmx:wsAfterMessage', function () {
    if (conn.state !== 'syncing') return;
    var status = $('status');
    if (status && status.hasAttribute('data-stale')) return;
    setConn('up');
    if (conn.pending) {
      conn.pending = false;
      connText();
      sendButton();
      $('composer').requestSubmit();
    }
  });

  document.addEventListener('htmx:beforeRequest', function (evt) {
    if (evt.detail.elt.id !== 'composer' || conn.state === 'up') return;
    evt.preventDefault();
    if (conn.state === 'gone') {
      composerError('Not sent: reload the page first (the text is kept).');
      return;
    }
    conn.pending = true;
    connText();
    sendButton();
  });

  document.addEventListener('click', function (e) {
    if (e.target.closest && e.target.closest('.conn-reload')) window.location.reload();
    if (!e.target.closest || !e.target.closest('.conn-cancel')) return;
    conn.pending = false;
    connText();
    sendButton();
    $('composer-text').focus();
  });

  function composerError(text) {
    var line = $('composer-error');
    if (line) line.textContent = text;
  }

  // A request that never reached the server (or got no answer) changed nothing the page
  // can see: say so, and leave the composer's text where it is.
  document.addEventListener('htmx:sendError', function (evt) {
    var elt = evt.detail.elt;
    if (elt && elt.id === 'composer') {
      // The request may have reached the server before the connection died: never claim
      // it did not (a resend would then post it twice); the log will say once reconnected.
      composerError('No answer from the server: your message may not have been sent. It is still here; once the page is reconnected, check the log before sending it again.');
    } else {
      composerError('No answer from the server: that may not have been done. Check once the page is reconnected.');
    }
  });
  document.addEventListener('htmx:responseError', function (evt) {
    var elt = evt.detail.elt;
    var code = evt.detail.xhr ? evt.detail.xhr.status : 0;
    if (elt && elt.id === 'composer') {
      composerError('The server could not take your message (HTTP ' + code + '). It is still here: try again.');
    }
  });

  // The composer's text outlives a reload (a page reloaded while its server is down loses
  // everything else), until it is sent.
  var DRAFT_KEY = $('composer') ? 'dispatch-draft:' + $('composer').getAttribute('action') : '';
  function storeDraft(text) {
    if (!DRAFT_KEY) return;
    try {
      if (text) window.localStorage.setItem(DRAFT_KEY, text);
      else window.localStorage.removeItem(DRAFT_KEY);
    } catch (err) {
      // No storage (a privacy setting): the text is still in the composer.
    }
  }
  document.addEventListener('input', function (e) {
    if (e.target && e.target.id === 'composer-text') storeDraft(e.target.value);
  });
  document.addEventListener('htmx:afterRequest', function (evt) {
    var elt = evt.detail.elt;
    if (elt && elt.id === 'composer' && evt.detail.successful && evt.detail.xhr.status < 300) storeDraft('');
  });
  (function restoreDraft() {
    var area = $('composer-text');
    if (!area || area.value || !DRAFT_KEY) return;
    var text = null;
    try { text = window.localStorage.getItem(DRAFT_KEY); } catch (err) { text = null; }
    if (text) area.value = text;
  })();

  // --- Attachments ---------------------------------------------------------------------
  //
  // Files for the next message come from the attach button, a drop anywhere on the page and
  // a paste of files (a screenshot). Each batch is one upload: the server normalises and
  // stores every file or refuses the batch with one line of text (shown on the error line),
  // and answers with each file's tray markup (chat/_attachment.html), which carries the
  // hidden `attachment` input the message form sends. Until then the tray shows the batch
  // uploading. A message may be files alone: the text is required only while the tray is
  // empty, and Send waits for uploads in flight.

  var tray = $('attach-tray');

  function csrfToken() {
    var input = document.querySelector('#composer [name="csrfmiddlewaretoken"]');
    return input ? input.value : '';
  }

  function trayChanged() {
    $('composer-text').required = !tray.querySelector('.att');
  }

  function uploading(files) {
    var el = document.createElement('div');
    el.className = 'att uploading';
    el.setAttribute('role', 'status');
    var spin = document.createElement('span');
    spin.className = 'spinner';
    spin.setAttribute('aria-hidden', 'true');
    var label = document.createElement('span');
    label.className = 'att-name';
    label.textContent = 'Uploading ' + (files.length === 1 ? files[0].name : files.length + ' files') + '…';
    el.append(spin, label);
    return el;
  }

  // The server's answer goes in place of the batch's placeholder; a file the tray already
  // holds (the same screenshot pasted twice) stays there once.
  function attached(placeholder, html) {
    var tpl = document.createElement('template');
    tpl.innerHTML = html;
    all(tpl.content, 'input[name="attachment"]').forEach(function (input) {
      var twin = tray.querySelector('input[name="attachment"][value="' + CSS.escape(input.value) + '"]');
      if (twin) input.closest('.att').remove();
    });
    placeholder.replaceWith(tpl.content);
  }

  function upload(fileList) {
    var files = Array.prototype.slice.call(fileList || []);
    if (!tray || !files.length) return;
    var placeholder = uploading(files);
    var label = placeholder.querySelector('.att-name');
    var what = label.textContent;
    tray.appendChild(placeholder);
    trayChanged();
    composerError('');
    var body = new FormData();
    files.forEach(function (file) { body.append('file', file, file.name); });
    var xhr = new XMLHttpRequest();
    xhr.open('POST', tray.getAttribute('data-upload'));
    xhr.setRequestHeader('X-CSRFToken', csrfToken());
    // XHR, not fetch: fetch cannot tell how much of a large photo has gone.
    xhr.upload.onprogress = function (e) {
      if (e.lengthComputable) label.textContent = what + ' ' + Math.floor((100 * e.loaded) / e.total) + '%';
    };
    xhr.onload = function () {
      if (xhr.status === 200) {
        attached(placeholder, xhr.responseText);
      } else {
        placeholder.remove();
        var reason = (xhr.responseText || '').split('\n')[0].trim();
        composerError(xhr.status === 400 && reason
          ? 'Not attached: ' + reason
          : 'The server could not take the files (HTTP ' + xhr.status + ').');
      }
      trayChanged();
    };
    xhr.onerror = function () {
      placeholder.remove();
      trayChanged();
      composerError('No answer from the server: the files were not attached. Try again once the page is reconnected.');
    };
    xhr.send(body);
  }

  // After a send, the files it carried leave the tray; any added while it was on its way stay.
  function takeSent(values) {
    if (!tray) return;
    all(tray, 'input[name="attachment"]').forEach(function (input) {
      if (values.indexOf(input.value) >= 0) input.closest('.att').remove();
    });
    trayChanged();
  }

  if (tray) {
    var picker = $('attach-input');
    $('attach-btn').addEventListener('click', function () { picker.click(); });
    picker.addEventListener('change', function () {
      upload(picker.files);
      // The same file may be picked again after it was removed.
      picker.value = '';
    });

    tray.addEventListener('click', function (e) {
      var remove = e.target.closest('.att-remove');
      if (!remove) return;
      remove.closest('.att').remove();
      trayChanged();
      $('composer-text').focus();
    });

    document.addEventListener('htmx:beforeRequest', function (evt) {
      if (evt.detail.elt.id !== 'composer' || !tray.querySelector('.uploading')) return;
      evt.preventDefault();
      composerError('Not sent yet: wait for the files to finish uploading.');
    });

    // Another field (search, a title, the system prompt) keeps its own paste.
    document.addEventListener('paste', function (e) {
      var t = e.target;
      if (t && /^(INPUT|TEXTAREA|SELECT)$/.test(t.tagName) && t.id !== 'composer-text') return;
      var files = e.clipboardData && e.clipboardData.files;
      if (!files || !files.length) return;
      e.preventDefault();
      upload(files);
    });

    // A drop anywhere attaches: left to the browser, it would open the file instead of the page.
    var composer = $('composer');
    var carriesFiles = function (e) {
      return !!e.dataTransfer && Array.prototype.indexOf.call(e.dataTransfer.types, 'Files') >= 0;
    };
    document.addEventListener('dragover', function (e) {
      if (!carriesFiles(e)) return;
      e.preventDefault();
      e.dataTransfer.dropEffect = 'copy';
      composer.classList.add('dropping');
    });
    document.addEventListener('dragleave', function (e) {
      if (!e.relatedTarget) composer.classList.remove('dropping');
    });
    document.addEventListener('drop', function (e) {
      if (!carriesFiles(e)) return;
      e.preventDefault();
      composer.classList.remove('dropping');
      upload(e.dataTransfer.files);
    });
  }

  // --- Jump to the latest --------------------------------------------------------------

  // Shown while the reader is scrolled up; says "new below" once the socket added or grew
  // something in the log meanwhile (the log does not follow then: see `follow`).
  var jump = $('jump');
  var grewLog = false;
  var jumpPending = false;

  function updateJump() {
    if (!jump) return;
    var away = !atBottom();
    jump.hidden = !away;
    if (!away) jump.classList.remove('has-new');
  }

  window.addEventListener('scroll', function () {
    if (jumpPending) return;
    jumpPending = true;
    requestAnimationFrame(function () {
      jumpPending = false;
      updateJump();
    });
  }, { passive: true });

  document.addEventListener('htmx:oobBeforeSwap', function (evt) {
    var log = $('log');
    var target = evt.detail.target;
    if (log && target && log.contains(target)) grewLog = true;
  });
  document.addEventListener('htmx:wsAfterMessage', function () {
    if (!jump) return;
    if (grewLog && !follow) {
      jump.classList.add('has-new');
      jump.hidden = false;
    }
    grewLog = false;
  });

  if (jump) {
    jump.addEventListener('click', function () {
      // Scrolled far back, the page holds no newer chunks: the latest is another page.
      if (detached()) {
        window.location.assign($('newer').querySelector('a').href);
        return;
      }
      follow = true;
      toBottom();
      updateJump();
    });
  }

  // --- Notifications -------------------------------------------------------------------

  // With the reader's consent (asked from a click, never on load), a notification when a
  // turn ends or waits for approval while the page is not visible. Notifications exist only
  // in secure contexts (https, localhost); elsewhere the switch stays hidden.
  var NOTIFY_KEY = 'dispatch-notify';
  var notifyBtn = $('notify-toggle');
  var canNotify = 'Notification' in window && window.isSecureContext;

  function notifyWanted() {
    var on = false;
    try { on = window.localStorage.getItem(NOTIFY_KEY) === '1'; } catch (err) { on = false; }
    return on && Notification.permission === 'granted';
  }

  function notifyLabel() {
    if (!notifyBtn || !canNotify) return;
    notifyBtn.hidden = false;
    var denied = Notification.permission === 'denied';
    var on = notifyWanted();
    notifyBtn.textContent = denied ? 'Notifications blocked' : on ? 'Notifications on' : 'Notify me';
    notifyBtn.setAttribute('aria-pressed', String(on));
    notifyBtn.title = denied
      ? 'The browser blocks notifications from this site: allow them in its site settings'
      : on ? 'Stop notifying' : notifyBtn.getAttribute('data-title');
  }

  function setNotify(on) {
    try {
      if (on) window.localStorage.setItem(NOTIFY_KEY, '1');
      else window.localStorage.removeItem(NOTIFY_KEY);
    } catch (err) {
      // Not remembered: nothing to switch.
    }
    notifyLabel();
  }

  if (notifyBtn && canNotify) {
    notifyBtn.setAttribute('data-title', notifyBtn.title);
    notifyLabel();
    // Allowed or blocked in the browser's site settings later: the switch follows.
    if (navigator.permissions && navigator.permissions.query) {
      navigator.permissions.query({ name: 'notifications' }).then(function (state) {
        state.onchange = notifyLabel;
      }, function () {});
    }
    notifyBtn.addEventListener('click', function () {
      if (notifyWanted()) {
        setNotify(false);
      } else if (Notification.permission === 'granted') {
        setNotify(true);
      } else if (Notification.permission === 'default') {
        Notification.requestPermission().then(function (answer) { setNotify(answer === 'granted'); });
      }
    });
  }

  // The tab this page shows ('' for a page that shows none): its socket's, else the
  // sidebar's current entry (a tab's delete page).
  function pageTab() {
    var live = $('live');
    var m = live && /\/ws\/tabs\/([^/]+)\//.exec(live.getAttribute('ws-connect') || '');
    if (m) return m[1];
    var current = document.querySelector('#tab-list > .tab-link[aria-current]');
    return current ? tabOf(current) : '';
  }
  // One notification per tab, whichever page made it: a newer one replaces it.
  function notifyTag(tabId) { return 'dispatch-tab-' + (tabId || 'none'); }

  var shown = null;
  function notify(body) {
    if (!canNotify || !notifyWanted() || document.visibilityState === 'visible') return;
    var title = $('tab-title');
    shown = new Notification(title ? title.textContent : 'Dispatch', {
      body: body,
      tag: notifyTag(pageTab())
    });
    shown.onclick = function () {
      window.focus();
      this.close();
    };
  }

  document.addEventListener('visibilitychange', function () {
    if (document.visibilityState === 'visible' && shown) {
      shown.close();
      shown = null;
    }
  });

  // How the turn ended, from its last chunk: an answer, an error, a compaction (a turn of its
  // own when asked for), or a notice (stopped, interrupted by a restart, cut at the output
  // limit).
  function ending() {
    var chunks = document.querySelectorAll('#log > .chunk');
    var last = chunks[chunks.length - 1];
    var notice = last && last.classList.contains('t-system') && last.querySelector('.sys-text');
    if (last && last.classList.contains('t-error')) return 'The turn ended with an error.';
    if (last && last.classList.contains('t-compaction')) return 'The conversation was compacted.';
    if (notice) return 'The turn ended: ' + notice.textContent.trim();
    return 'The answer is ready.';
  }

  // The status line's details (model, tokens) stay open across the status frames that
  // replace it while a turn runs, until closed (by its button, Escape or a click elsewhere).
  var statusMoreOpen = false;
  document.addEventListener('toggle', function (e) {
    var d = e.target;
    if (d.classList && d.classList.contains('status-more') && d.isConnected) statusMoreOpen = d.open;
  }, true);
  document.addEventListener('htmx:wsAfterMessage', function () {
    var d = document.querySelector('#status .status-more');
    if (d && statusMoreOpen && !d.open) d.open = true;
  });
  function closeStatusMore() {
    var d = document.querySelector('#status .status-more[open]');
    statusMoreOpen = false;
    if (d) d.open = false;
  }
  document.addEventListener('click', function (e) {
    if (statusMoreOpen && !(e.target.closest && e.target.closest('.status-more'))) closeStatusMore();
  });
  // Before the page's own Escape (which stops the turn): this Escape only closes the details.
  window.addEventListener('keydown', function (e) {
    if (e.key !== 'Escape' || !statusMoreOpen) return;
    e.stopPropagation();
    closeStatusMore();
  }, true);

  // A turn's end and a wait for approval are changes of the status line's state.
  var lastStatus = $('status');
  var lastState = lastStatus ? lastStatus.getAttribute('data-state') : 'idle';
  document.addEventListener('htmx:wsAfterMessage', function () {
    var status = $('status');
    if (!status || status === lastStatus || status.hasAttribute('data-stale')) return;
    lastStatus = status;
    var state = status.getAttribute('data-state');
    if (state === lastState) return;
    if (state === 'idle') {
      notify(ending());
    } else if (state === 'waiting') {
      var what = document.querySelector('#approval .approval-what');
      notify('Waiting for your approval' + (what ? ': ' + what.textContent.replace(/^Approve\s+/, '') : '.'));
    }
    lastState = state;
  });

  // --- The sidebar: the user channel ---------------------------------------------------

  // Every page's socket carries the user channel (chat.sidebar): a tab of the user's that
  // changes state or appears comes as its sidebar entry. On each (re)connect the page says
  // what its list holds, and the server sends the entries that changed meanwhile.
  // An entry is a conversation's (its id); the tab it opens is its data-tab.
  function tabOf(link) { return link.getAttribute('data-tab') || link.id.slice('tablink-'.length); }
  document.addEventListener('htmx:wsOpen', function (evt) {
    var held = {};
    all(document, '#tab-list > .tab-link').forEach(function (a) {
      held[tabOf(a)] = a.getAttribute('data-state') || 'idle';
    });
    evt.detail.socketWrapper.send(JSON.stringify({
      type: 'sidebar', current: pageTab(), held: held
    }), evt.detail.elt);
  });

  // Which page is in front, across this browser's pages of the site: a tab waiting for
  // approval notifies from any page, but not while its own page is the one in front
  // (that page shows the approval bar). A page that goes away without saying so (a crash)
  // is replaced by the next page that comes to the front.
  var FRONT_KEY = 'dispatch-front';
  var pageId = Math.random().toString(36).slice(2);
  function readFront() {
    try { return JSON.parse(window.localStorage.getItem(FRONT_KEY) || 'null') || {}; } catch (err) { return {}; }
  }
  function markFront(leaving) {
    try {
      if (!leaving && document.visibilityState === 'visible') {
        window.localStorage.setItem(FRONT_KEY, JSON.stringify({ tab: pageTab(), page: pageId }));
      } else if (readFront().page === pageId) {
        window.localStorage.removeItem(FRONT_KEY);
      }
    } catch (err) {
      // No storage: every page notifies, as if none were in front.
    }
  }
  markFront(false);
  document.addEventListener('visibilitychange', function () { markFront(false); });
  window.addEventListener('focus', function () { markFront(false); });
  window.addEventListener('pagehide', function () { markFront(true); });

  // The call each waiting tab was notified for ('' for a wait the page loaded with).
  var notified = {};
  all(document, '#tab-list > .tab-link[data-state="waiting"]').forEach(function (a) {
    notified[tabOf(a)] = '';
  });

  function notifyWaiting(link) {
    var id = tabOf(link);
    // This page's own tab notifies from its status line (only while the page is hidden).
    if (!canNotify || !notifyWanted() || id === pageTab() || readFront().tab === id) return;
    var tool = link.getAttribute('data-tool');
    var title = link.querySelector('.tab-title');
    var href = link.getAttribute('href');
    var note = new Notification(title ? title.textContent.trim() : 'Dispatch', {
      body: 'Waiting for your approval' + (tool ? ': ' + tool : '.'),
      tag: notifyTag(id)
    });
    note.onclick = function () {
      window.focus();
      this.close();
      window.location.assign(href);
    };
  }

  document.addEventListener('htmx:wsAfterMessage', function (evt) {
    var m = evt.detail && evt.detail.message;
    if (typeof m !== 'string' || m.indexOf('id="tablink-') < 0) return;
    all(document, '#tab-list > .tab-link').forEach(function (a) {
      var id = tabOf(a);
      if (a.getAttribute('data-state') !== 'waiting') {
        delete notified[id];
        return;
      }
      var call = a.getAttribute('data-call') || '';
      if (id in notified && (notified[id] === call || !call)) return;
      notified[id] = call;
      notifyWaiting(a);
    });
  });

  // --- Tool cards ----------------------------------------------------------------------

  // A call without a result in the running turn runs (or is about to): the first such card
  // shows a spinner and its elapsed time, output or not (the server's `tool_run` markup,
  // shown by app.css on `.running`; its clock is the status line's, below). The clock
  // starts when the page saw the call start; a page loaded while it runs has only the
  // server's data-since, when the model asked for it, which for a call that waited for
  // approval or behind another call counts that wait too.
  var running = { id: '', since: '', booted: false };

  function markRunningCall() {
    var status = $('status');
    var state = status ? status.getAttribute('data-state') : 'idle';
    var turn = state === 'running' || state === 'stopping' ? status.getAttribute('data-turn') : '';
    var card = null;
    if (turn) {
      card = all(document, '#log .t-tool-call').filter(function (el) {
        return el.getAttribute('data-turn') === turn && !el.querySelector('.slot > .has-result');
      })[0] || null;
    }
    all(document, '#log .t-tool-call.running').forEach(function (el) {
      if (el === card) return;
      el.classList.remove('running');
      var old = el.querySelector('.tool-clock');
      if (old) old.classList.remove('elapsed');
    });
    var started = !!card && card.id !== running.id;
    running.id = card ? card.id : '';
    if (!card || card.classList.contains('running')) return;
    var clock = card.querySelector('.tool-clock');
    if (!clock) return;
    if (started && running.booted) {
      clock.setAttribute('data-since', String(Date.now()));
    } else if (!started) {
      // The same call sent again (a reconnect's catch-up): its clock goes on.
      clock.setAttribute('data-since', running.since);
    }
    running.since = clock.getAttribute('data-since');
    card.classList.add('running');
    clock.classList.add('elapsed');
    tickClocks();
  }

  document.addEventListener('htmx:wsAfterMessage', function () {
    if (!textOnly) markRunningCall();
  });
  markRunningCall();
  running.booted = true;

  // --- Clock ---------------------------------------------------------------------------

  function tickClocks() {
    all(document, '.elapsed[data-since]').forEach(function (el) {
      var seconds = Math.max(0, Math.floor((Date.now() - parseInt(el.getAttribute('data-since'), 10)) / 1000));
      var rest = seconds % 60;
      el.textContent = Math.floor(seconds / 60) + ':' + (rest < 10 ? '0' : '') + rest;
    });
    all(document, '.waiting[data-since]').forEach(function (el) {
      var seconds = Math.max(0, Math.floor((Date.now() - parseInt(el.getAttribute('data-since'), 10)) / 1000));
      el.textContent = 'waiting for the model · ' + seconds + ' s';
    });
  }
  setInterval(tickClocks, 1000);


  // === Settings helper: confirmations, the model picker, a token's Copy ==================
  //
  // Confirmations: a form with data-confirm="question" asks in a modal <dialog> (the browser
  // keeps the focus inside it and Escape cancels) before it is sent; the confirm button says
  // the form's data-confirm-action, else its submit button's words. Confirmed, the form is
  // submitted again (htmx forms too: the first submit never reached them).

  var confirmedForm = null;

  function confirmDialog() {
    var dialog = $('confirm-dialog');
    if (dialog) return dialog;
    dialog = document.createElement('dialog');
    dialog.id = 'confirm-dialog';
    dialog.className = 'confirm-dialog';
    dialog.setAttribute('aria-labelledby', 'confirm-text');
    var text = document.createElement('p');
    text.id = 'confirm-text';
    var row = document.createElement('form');
    row.method = 'dialog';
    row.className = 'row';
    var cancel = document.createElement('button');
    cancel.className = 'btn';
    cancel.value = 'cancel';
    cancel.textContent = 'Cancel';
    var ok = document.createElement('button');
    ok.className = 'btn danger';
    ok.id = 'confirm-ok';
    ok.value = 'ok';
    row.append(cancel, ok);
    dialog.append(text, row);
    document.body.appendChild(dialog);
    return dialog;
  }

  function askConfirm(form, message, submitter) {
    var dialog = confirmDialog();
    $('confirm-text').textContent = message;
    $('confirm-ok').textContent = form.getAttribute('data-confirm-action') ||
      (submitter && submitter.textContent.trim()) || 'Confirm';
    dialog.returnValue = '';
    dialog.onclose = function () {
      if (dialog.returnValue === 'ok') {
        confirmedForm = form;
        form.requestSubmit(submitter && submitter.form === form ? submitter : undefined);
      } else if (submitter) {
        submitter.focus();
      }
    };
    dialog.showModal();
  }

  document.addEventListener('submit', function (e) {
    var form = e.target;
    var message = form.getAttribute && form.getAttribute('data-confirm');
    if (!message) return;
    if (confirmedForm === form) {
      confirmedForm = null;
      return;
    }
    e.preventDefault();
    e.stopImmediatePropagation();
    askConfirm(form, message, e.submitter);
  }, true);

  // The model picker (templates/chat/_model_picker.html): opening it shows and focuses its
  // filter; typing narrows the list to the models whose id or name holds every word; Enter
  // picks the first model left that can run; Escape or a click elsewhere closes it.

  function pickerFilter(input) {
    var picker = input.closest('[data-model-picker]');
    var words = input.value.toLowerCase().split(/\s+/).filter(Boolean);
    all(picker, '[data-picker-item]').forEach(function (item) {
      var text = item.getAttribute('data-picker-item').toLowerCase();
      item.hidden = !words.every(function (w) { return text.indexOf(w) >= 0; });
    });
    all(picker, '.picker-panel ul').forEach(function (list) {
      var shown = !!list.querySelector('[data-picker-item]:not([hidden])') || !words.length;
      list.hidden = !shown;
      var label = list.previousElementSibling;
      if (label && label.classList.contains('picker-group')) label.hidden = !shown;
    });
  }

  document.addEventListener('toggle', function (e) {
    var picker = e.target;
    if (!picker.matches || !picker.matches('[data-model-picker]') || !picker.open) return;
    var input = picker.querySelector('[data-picker-filter]');
    if (!input) return;
    input.hidden = false;
    input.focus();
  }, true);

  document.addEventListener('input', function (e) {
    if (e.target.matches && e.target.matches('[data-picker-filter]')) pickerFilter(e.target);
  });

  document.addEventListener('keydown', function (e) {
    var picker = e.target.closest && e.target.closest('[data-model-picker]');
    if (!picker) return;
    if (e.key === 'Escape') {
      picker.open = false;
      picker.querySelector('summary').focus();
    } else if (e.key === 'Enter' && e.target.matches('[data-picker-filter]')) {
      e.preventDefault();
      var first = picker.querySelector('[data-picker-item]:not([hidden]) button:not([disabled])');
      if (first) first.click();
    }
  });

  document.addEventListener('click', function (e) {
    // An error card's "Choose another model" opens the picker instead of jumping to it.
    var opener = e.target.closest && e.target.closest('a[href="#model-picker"]');
    var wanted = opener && $('model-picker');
    if (wanted) {
      e.preventDefault();
      wanted.scrollIntoView({block: 'nearest'});
      wanted.open = true;
    }
    all(document, '[data-model-picker][open]').forEach(function (picker) {
      if (picker !== wanted && !picker.contains(e.target)) picker.open = false;
    });
  });

  // A token shown once: its Copy button (shown only where scripts run) copies the text of
  // the element it names.
  all(document, '[data-copy-from]').forEach(function (btn) { btn.hidden = false; });
  document.addEventListener('click', function (e) {
    var btn = e.target.closest && e.target.closest('[data-copy-from]');
    if (!btn) return;
    var source = $(btn.getAttribute('data-copy-from'));
    copyText(source ? source.textContent.trim() : '').then(
      function () { flash(btn, 'copied', 'Copied'); },
      function () { flash(btn, 'copy-failed', 'Copy failed'); }
    );
  });

  // === end of the Settings helper ========================================================

  // The deferred script runs once the page is parsed: start at the newest message, or
  // at the chunk a search result opened the page at.
  // An edit's branch opens with the old message in the composer, ready to change.
  var draft = $('composer-text');
  if (draft && draft.value) {
    draft.focus();
    draft.setSelectionRange(draft.value.length, draft.value.length);
    grow(draft);
    draft.scrollTop = draft.scrollHeight;
  }

  var hit = document.querySelector('#log .chunk.hit');
  if (hit) {
    follow = false;
    hit.scrollIntoView({ block: 'center' });
  } else if ($('log')) {
    toBottom();
  }
})();
