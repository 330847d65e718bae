// The dashboard refreshes its figures every few seconds, unless the operator paused it.
// A file, not an inline script, so a Content-Security-Policy of script-src 'self' allows it.
// The pause is remembered in localStorage, for every dashboard tab of this browser.
(function () {
  "use strict";
  var control = document.getElementById("ops-refresh");
  if (!control) {
    return;
  }
  var KEY = "rc-dashboard-refresh-paused";
  var seconds = Number(control.dataset.seconds) || 15;
  var button = document.getElementById("ops-refresh-toggle");
  var status = document.getElementById("ops-refresh-status");
  var timer = null;

  function paused() {
    try {
      return window.localStorage.getItem(KEY) === "1";
    } catch (error) {
      return false;
    }
  }

  function show() {
    var isPaused = paused();
    button.textContent = isPaused ? control.dataset.resumeLabel : control.dataset.pauseLabel;
    button.setAttribute("aria-pressed", isPaused ? "true" : "false");
    status.textContent = isPaused ? control.dataset.pausedText : control.dataset.runningText;
    control.classList.toggle("ops-refresh-paused", isPaused);
  }

  function schedule() {
    window.clearTimeout(timer);
    if (!paused()) {
      timer = window.setTimeout(refresh, seconds * 1000);
    }
  }

  // Fetch the page again and swap its figures in place: no flicker, the scroll position stays.
  function refresh() {
    window
      .fetch(window.location.href, { credentials: "same-origin" })
      .then(function (response) {
        if (!response.ok) {
          throw new Error("HTTP " + response.status);
        }
        return response.text();
      })
      .then(function (html) {
        var fresh = new DOMParser().parseFromString(html, "text/html").getElementById("ops-live");
        if (!fresh) {
          window.location.reload(); // the session ended: show the login page
          return;
        }
        if (!paused()) {
          document.getElementById("ops-live").replaceWith(fresh);
          control.dataset.refreshes = String(Number(control.dataset.refreshes || 0) + 1);
        }
      })
      .catch(function () {
        // The figures stay as they were; the next refresh tries again.
      })
      .then(schedule);
  }

  button.addEventListener("click", function () {
    try {
      window.localStorage.setItem(KEY, paused() ? "0" : "1");
    } catch (error) {
      // No storage (a private window): the button does nothing lasting.
    }
    show();
    schedule();
  });

  show();
  schedule();
})();
