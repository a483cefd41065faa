// Dispatch's light/dark theme: the system's, unless the reader chose one in this browser.
//
// A blocking script in <head>, not app.js (deferred) and not inline (the CSP allows only
// scripts from the site): it runs before <body> is parsed and before the first paint, so a
// page never shows the other theme first. It sets <html data-theme="light|dark"> (what
// app.css colours by) and data-theme-pref="auto|light|dark" (which the buttons show).
//
// The choice is localStorage "theme", the key and values Django's admin uses for its own
// toggle: one choice for the app and the admin.
(function () {
  'use strict';

  var KEY = 'theme';
  var root = document.documentElement;
  var system = window.matchMedia('(prefers-color-scheme: dark)');
  // A choice storage refused (a privacy setting): this page keeps it, nothing remembers it.
  var unsaved = null;

  function stored() {
    if (unsaved) return unsaved;
    var value = null;
    try { value = window.localStorage.getItem(KEY); } catch (err) { value = null; }
    return value === 'light' || value === 'dark' ? value : 'auto';
  }

  function apply() {
    var pref = stored();
    root.setAttribute('data-theme-pref', pref);
    root.setAttribute('data-theme', pref === 'auto' ? (system.matches ? 'dark' : 'light') : pref);
    var buttons = document.querySelectorAll('[data-theme-set]');
    for (var i = 0; i < buttons.length; i++) {
      buttons[i].setAttribute('aria-pressed', String(buttons[i].getAttribute('data-theme-set') === pref));
    }
  }

  apply();
  // "Auto" follows the system as it changes (a dark mode that starts at sunset).
  system.addEventListener('change', apply);
  // A choice made in another tab applies here too.
  window.addEventListener('storage', function (e) { if (e.key === KEY || e.key === null) apply(); });
  document.addEventListener('DOMContentLoaded', apply);

  document.addEventListener('click', function (e) {
    var btn = e.target.closest && e.target.closest('[data-theme-set]');
    if (!btn) return;
    var pref = btn.getAttribute('data-theme-set');
    try {
      if (pref === 'auto') window.localStorage.removeItem(KEY);
      else window.localStorage.setItem(KEY, pref);
    } catch (err) {
      unsaved = pref;
    }
    apply();
  });
})();
