/* The run detail page (templates/admin/engine/run/detail.html), with htmx 2.
 *
 * 1. Live output (.cp-tail, replaced by htmx every few seconds while its attempt runs; the server
 *    answers 204, and nothing is replaced, while the log is unchanged): a box opens at the end of
 *    the output; after a refresh it stays at the end when the person was reading the end, and
 *    keeps their place when they had scrolled up.
 * 2. The page follows its run (htmx polls the state endpoint; a 200 says it changed): the page
 *    fetches itself and replaces its parts (every element with data-cp-part, by id) without a
 *    reload, but for a part whose HTML is the same as the one the last replacement put there; the
 *    live conversation box is kept while the same attempts are open; the action forms
 *    are replaced only while nobody types: while a person has typed (or has the focus in a form)
 *    they stay as they are and a notice at the top says what the run became, with a Reload button.
 *    Open (or closed) boxes (<details> with an id) stay so across a replacement. The header is
 *    fetched on its own every few seconds; when its status differs from the one the rest of the page
 *    was built with (#content-main's data-cp-status), the rest is fetched at once.
 *    An output box that sees its attempt end (HX-Trigger: cp-attempt-ended) makes the page look at
 *    the state at once (its hx-trigger; here only when the page does not poll).
 * 3. Clocks tick every second against the server's clock (the header's data-cp-now): elapsed
 *    times (data-cp-since), the active time while a worker beats (data-cp-active), and the
 *    heartbeat's age (data-cp-heartbeat), which turns into "no heartbeat" once it is older than
 *    data-cp-stale seconds, without waiting for the next look at the server.
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
    if (!was && tail.getAttribute("data-cp-from") === "start") {
      box.scrollTop = 0;  // a finished conversation opens at its start
      return;
    }
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

  // the version the page shows: the state poll asks with it (its hx-get carries the first one)
  document.addEventListener("htmx:configRequest", function (evt) {
    var elt = evt.detail.elt;
    if (elt && elt.hasAttribute && elt.hasAttribute("data-cp-live") && elt.hasAttribute("data-cp-ended")) {
      evt.preventDefault();  // the run has ended: its state no longer changes
      return;
    }
    if (elt && elt.hasAttribute && elt.hasAttribute("data-cp-live") && elt.getAttribute("data-cp-version")) {
      evt.detail.path = evt.detail.path.replace(/([?&]v=)[^&]*/, "$1" + encodeURIComponent(elt.getAttribute("data-cp-version")));
    }
  });

  var updating = false;

  // what a person typed into the action forms: {verb: {field name: value}}
  function typedValues() {
    var typed = {};
    document.querySelectorAll("form.cp-action").forEach(function (form) {
      var verb = form.getAttribute("data-cp-action");
      form.querySelectorAll("textarea, input").forEach(function (field) {
        if (field.type === "hidden" || field.type === "submit" || !field.name) {
          return;
        }
        var changed = (field.type === "radio" || field.type === "checkbox") ? field.checked !== field.defaultChecked
          : field.value !== field.defaultValue;
        if (changed) {
          typed[verb] = typed[verb] || {};
          typed[verb][field.name + (field.type === "radio" ? "=" + field.value : "")] =
            (field.type === "radio" || field.type === "checkbox") ? field.checked : field.value;
        }
      });
    });
    return typed;
  }

  // put typed values back into the (new) forms; false when a form typed into is gone
  function restoreTyped(typed) {
    var whole = true;
    Object.keys(typed).forEach(function (verb) {
      var form = document.querySelector('form.cp-action[data-cp-action="' + verb + '"]');
      if (!form) {
        whole = false;
        return;
      }
      Object.keys(typed[verb]).forEach(function (key) {
        var name = key.split("=")[0], value = key.indexOf("=") > 0 ? key.slice(key.indexOf("=") + 1) : null;
        form.querySelectorAll('[name="' + name + '"]').forEach(function (field) {
          if (value !== null) {
            if (field.value === value) {
              field.checked = typed[verb][key];
            }
          } else if (field.type === "checkbox") {
            field.checked = typed[verb][key];
          } else {
            field.value = typed[verb][key];
            field.setAttribute("data-cp-kept", "1");  // still counts as typed (cpIdle)
          }
        });
      });
    });
    return whole;
  }

  // which folding boxes (<details> with an id) a part has open: {id: {open, lazy}}, where lazy is the
  // content a lazy box had loaded (the end of an output log, a diff)
  function foldsOf(part) {
    var folds = {};
    part.querySelectorAll("details[id]").forEach(function (box) {
      var lazy = box.querySelector(".cp-lazy");
      folds[box.id] = {open: box.open, lazy: box.open && lazy ? lazy : null};
    });
    return folds;
  }

  // a person's open (or closed) boxes stay so when the part around them is replaced: a lazy box that
  // was open keeps what it showed until its own request (its toggle) brings the fresh content
  function keepFolds(node, folds) {
    node.querySelectorAll("details[id]").forEach(function (box) {
      var was = folds[box.id];
      if (!was || was.open === box.open) {
        return;
      }
      var lazy = box.querySelector(".cp-lazy");
      if (was.lazy && lazy) {
        lazy.parentNode.replaceChild(was.lazy, lazy);
      }
      box.open = was.open;
    });
  }

  // replace the parts of the page by those of a fresh copy of it (``doc``)
  function replaceParts(doc, keepForms) {
    var fresh = doc.getElementById("content-main");
    var main = document.getElementById("content-main");
    if (!fresh || !main) {
      return false;
    }
    var freshParts = fresh.querySelectorAll("[data-cp-part]");
    var order = [];
    for (var i = 0; i < freshParts.length; i++) {
      order.push(freshParts[i].getAttribute("data-cp-part"));
    }
    var mine = main.querySelectorAll("[data-cp-part]");
    var byName = {};
    for (var j = 0; j < mine.length; j++) {
      byName[mine[j].getAttribute("data-cp-part")] = mine[j];
    }
    var previous = null;
    order.forEach(function (name, k) {
      var part = freshParts[k], old = byName[name];
      var source = part.outerHTML;
      delete byName[name];
      if (old && old.cpSource === source) {
        // the same as what the last update put there: kept as it is (a button under the pointer is
        // not swapped for its twin mid-click, a box keeps what it loaded)
        previous = old;
        return;
      }
      if (name === "actions" && keepForms && old) {
        // the forms change with the run (Approve appears): new forms, with what was typed carried over,
        // unless a form typed into is gone (then they stay as they are)
        var typed = typedValues(), focused = document.activeElement;
        var focusName = focused && focused.closest && focused.closest("form.cp-action") ?
          [focused.closest("form.cp-action").getAttribute("data-cp-action"), focused.name] : null;
        var fresh = document.importNode(part, true);
        var verbs = Array.prototype.map.call(fresh.querySelectorAll("form.cp-action"), function (f) {
          return f.getAttribute("data-cp-action");
        });
        if (Object.keys(typed).every(function (verb) { return verbs.indexOf(verb) >= 0; })) {
          old.parentNode.replaceChild(fresh, old);
          fresh.cpSource = source;
          restoreTyped(typed);
          if (focusName) {
            var again = fresh.querySelector('form.cp-action[data-cp-action="' + focusName[0] + '"] [name="' +
                                            focusName[1] + '"]');
            if (again) {
              again.focus();
            }
          }
          if (window.htmx) {
            window.htmx.process(fresh);
          }
          previous = fresh;
        } else {
          previous = old;
        }
        return;
      }
      if (name === "live" && old && old.getAttribute("data-cp-open") === part.getAttribute("data-cp-open")) {
        previous = old;  // the same attempts are open: keep the box, its place and its polling
        return;
      }
      var node = document.importNode(part, true);
      node.cpSource = source;
      var folds = old ? foldsOf(old) : {};
      if (old) {
        old.parentNode.replaceChild(node, old);
      } else if (previous && previous.parentNode) {
        previous.parentNode.insertBefore(node, previous.nextSibling);
      } else {
        main.appendChild(node);
      }
      keepFolds(node, folds);
      if (window.htmx) {
        window.htmx.process(node);
      }
      previous = node;
    });
    Object.keys(byName).forEach(function (name) {  // parts the run no longer has (a stop card after a Recover)
      if (name !== "actions" || !keepForms) {
        byName[name].parentNode.removeChild(byName[name]);
      }
    });
    main.setAttribute("data-cp-status", fresh.getAttribute("data-cp-status") || "");
    var version = fresh.getAttribute("hx-get") || "";
    var found = /[?&]v=([^&]*)/.exec(version);
    if (found) {
      main.setAttribute("data-cp-version", decodeURIComponent(found[1]));
    }
    if (!fresh.hasAttribute("data-cp-live")) {
      main.setAttribute("data-cp-ended", "1");  // an ended run: no more looks at its state
    }
    document.title = doc.title || document.title;
    tick();
    toLogEnds(main);
    return true;
  }

  // fetch the page and replace its parts; false when a fetch is already under way
  function update(said, quiet) {
    if (updating) {
      return false;
    }
    updating = true;
    var typing = !cpIdle();
    fetch(window.location.pathname + window.location.search, {credentials: "same-origin", headers: {"X-CP-Part": "1"}})
      .then(function (response) {
        if (!response.ok) {
          throw new Error("HTTP " + response.status);
        }
        return response.text();
      })
      .then(function (text) {
        var doc = new DOMParser().parseFromString(text, "text/html");
        if (!replaceParts(doc, typing)) {
          window.location.reload();
          return;
        }
        if (typing && !quiet) {
          notice(changedSentence("it is now " + (said.label || said.status || "different")));
        }
      })
      .catch(function () {
        if (!typing && !quiet) {
          window.location.reload();
        }
      })
      .then(function () {
        updating = false;
        followHeader();
      });
    return true;
  }

  var follows = 0;  // fetches made because the header moved on, since the last time they agreed

  // the header is fetched on its own (every few seconds, for the heartbeat): when it says the run is
  // in another state than the rest of the page shows, the rest follows at once, so that the buttons,
  // the stop card and the tables never disagree with the status above them for longer than one fetch
  function followHeader() {
    var main = document.getElementById("content-main");
    var header = document.getElementById("run-header");
    if (!main || !header || !main.hasAttribute("data-cp-live") || main.hasAttribute("data-cp-ended")) {
      return;
    }
    var status = header.getAttribute("data-cp-status");
    if (status === main.getAttribute("data-cp-status")) {
      follows = 0;
      return;
    }
    // counted only when a fetch starts (one under way calls this again when it ends)
    if (follows < 5 && update({status: status, label: (header.querySelector(".cp-status") || {}).textContent})) {
      follows += 1;
    }
  }

  // the state poll found a change: replace the page's parts (htmx would reload: HX-Refresh)
  document.addEventListener("htmx:beforeOnLoad", function (evt) {
    var elt = evt.detail.elt, xhr = evt.detail.xhr;
    if (!elt || !elt.hasAttribute || !elt.hasAttribute("data-cp-live") || !xhr) {
      return;
    }
    if (xhr.status !== 200 || xhr.getResponseHeader("HX-Refresh") !== "true") {
      return;
    }
    evt.preventDefault();
    if (elt.hasAttribute("data-cp-ended")) {
      return;
    }
    var said = {};
    try {
      said = JSON.parse(xhr.responseText);
    } catch (e) {
      said = {};
    }
    update(said);
  });

  // ------------------------------------------------------------------ clocks

  function spoken(seconds) {
    seconds = Math.max(0, seconds);
    if (seconds < 60) {
      return seconds.toFixed(seconds < 10 ? 1 : 0) + " s";
    }
    var minutes = Math.floor(seconds / 60), rest = Math.floor(seconds % 60);
    if (minutes < 60) {
      return minutes + " min " + rest + " s";
    }
    return Math.floor(minutes / 60) + " h " + (minutes % 60) + " min";
  }

  var offset = 0;  // server clock minus this browser's, from the header's last answer
  var offsetOf = null;

  function serverNow() {
    var header = document.getElementById("run-header");
    if (header && header.getAttribute("data-cp-now") && header !== offsetOf) {
      offset = parseFloat(header.getAttribute("data-cp-now")) - Date.now() / 1000;
      offsetOf = header;
    }
    return Date.now() / 1000 + offset;
  }

  function tick() {
    var now = serverNow();
    var header = document.getElementById("run-header");
    var stale = false;
    document.querySelectorAll("[data-cp-heartbeat]").forEach(function (elt) {
      var age = now - parseFloat(elt.getAttribute("data-cp-heartbeat"));
      var limit = parseFloat(elt.getAttribute("data-cp-stale") || "60");
      var owner = elt.getAttribute("data-cp-owner") || "?";
      if (age > limit) {
        stale = true;
        elt.classList.add("cp-stale");
        elt.textContent = "no heartbeat for " + spoken(age) + " from " + owner + ": its worker may be gone; " +
          "reconciliation (every " + (elt.getAttribute("data-cp-period") || "?") + " s) interrupts the run";
      } else {
        elt.classList.remove("cp-stale");
        elt.textContent = "heartbeat " + spoken(age) + " ago from " + owner;
      }
    });
    if (header) {
      header.classList.toggle("cp-no-heartbeat", stale);
    }
    document.querySelectorAll("[data-cp-since]").forEach(function (elt) {
      elt.textContent = spoken(now - parseFloat(elt.getAttribute("data-cp-since")));
    });
    // the active time: what the workers counted up to their last heartbeat, plus the time since it while
    // the heartbeat is fresh (the step in progress); a stale heartbeat stops it where the worker left it
    document.querySelectorAll("[data-cp-active]").forEach(function (elt) {
      var base = parseFloat(elt.getAttribute("data-cp-active"));
      var beat = parseFloat(elt.getAttribute("data-cp-active-since") || "NaN");
      var limit = parseFloat(elt.getAttribute("data-cp-stale") || "60");
      var since = isNaN(beat) ? 0 : now - beat;
      elt.textContent = spoken(base + (since >= 0 && since <= limit ? since : 0));
    });
  }

  setInterval(tick, 1000);

  // while the run runs, its step times, timeline and tables are brought up to date every REFRESH_MS
  // even when no event changed its state (an attempt's elapsed time, the timeline's growing box)
  var REFRESH_MS = 10000;
  setInterval(function () {
    var main = document.getElementById("content-main");
    var header = document.getElementById("run-header");
    if (main && main.hasAttribute("data-cp-live") && !main.hasAttribute("data-cp-ended") && header &&
        header.getAttribute("data-cp-status") === "running" && !document.hidden) {
      update({}, true);
    }
  }, REFRESH_MS);

  // the end of the failing check's log is what a person needs: its box starts scrolled to the end
  function toLogEnds(root) {
    (root || document).querySelectorAll(".cp-stop-log").forEach(function (box) {
      box.scrollTop = box.scrollHeight;
    });
  }
  document.addEventListener("DOMContentLoaded", function () { toLogEnds(); });
  document.addEventListener("htmx:afterSwap", function () {
    tick();
    followHeader();
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
    tick();
  });
})();
