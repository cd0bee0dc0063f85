// The Checkpoint tab and the Resumable jobs page: plain JavaScript, no build step, no network but
// this Airflow's own /resumable/api/v1 and /api/v2 (same origin: the UI's session cookie
// authenticates). Every figure shown (percent, rate, ETA) is the server's (core/attempt/reporter.py).
//
// Airflow shows these pages in a sandboxed iframe that may run scripts as the UI's own origin but
// may not navigate the page around it: links into the UI navigate the host page's router through
// its history (see navigate()), and the look (light or dark theme, time zone) follows the host's.
(function () {
  "use strict";
  var API = "../api/v1/";
  var REFRESH_MS = 2000;          // the tab's refresh while the slot or its task instance is live
  var WATCH_MS = 3000;            // once the slot ended: a look at the task instance (a new try, a Clear)
  var LIST_REFRESH_MS = 5000;
  // A task instance in one of these states is about to (re)run the slot or is running it: refresh fast.
  var TI_ACTIVE = ["queued", "running", "deferred", "restarting"];
  var ACTIONS = ["pause", "resume", "cancel", "restart", "release"];
  var LABEL = {pause: "Pause", resume: "Resume", cancel: "Cancel", restart: "Restart", release: "Release",
    retry_skipped: "Retry skipped items", withdraw_retry: "Withdraw the retry"};
  // The confirmation asks this, then says what the request will do to this slot now (the button's tooltip).
  var QUESTION = {pause: "Pause this slot?", resume: "Resume this slot?", cancel: "Cancel this slot's run?",
    restart: "Restart this slot?", release: "Release this slot's lease?", retry_skipped: "Retry its skipped items?",
    withdraw_retry: "Withdraw the retry of its skipped items?"};
  var params = new URLSearchParams(location.search);
  var root = document.getElementById("root");

  function el(tag, attrs, children) {
    var node = document.createElement(tag);
    Object.keys(attrs || {}).forEach(function (k) {
      if (attrs[k] == null) return;
      if (k === "text") node.textContent = attrs[k]; else node.setAttribute(k, attrs[k]);
    });
    (children || []).forEach(function (c) { if (c != null) node.appendChild(typeof c === "string" ? document.createTextNode(c) : c); });
    return node;
  }
  function num(n) { return n == null ? "?" : Number(n).toLocaleString("en-US"); }
  function duration(s) {
    s = Math.round(s); var h = Math.floor(s / 3600), m = Math.floor((s % 3600) / 60), r = s % 60;
    return h ? h + "h" + String(m).padStart(2, "0") + "m" : m ? m + "m" + String(r).padStart(2, "0") + "s" : r + "s";
  }
  function rate(r) { return r >= 100 ? num(Math.round(r)) : Number(r.toPrecision(2)).toLocaleString("en-US"); }
  // "1,200/s · ETA 3m05s": the server's figures (core/attempt/reporter.py), for a slot or a whole job.
  function pace(row) {
    return [row.rate != null ? rate(row.rate) + "/s" : null, row.eta_seconds != null ? "ETA " + duration(row.eta_seconds) : null,
      row.stalled_since ? "stalled since " + clock(new Date(row.stalled_since)) : null].filter(Boolean).join(" · ");
  }
  // A mapped partition's job without its [map_index], or a range rebalancing took (<job>[i].n)
  // without its [i].n: the whole job's name.
  function wholeJob(job) { return String(job || "").replace(/\[\d+\](\.\d+)?$/, ""); }

  // -- the host: the Airflow UI page around the frame ---------------------------------------------
  function host() {
    try { if (window.top !== window && window.top.document && window.top.history) return window.top; } catch (e) { /* another origin */ }
    return null;
  }
  // The Airflow UI's base path (everything before /resumable/), for links into the UI.
  function uiBase() { var p = location.pathname, i = p.indexOf("/resumable/"); return i > 0 ? p.slice(0, i) : ""; }
  // Opens an Airflow UI address in the page around the frame, as its own links do: a history entry
  // and a popstate for its router (no reload). Where the host cannot be reached (another origin),
  // the link's own target=_top is left to the browser.
  function navigate(url) {
    var top = host();
    if (!top) { window.open(url, "_top"); return; }
    try {
      var state = top.history.state || {};
      var idx = typeof state.idx === "number" ? state.idx + 1 : 1;
      top.history.pushState({usr: null, key: Math.random().toString(36).slice(2, 10), idx: idx}, "", url);
      top.dispatchEvent(new top.PopStateEvent("popstate", {state: top.history.state}));
    } catch (e) {
      var a = top.document.createElement("a");  // a link of the host's document may navigate it
      a.href = url; top.document.body.appendChild(a); a.click(); a.remove();
    }
  }
  function link(url, text, attrs) {
    var a = el("a", Object.assign({href: url, target: "_top", text: text}, attrs || {}));
    a.addEventListener("click", function (e) {
      if (e.button !== 0 || e.metaKey || e.ctrlKey || e.shiftKey || e.altKey || !host()) return;
      e.preventDefault(); navigate(url);
    });
    return a;
  }
  function tiPath(dagId, runId, taskId, mapIndex) {
    return uiBase() + "/dags/" + encodeURIComponent(dagId) + "/runs/" + encodeURIComponent(runId) + "/tasks/" +
      encodeURIComponent(taskId) + (mapIndex != null && Number(mapIndex) >= 0 ? "/mapped/" + mapIndex : "");
  }
  function tabPath(row) {
    if (!row.dag_id || !row.run_id || !row.task_id) return null;
    return tiPath(row.dag_id, row.run_id, row.task_id, row.map_index) + "/plugin/checkpoint";
  }

  // The Airflow UI's theme: html.dark on the host page (its colour-mode switch), followed live.
  function followTheme() {
    var html = document.documentElement, top = host(), media = window.matchMedia("(prefers-color-scheme: dark)");
    function apply() {
      var dark = media.matches;
      if (top) {
        var theirs = top.document.documentElement;
        dark = theirs.classList.contains("dark") || theirs.style.colorScheme === "dark" ||
          (!theirs.classList.contains("light") && media.matches);
        var style = top.getComputedStyle(top.document.body);
        if (style.fontFamily) html.style.setProperty("--font", style.fontFamily);
      }
      html.classList.toggle("dark", dark); html.classList.toggle("light", !dark);
      html.style.colorScheme = dark ? "dark" : "light";
      // The host's own colours where the frame sits (its panel's background, its text colour).
      html.style.removeProperty("--bg"); html.style.removeProperty("--fg");
      if (top && window.frameElement) {
        for (var node = window.frameElement.parentElement; node && node.nodeType === 1; node = node.parentElement) {
          var bg = top.getComputedStyle(node).backgroundColor;
          if (bg && bg !== "transparent" && !/rgba\(.*,\s*0\)$/.test(bg)) {
            html.style.setProperty("--bg", bg);
            html.style.setProperty("--fg", top.getComputedStyle(node).color);
            break;
          }
        }
      }
    }
    apply();
    if (top) new MutationObserver(apply).observe(top.document.documentElement, {attributes: true, attributeFilter: ["class", "style"]});
    media.addEventListener("change", apply);
  }

  // Times as the Airflow UI shows them: YYYY-MM-DD HH:mm:ss (24 h), in the time zone chosen in its
  // user menu (its "timezone" setting in this origin's storage), else the browser's.
  function zone() {
    try {
      var chosen = JSON.parse(localStorage.getItem("timezone") || "null");
      if (chosen) { new Intl.DateTimeFormat("en-US", {timeZone: chosen}); return chosen; }
    } catch (e) { /* no storage, or not a zone */ }
    return Intl.DateTimeFormat().resolvedOptions().timeZone || "UTC";
  }
  function clock(date) {
    var parts = {};
    new Intl.DateTimeFormat("en-US", {timeZone: zone(), year: "numeric", month: "2-digit", day: "2-digit", hour: "2-digit",
      minute: "2-digit", second: "2-digit", hourCycle: "h23"}).formatToParts(date).forEach(function (p) { parts[p.type] = p.value; });
    return parts.year + "-" + parts.month + "-" + parts.day + " " + parts.hour + ":" + parts.minute + ":" + parts.second;
  }
  function when(iso) {
    if (!iso) return "";
    return el("time", {datetime: iso, title: iso + " (shown in " + zone() + ")", text: clock(new Date(iso))});
  }
  function cell(v, attrs) {
    return el("td", attrs || {}, [v == null ? "" : typeof v === "object" ? v : String(v)]);
  }

  // A position as a person reads it: numbers grouped, a composite key joined, an object as key=value.
  function readable(v) {
    if (v == null) return "— (the beginning)";
    if (typeof v === "number") return num(v);
    if (typeof v === "string") return v;
    if (Array.isArray(v)) return v.map(function (x) { return typeof x === "object" && x !== null ? JSON.stringify(x) : readable(x); }).join(" · ");
    if (v.truncated || v.xcom_truncated) return "(" + num(v.bytes) + " bytes of JSON) " + v.preview;
    var text = Object.keys(v).map(function (k) {
      var x = v[k]; return k + "=" + (typeof x === "object" && x !== null ? JSON.stringify(x) : readable(x));
    }).join(", ");
    return text.length > 300 ? text.slice(0, 300) + "…" : text;
  }
  // A lease holder (ti-id/tryN@host:pid) as host:pid; the whole id in the tooltip.
  function holder(owner) {
    if (!owner) return "";
    var at = owner.lastIndexOf("@");
    return el("span", {title: owner, text: at >= 0 ? owner.slice(at + 1) : owner});
  }
  // How a slot is shown: the server's one rule (core/view.py liveness_of): its status, or for a
  // running row whose holder is stuck or gone, "stalled" or "abandoned".
  function shown(row) { return row.shown_status || row.status; }
  // Since when, and why, a slot is stalled or abandoned (the badge's tooltip and the tab's note).
  function shownWhy(row) {
    if (shown(row) === row.status || !row.shown_why) return "";
    return shown(row) + (row.shown_since ? " since " + clock(new Date(row.shown_since)) : "") + ": " + row.shown_why +
      " (its row still says " + row.status + ")";
  }
  function bar(row, cls) {
    var pct = row.percent == null ? (row.status === "done" ? 100 : 0) : row.percent;
    var outer = el("div", {"class": "bar " + shown(row) + (cls ? " " + cls : ""), role: "progressbar",
      "aria-valuemin": "0", "aria-valuemax": "100", "aria-valuenow": String(pct)});
    var inner = el("div"); inner.style.width = pct + "%"; outer.appendChild(inner);
    return outer;
  }
  function request(method, url, body) {
    var init = {method: method, credentials: "same-origin", headers: {"Accept": "application/json"}};
    if (body !== undefined) { init.headers["Content-Type"] = "application/json"; init.body = JSON.stringify(body); }
    return fetch(url, init).then(function (r) {
      return r.json().catch(function () { return {message: r.statusText}; }).then(function (data) {
        if (!r.ok) {
          var msg = data.message || data.detail || r.statusText;
          if (typeof msg !== "string") msg = JSON.stringify(msg);
          if (r.status === 401) msg = "Not logged in to Airflow (401): log in and reload.";
          var err = new Error(msg); err.status = r.status; throw err;
        }
        return data;
      });
    });
  }
  function stopReason(row) { return row.stop_reason !== undefined ? row.stop_reason : row.cancel_reason; }
  // A pending request, only while it has not taken effect: a pause asked of a running slot, a
  // resume of a paused one, a restart until the next attempt starts over.
  function pendingRequest(row) {
    var r = row.request;
    if (r === "pause" && row.status === "running") return r;
    if (r === "resume" && row.status === "paused") return r;
    if (r === "restart" && (row.status !== "running" || shown(row) === "abandoned")) return r;
    if (row.cancel_request === "handover" && row.status === "running") return "handover";
    if (row.cancel_request && row.status === "running") return "cancel";
    return null;
  }

  // The keys a range of a partitioned job's plan holds: after one key (else from the first) up to
  // another, inclusive (else to the last).
  function rangeKeys(r) {
    return "keys " + (r.after == null ? "from the first" : "after " + readable(r.after)) +
      (r.until == null ? " to the last" : " up to " + readable(r.until));
  }
  // A slot's range: one a split took (where from, who asked, when), or a partition's own with the
  // ranges taken from it.
  function rangeText(r) {
    var head = r.range + " of the job's plan: " + rangeKeys(r);
    if (r.from) return [head + ", taken from " + r.from + (r.by ? " by " + r.by : "") + (r.when ? " at " : ""),
      r.when ? when(r.when) : null];
    var taken = r.taken || [];
    return [head + (taken.length ? "; ranges taken from it: " + taken.join(", ") : "")];
  }

  // -- the Checkpoint tab ------------------------------------------------------------------------
  function checkpointPage() {
    var dagId = params.get("dag_id") || "", runId = params.get("run_id") || "", taskId = params.get("task_id") || "";
    var mapIndex = params.get("map_index");
    if (mapIndex == null || mapIndex === "" || mapIndex === "{MAP_INDEX}") mapIndex = "-1";
    var query = new URLSearchParams({dag_id: dagId, run_id: runId, task_id: taskId, map_index: mapIndex});
    if (params.get("conn_id")) query.set("conn_id", params.get("conn_id"));
    // One of the slots the task instance ran (a partition that took ranges by rebalancing ran several):
    // its ?job=, else the one it ran last.
    if (params.get("job")) query.set("job", params.get("job"));
    // Airflow's own record of the task instance: its try and state (a new try, a Clear, a deferral).
    var tiUrl = uiBase() + "/api/v2/dags/" + encodeURIComponent(dagId) + "/dagRuns/" + encodeURIComponent(runId) +
      "/taskInstances/" + encodeURIComponent(taskId) + (Number(mapIndex) >= 0 ? "/" + mapIndex : "");
    var timer = null, current = null, note = null, ti = null, watched = null, busy = false, failure = null;
    // The answer to the person's last click, shown for a few seconds: what lasts is read off the row
    // (a pending request, a retry waiting for the next run), so no note outlives what it says.
    var message = {text: "", error: false}, messageTimer = null;
    // The UI's iframe is sandboxed without allow-modals (window.confirm returns false at once), so
    // the confirmation is in the page: a click asks, a second click on "Confirm" sends.
    var asking = null;
    // The answer to this page's last "Retry skipped items": which run carries it out (see act()).
    var retryAnswer = null;

    function schedule(fn, ms) { clearTimeout(timer); timer = setTimeout(fn, ms); }
    function tiKey(t) { return t ? t.try_number + "/" + t.state : ""; }
    function fetchTi() {
      return request("GET", tiUrl).then(function (t) { ti = t; return t; }, function () { return ti; });
    }
    function live() {
      return (current && !current.ended) || (ti && TI_ACTIVE.indexOf(ti.state) >= 0);
    }
    function load() {
      Promise.all([request("GET", API + "task-instance?" + query), fetchTi()]).then(function (res) {
        failure = null;
        if (res[0].resumable) { current = res[0]; note = null; } else { current = null; note = res[0]; }
        watched = tiKey(ti);
        render();
        if (live()) schedule(load, REFRESH_MS); else schedule(watch, WATCH_MS);
      }).catch(function (err) {
        failure = err.message; render();
        if (err.status !== 401 && err.status !== 403) schedule(load, 5000);
      });
    }
    // The slot ended: look at the task instance only, and refresh everything when it moves on.
    function watch() {
      fetchTi().then(function (t) {
        if (tiKey(t) !== watched) { load(); return; }
        var refreshed = document.getElementById("refreshed");
        if (refreshed) refreshed.setAttribute("data-at", String(Date.now()));
        schedule(watch, WATCH_MS);
      });
    }
    function say(text, error) {
      message = {text: text, error: !!error};
      clearTimeout(messageTimer);
      if (text) messageTimer = setTimeout(function () { message = {text: "", error: false}; render(); }, error ? 15000 : 6000);
    }
    function ask(action) { asking = action; say(""); render(); }
    function act(action) {
      asking = null;
      if (!current || busy) return;
      busy = true;
      var q = new URLSearchParams({job: current.job, slot: current.slot});
      if (params.get("conn_id")) q.set("conn_id", params.get("conn_id"));
      request("POST", API + "checkpoint/" + action + "?" + q, {}).then(function (answer) {
        // A retry of skipped items says which run carries it out, or why none will until its task
        // instance is cleared: kept beside the pending retry's note for as long as the retry waits.
        var retry = answer && answer.retry;
        if (retry) {
          retryAnswer = {job: current.job, slot: current.slot, next_run: String(retry.next_run || ""),
            waiting: !retry.cleared && /not carried out/.test(String(retry.next_run || ""))};
          say(LABEL[action] + " requested: " + retryAnswer.next_run, retryAnswer.waiting);
        } else if (answer && answer.withdrawn) {
          say(LABEL[action] + ": " + num(answer.withdrawn.items) + " item(s) skipped again.");
        } else {
          say(LABEL[action] + ": sent.");
        }
      }).catch(function (err) {
        // 409/403/404: the slot (or Airflow) refused it; 500 and above: it failed on the way, and
        // the message says whether it was applied anyway (a ReadBackFailed: applied and recorded).
        say(LABEL[action] + (err.status >= 500 ? " failed: " : " refused: ") + err.message, true);
      }).then(function () { busy = false; load(); });
    }
    function tiLine() {
      if (!ti) return null;
      return el("span", {id: "ti-state", "class": "ti-state", "data-try": String(ti.try_number), "data-state": String(ti.state),
        text: "task instance: try " + ti.try_number + " · " + (ti.state || "no state")});
    }
    function renderNote() {
      var parts = [el("h2", {}, ["Checkpoint", tiLine()])];
      if (note && note.overlap) {
        var o = note.overlap, y = o.yielded_to || {};
        var other = y.run_id ? link(tiPath(dagId, y.run_id, taskId, mapIndex) + "/plugin/checkpoint", y.run_id,
          {id: "yielded-to"}) : null;
        parts.push(el("div", {id: "overlap", "class": "note"}, [
          el("strong", {text: "Skipped by the overlap policy (" + o.policy + "). "}),
          o.message ? o.message + " " : "",
          other ? el("span", {}, ["It yielded to run ", other, y.slot ? " (slot " + y.slot + (y.started_at ? ", started " : "") : "",
            y.started_at ? when(y.started_at) : "", y.slot ? ")" : "", "."]) : null
        ]));
      } else if (note && note.never_started) {
        // A try the executor failed while still queued: it never started (no Execution API, usually)
        parts.push(el("p", {id: "never-started", "class": "error", text: note.never_started.message}));
      } else {
        var waiting = ti && TI_ACTIVE.concat(["scheduled", "up_for_retry", "up_for_reschedule"]).indexOf(ti.state) >= 0;
        parts.push(el("p", {id: "not-resumable", "class": "muted",
          text: waiting ? "No checkpoint yet: the task instance is " + ti.state + "; this tab shows its progress once it starts."
            : (note && note.message) || "No checkpoint."}));
      }
      parts.push(refreshedLine());
      root.replaceChildren.apply(root, parts);
    }
    function refreshedLine() {
      var text = live() ? "Refreshing every " + REFRESH_MS / 1000 + " s — " + clock(new Date())
        : "Ended — watching the task instance for a new try or a Clear (every " + WATCH_MS / 1000 + " s).";
      return el("p", {id: "refreshed", "class": "muted", "data-at": String(Date.now()), "data-live": String(!!live()), text: text});
    }
    // A request's button: enabled where the rules table offers it now; its tooltip says what it
    // would do to this slot now, or why it cannot (the server's words, core/model/request_rules.py). A disabled
    // button gets no pointer events, so its wrapper carries the tooltip too.
    function actionButton(row, a) {
      var offered = !!(row.offers && row.offers[a]);
      var why = (row.offer_notes && row.offer_notes[a]) || (offered ? "" : "Not offered now.");
      var b = el("button", {type: "button", id: "action-" + a, text: LABEL[a], title: why, "aria-description": why});
      b.disabled = !offered;
      b.addEventListener("click", function () { ask(a); });
      return el("span", {"class": "action", title: why}, [b]);
    }
    // Skipped items: the counts are of every item in each state (the table may list the first 100).
    function skippedSection(row) {
      if (!row.skipped_items || !row.skipped_items.length) return [];
      var table = el("table", {id: "skipped"}, [el("tr", {}, ["position", "error", "try", "skipped", "state"].map(function (h) { return el("th", {text: h}); }))]);
      row.skipped_items.forEach(function (s) {
        table.appendChild(el("tr", {"data-state": s.state}, [cell(readable(s.position), {"class": "code", title: JSON.stringify(s.position)}),
          cell(s.error), cell(s.attempt), cell(when(s.skipped_at), {"class": "nowrap"}), cell(String(s.state || "").replace("_", " "))]));
      });
      var counts = row.skipped_counts || {};
      var listed = ["skipped", "retry_requested", "replayed"].filter(function (k) { return counts[k]; });
      var all = listed.reduce(function (n, k) { return n + counts[k]; }, 0);
      var heading = el("h2", {id: "skipped-title"}, ["Skipped items ", el("span", {"class": "muted", id: "skipped-counts",
        text: listed.map(function (k) { return num(counts[k]) + " " + k.replace("_", " "); }).join(" · ") +
          (all > row.skipped_items.length ? " (the first " + num(row.skipped_items.length) + " listed)" : "")})]);
      if (!counts.retry_requested || (retryAnswer && (retryAnswer.job !== row.job || retryAnswer.slot !== row.slot))) {
        retryAnswer = null;  // the retry ran (or the tab shows another slot): its answer said all it had to
      }
      var nextRun = retryAnswer ? el("span", {id: "retry-next-run", "class": retryAnswer.waiting ? "error" : "",
        text: " Which run: " + retryAnswer.next_run + "."}) : null;
      var pending = counts.retry_requested ? el("div", {id: "retry-pending", "class": "note"}, [
        "Retry of " + num(counts.retry_requested) + " skipped item(s) requested" +
          (row.retry_requested_by ? " by " + row.retry_requested_by : "") +
          ": the task's next run replays them before its other work.", nextRun, " ",
        actionButton(row, "withdraw_retry")]) : null;
      return [heading, pending, table, actionButton(row, "retry_skipped")];
    }
    function render() {
      if (failure && !current && !note) { root.replaceChildren(el("p", {"class": "error", id: "error", text: failure})); return; }
      if (!current) { renderNote(); return; }
      var row = current;
      var figures = [num(row.processed) + (row.total != null ? " / " + num(row.total) : "") + " items"];
      if (row.percent != null) figures.push(row.percent.toFixed(1) + "%");
      if (row.rate != null) figures.push(rate(row.rate) + "/s");
      if (row.eta_seconds != null) figures.push("ETA " + duration(row.eta_seconds));
      else if (row.stalled_since) figures.push("stalled since " + clock(new Date(row.stalled_since)) + " (past its ETA, no checkpoint)");
      else if (shown(row) === "running" && row.rate == null) figures.push("measuring the rate…");
      var lease = row.lease_owner ? [holder(row.lease_owner), " — heartbeat " + row.heartbeat_age_seconds + " s ago" +
        (row.lease === "stale" ? " (STALE: the holder missed two heartbeats)" : row.lease === "expired" ? " (expired)" : "")] : ["none"];
      var why = stopReason(row);
      var reason = why && why !== row.status ? " (" + why + ")" : "";
      var pending = pendingRequest(row);
      var buttons = el("div", {id: "actions"}, ACTIONS.map(function (a) { return actionButton(row, a); }));
      var confirmBox = null;
      if (asking) {
        var action = asking;
        var yes = el("button", {type: "button", id: "confirm", text: "Confirm: " + LABEL[action].toLowerCase()});
        var no = el("button", {type: "button", id: "dismiss", text: "Never mind"});
        yes.addEventListener("click", function () { act(action); });
        no.addEventListener("click", function () { asking = null; render(); });
        confirmBox = el("div", {id: "confirmation", role: "alertdialog", "class": "confirm"}, [el("span", {text: QUESTION[action] + " " +
          ((row.offer_notes && row.offer_notes[action]) || "") + " "}), yes, no]);
      }
      // The task instance moved on (a new try queued or running) while the slot shows the last one.
      var next = null;
      if (ti && ti.try_number > row.attempt && shown(row) !== "running") {
        next = el("div", {id: "next-try", "class": "note", text: "Try " + ti.try_number + " is " + ti.state +
          ": it resumes from this checkpoint when it starts."});
      }
      var hist = el("table", {id: "history"}, [el("tr", {}, ["try", "outcome", "by", "started", "ended", "processed", "reason / error"].map(function (h) { return el("th", {text: h}); }))]);
      (row.history || []).slice().reverse().forEach(function (h) {
        hist.appendChild(el("tr", {}, [cell(h.attempt), cell(h.outcome), cell(h.requested_by ? h.requested_by : holder(h.owner), {"class": "nowrap"}),
          cell(when(h.started_at), {"class": "nowrap"}), cell(when(h.ended_at), {"class": "nowrap"}),
          cell(num(h.processed_start) + " → " + (h.processed_end == null ? "…" : num(h.processed_end)), {"class": "nowrap"}),
          cell([h.stop_reason !== undefined ? h.stop_reason : h.cancel_reason, h.error].filter(Boolean).join(": "))]));
      });
      root.replaceChildren.apply(root, [
        el("h2", {}, ["Checkpoint ", el("span", {"class": "badge " + shown(row), id: "status", "data-status": row.status,
          title: shownWhy(row) || null, text: shown(row) + reason}),
          pending ? el("span", {"class": "pending", id: "pending", text: pending === "handover"
            ? "handover to the task's newer try requested (Airflow runs that try; this one stops at its next chunk boundary)"
            : pending + " requested by " + (row.requested_by || "?")}) : null,
          tiLine()]),
        bar(row),
        el("div", {id: "figures", "class": "progress", "data-processed": String(row.processed),
          "data-eta": row.eta_seconds == null ? "" : String(row.eta_seconds), text: figures.join(" · ")}),
        next,
        shownWhy(row) ? el("div", {id: "liveness", "class": "note " + shown(row), text: shownWhy(row) + "."}) : null,
        el("dl", {}, [
          el("dt", {text: "job"}), el("dd", {}, [row.job, row.map_index != null && row.map_index >= 0 ? el("span", {}, [
            row.range && row.range.from ? " — a range of " : " — a partition of ",
            // In this frame: the jobs page of the whole job, its partitions listed, each linking back to its tab.
            el("a", {id: "whole-job", href: "jobs?" + new URLSearchParams(Object.assign({job: wholeJob(row.job)},
              row.run_id ? {run_id: row.run_id} : {}, params.get("conn_id") ? {conn_id: params.get("conn_id")} : {})),
              text: wholeJob(row.job) + " (the whole job)"})]) : null]),
          el("dt", {text: "slot"}), el("dd", {text: row.slot}),
          // The task instance ran several slots: each a link that shows it in this tab.
          row.ran ? el("dt", {text: "its task instance ran"}) : null,
          row.ran ? el("dd", {id: "ran"}, row.ran.reduce(function (a, r, i) {
            var item = r.job === row.job ? el("strong", {"data-job": r.job, text: r.job + " (shown)"})
              : el("a", {"data-job": r.job, href: "?" + new URLSearchParams(Object.assign(
                Object.fromEntries(params.entries()), {job: r.job})), text: r.job + " (" + r.status + ")"});
            return a.concat(i ? [", ", item] : [item]);
          }, [])) : null,
          // Where rebalancing put this slot: the range of the plan it reads now (the server's range_view).
          row.range ? el("dt", {text: "range"}) : null,
          row.range ? el("dd", {id: "range", "data-range": row.range.range}, rangeText(row.range)) : null,
          el("dt", {text: "position"}), el("dd", {id: "position", "class": "code", title: JSON.stringify(row.position), text: readable(row.position)}),
          // The reader whose positions these are: an attempt with another one refuses before reading.
          row.reader ? el("dt", {text: "of reader"}) : null,
          row.reader ? el("dd", {id: "reader", "class": "code", title: JSON.stringify(row.reader), text: readable(row.reader)}) : null,
          el("dt", {text: "lease"}), el("dd", {id: "lease", "class": row.lease === "stale" ? "stale" : ""}, lease),
          el("dt", {text: "attempt"}), el("dd", {text: "try " + row.attempt + ", " + row.attempts + " attempt(s) this run"}),
          el("dt", {text: "updated"}), el("dd", {}, [when(row.updated_at)]),
          row.last_error ? el("dt", {text: row.status === "running" ? "an earlier try's error" : "last error"}) : null,
          row.last_error ? el("dd", {id: "last-error", text: row.last_error}) : null
        ]),
        buttons,
        confirmBox,
        el("div", {id: "message", "class": message.error ? "error" : "", text: message.text}),
        refreshedLine()
      ].concat(skippedSection(row), [el("h2", {text: "History"}), hist]).filter(Boolean));
    }
    load();
  }

  followTheme();
  // What the jobs page (jobs.js, loaded after this file) shares with the tab.
  window.ResumableUI = {el: el, num: num, host: host, request: request, API: API, params: params, uiBase: uiBase,
    link: link, tabPath: tabPath, bar: bar, pace: pace, shown: shown, shownWhy: shownWhy, cell: cell, when: when, clock: clock, zone: zone,
    rangeKeys: rangeKeys, LIST_REFRESH_MS: LIST_REFRESH_MS};
  if (root.dataset.page === "checkpoint") checkpointPage();
})();
