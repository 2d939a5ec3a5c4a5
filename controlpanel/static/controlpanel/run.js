/* The run detail page (templates/admin/engine/run/detail.html), with htmx 2.
 *
 * 1. Live output (.cp-tail, replaced by htmx every few seconds while its attempt runs; the server
 *    answers 204, and nothing is replaced, while the log is unchanged): a box opens at the end of
 *    the output; after a refresh it stays at the end when the person was reading the end, and
 *    keeps their place when they had scrolled up.
 * 2. The page follows its run (htmx polls the state endpoint; a 200 carries HX-Refresh): with
 *    nothing typed into an action form the page reloads; while a person has typed (or has the
 *    focus in a form) it stays as it is and a notice at the top says what the run became, with a
 *    Reload button. An output box that sees its attempt end (HX-Trigger: cp-attempt-ended) makes
 *    the page look at the state at once (its hx-trigger; here only when the page does not poll).
 */

/* True while the person is not in the middle of an action: no field of an action form has the
 * focus or holds typed text (a value other than the one the page put there, or a value kept from
 * a refused action: data-cp-kept). */
function cpIdle() {
  var active = document.activeElement;
  if (active && active.closest && active.closest("form.cp-action")) {
    return false;
  }
  var fields = document.querySelectorAll("form.cp-action textarea, form.cp-action input");
  for (var i = 0; i < fields.length; i++) {
    var field = fields[i];
    if (field.type === "hidden" || field.type === "submit") {
      continue;
    }
    if (field.type === "radio" || field.type === "checkbox") {
      if (field.checked !== field.defaultChecked) {
        return false;
      }
    } else if (field.value !== field.defaultValue || (field.hasAttribute("data-cp-kept") && field.value.trim())) {
      return false;
    }
  }
  return true;
}

(function () {
  "use strict";

  var places = {};  // output box id -> {atEnd, top}, taken just before htmx replaces it

  function scroller(tail) {
    return tail.querySelector(".cp-tail-scroll");
  }

  function atEnd(box) {
    return box.scrollHeight - box.clientHeight - box.scrollTop <= 4;
  }

  function place(tail) {
    var box = scroller(tail);
    if (!box) {
      return;
    }
    var was = places[tail.id];
    delete places[tail.id];
    box.scrollTop = (!was || was.atEnd) ? box.scrollHeight : was.top;
  }

  function tailsIn(elt) {
    if (!elt || !elt.querySelectorAll) {
      return [];
    }
    var found = Array.prototype.slice.call(elt.querySelectorAll(".cp-tail"));
    if (elt.classList && elt.classList.contains("cp-tail")) {
      found.unshift(elt);
    }
    return found;
  }

  document.addEventListener("htmx:beforeSwap", function (evt) {
    var target = evt.detail.target;
    if (target && target.classList && target.classList.contains("cp-tail") && target.id) {
      var box = scroller(target);
      if (box) {
        places[target.id] = {atEnd: atEnd(box), top: box.scrollTop};
      }
    }
  });

  // fired on each element htmx put in (the new box for an outerHTML swap, the container for innerHTML)
  document.addEventListener("htmx:afterSwap", function (evt) {
    tailsIn(evt.target).forEach(place);
  });

  function notice(sentence) {
    var main = document.getElementById("content-main");
    var box = document.getElementById("cp-changed");
    if (!main) {
      return;
    }
    if (!box) {
      box = document.createElement("div");
      box.id = "cp-changed";
      box.className = "cp-changed";
      box.setAttribute("role", "alert");
      var text = document.createElement("span");
      text.className = "cp-changed-text";
      box.appendChild(text);
      var button = document.createElement("button");
      button.type = "button";
      button.className = "button default";
      button.textContent = "Reload";
      button.addEventListener("click", function () { window.location.reload(); });
      box.appendChild(button);
      main.insertBefore(box, main.firstChild);
    }
    box.querySelector(".cp-changed-text").textContent = sentence;
  }

  function changedSentence(what) {
    return "This run changed: " + what + ". Reload to see it; what you typed is kept until you reload.";
  }

  // the state poll found a change: htmx would reload (HX-Refresh); not under someone's typing
  document.addEventListener("htmx:beforeOnLoad", function (evt) {
    var elt = evt.detail.elt, xhr = evt.detail.xhr;
    if (!elt || !elt.hasAttribute || !elt.hasAttribute("data-cp-live") || !xhr) {
      return;
    }
    if (xhr.status !== 200 || xhr.getResponseHeader("HX-Refresh") !== "true" || cpIdle()) {
      return;
    }
    evt.preventDefault();
    var said = {};
    try {
      said = JSON.parse(xhr.responseText);
    } catch (e) {
      said = {};
    }
    notice(changedSentence("it is now " + (said.label || said.status || "different")));
  });

  // an output box saw its attempt end on a page that does not follow the run's state by itself
  document.addEventListener("cp-attempt-ended", function (evt) {
    if (document.querySelector("[data-cp-live]")) {
      return;  // the state poll is triggered by this event (hx-trigger)
    }
    if (cpIdle()) {
      window.location.reload();
    } else {
      var status = evt.detail && evt.detail.status;
      notice(changedSentence("an attempt ended" + (status ? " (" + status + ")" : "")));
    }
  });

  document.addEventListener("DOMContentLoaded", function () {
    tailsIn(document.body).forEach(place);
  });
})();
