// The Checkpoint tab and the Resumable jobs page: plain JavaScript, no build step, no network but
// this Airflow's own /resumable/api/v1 (same origin: the UI's session cookie authenticates).
(function () {
  "use strict";
  var API = "../api/v1/";
  var REFRESH_MS = 2000;          // the tab's refresh while the slot is live (the issue asks for <= 5 s)
  var LIST_REFRESH_MS = 5000;
  var ACTIONS = ["pause", "resume", "cancel", "restart", "release"];
  var CONFIRM = {
    pause: "Pause this job? It stops at its next chunk boundary and waits (no worker slot) until resumed.",
    resume: "Resume this job from its checkpoint?",
    cancel: "Cancel this job? Its task fails without a retry; the checkpoint is kept (a Clear resumes it).",
    restart: "Restart this job from the beginning on its next attempt? Its progress is discarded then.",
    release: "Release the lease of a holder that stopped heartbeating, so the next attempt takes the slot now?"
  };
  var params = new URLSearchParams(location.search);
  var root = document.getElementById("root");

  function el(tag, attrs, children) {
    var node = document.createElement(tag);
    Object.keys(attrs || {}).forEach(function (k) {
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
  function short(v) { var t = JSON.stringify(v); return t && t.length > 200 ? t.slice(0, 200) + "…" : t; }
  function when(iso) { return iso ? new Date(iso).toLocaleString() : ""; }
  function bar(row, cls) {
    var pct = row.percent == null ? (row.status === "done" ? 100 : 0) : row.percent;
    var outer = el("div", {"class": "bar " + row.status + (cls ? " " + cls : ""), role: "progressbar",
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
          if (r.status === 401) msg = "Not logged in to Airflow (401): log in and reload.";
          var err = new Error(msg); err.status = r.status; throw err;
        }
        return data;
      });
    });
  }
  // The Airflow UI's base path (everything before /resumable/), for links into the UI.
  function uiBase() { var p = location.pathname, i = p.indexOf("/resumable/"); return i > 0 ? p.slice(0, i) : ""; }
  function tiLink(row) {
    if (!row.dag_id || !row.run_id || !row.task_id) return null;
    var path = uiBase() + "/dags/" + encodeURIComponent(row.dag_id) + "/runs/" + encodeURIComponent(row.run_id) +
      "/tasks/" + encodeURIComponent(row.task_id) + (row.map_index != null && row.map_index >= 0 ? "/mapped/" + row.map_index : "");
    return path + "/plugin/checkpoint";
  }

  // -- the Checkpoint tab ------------------------------------------------------------------------
  function checkpointPage() {
    var mapIndex = params.get("map_index");
    if (mapIndex == null || mapIndex === "" || mapIndex === "{MAP_INDEX}") mapIndex = "-1";
    var query = new URLSearchParams({dag_id: params.get("dag_id") || "", run_id: params.get("run_id") || "",
      task_id: params.get("task_id") || "", map_index: mapIndex});
    if (params.get("conn_id")) query.set("conn_id", params.get("conn_id"));
    var timer = null, missing = 0, current = null, busy = false, message = {text: "", error: false};
    // The UI's iframe is sandboxed without allow-modals (window.confirm returns false at once), so
    // the confirmation is in the page: a click asks, a second click on "Confirm" sends.
    var asking = null;

    function schedule(ms) { clearTimeout(timer); timer = setTimeout(load, ms); }
    function load() {
      request("GET", API + "task-instance?" + query).then(function (data) {
        if (!data.resumable) {
          // Not (yet) resumable: a queued task has no row yet; look again for a minute, then stop.
          render(null, data.message);
          if (++missing < 12) schedule(5000);
          return;
        }
        current = data; render(data);
        if (!data.ended) schedule(REFRESH_MS);
      }).catch(function (err) {
        root.replaceChildren(el("p", {"class": "error", id: "error", text: err.message}));
        if (err.status !== 401 && err.status !== 403) schedule(5000);
      });
    }
    function ask(action) { asking = action; message = {text: "", error: false}; render(current); }
    function act(action) {
      asking = null;
      if (!current || busy) return;
      busy = true;
      var q = new URLSearchParams({job: current.job, slot: current.slot});
      if (params.get("conn_id")) q.set("conn_id", params.get("conn_id"));
      request("POST", API + "checkpoint/" + action + "?" + q, {}).then(function () {
        message = {text: action + " requested", error: false};
      }).catch(function (err) {
        message = {text: err.message, error: true};
      }).then(function () { busy = false; load(); });
    }
    function render(row, note) {
      if (!row) { root.replaceChildren(el("p", {id: "not-resumable", "class": "muted", text: note})); return; }
      var figures = [num(row.processed) + (row.total != null ? " / " + num(row.total) : "") + " items"];
      if (row.percent != null) figures.push(row.percent.toFixed(1) + "%");
      if (row.rate != null) figures.push(num(Math.round(row.rate)) + "/s");
      if (row.eta_seconds != null) figures.push("ETA " + duration(row.eta_seconds));
      var lease = row.lease_owner ? row.lease_owner + " — heartbeat " + row.heartbeat_age_seconds + " s ago" +
        (row.lease === "stale" ? " (STALE: the holder missed two heartbeats)" : row.lease === "expired" ? " (expired)" : "") : "none";
      var reason = row.stop_reason && row.stop_reason !== row.status ? " (" + row.stop_reason + ")" : "";
      var pending = row.request ? " — " + row.request + " requested by " + (row.requested_by || "?") : "";
      var buttons = el("div", {id: "actions"}, ACTIONS.map(function (a) {
        var b = el("button", {type: "button", id: "action-" + a, text: a[0].toUpperCase() + a.slice(1)});
        if (!(row.offers && row.offers[a])) b.disabled = true;
        b.addEventListener("click", function () { ask(a); });
        return b;
      }));
      var confirmBox = null;
      if (asking) {
        var yes = el("button", {type: "button", id: "confirm", text: "Confirm " + asking});
        var no = el("button", {type: "button", id: "dismiss", text: "Never mind"});
        var action = asking;
        yes.addEventListener("click", function () { act(action); });
        no.addEventListener("click", function () { asking = null; render(current); });
        confirmBox = el("div", {id: "confirmation", role: "alertdialog", "class": "confirm"}, [el("span", {text: CONFIRM[action] + " "}), yes, no]);
      }
      var hist = el("table", {id: "history"}, [el("tr", {}, ["try", "outcome", "by", "started", "ended", "processed", "reason / error"].map(function (h) { return el("th", {text: h}); }))]);
      (row.history || []).slice().reverse().forEach(function (h) {
        hist.appendChild(el("tr", {}, [h.attempt, h.outcome, h.requested_by || h.owner || "", when(h.started_at), when(h.ended_at),
          num(h.processed_start) + " → " + (h.processed_end == null ? "…" : num(h.processed_end)),
          [h.stop_reason, h.error].filter(Boolean).join(": ")].map(function (v) { return el("td", {text: String(v == null ? "" : v)}); })));
      });
      root.replaceChildren.apply(root, [
        el("h2", {}, ["Checkpoint ", el("span", {"class": "badge " + row.status, id: "status", text: row.status + reason}),
          el("span", {"class": "muted", text: pending})]),
        bar(row),
        el("div", {id: "figures", "data-processed": String(row.processed), text: figures.join(" · ")}),
        el("dl", {}, [
          el("dt", {text: "job"}), el("dd", {text: row.job}),
          el("dt", {text: "slot"}), el("dd", {text: row.slot}),
          el("dt", {text: "position"}), el("dd", {id: "position", text: short(row.position)}),
          el("dt", {text: "lease"}), el("dd", {id: "lease", "class": row.lease === "stale" ? "stale" : "", text: lease}),
          el("dt", {text: "attempt"}), el("dd", {text: "try " + row.attempt + ", " + row.attempts + " attempt(s) this run"}),
          row.last_error ? el("dt", {text: "last error"}) : null, row.last_error ? el("dd", {text: row.last_error}) : null
        ]),
        buttons,
        confirmBox,
        el("div", {id: "message", "class": message.error ? "error" : "", text: message.text}),
        el("p", {id: "refreshed", "class": "muted", "data-at": String(Date.now()),
          text: row.ended ? "Ended: no longer refreshing." : "Refreshing every " + REFRESH_MS / 1000 + " s — " + new Date().toLocaleTimeString()}),
        el("h2", {text: "History"}), hist
      ].filter(Boolean));
    }
    load();
  }

  // -- the Resumable jobs page -------------------------------------------------------------------
  function jobsPage() {
    var form = document.getElementById("filters"), body = document.querySelector("#jobs tbody");
    var msg = document.getElementById("message"), timer = null;
    ["dag_id", "status"].forEach(function (k) { if (params.get(k)) form.elements[k].value = params.get(k); });
    function load() {
      var q = new URLSearchParams({limit: "200"});
      if (form.elements.dag_id.value.trim()) q.set("dag_id", form.elements.dag_id.value.trim());
      if (form.elements.status.value) q.set("status", form.elements.status.value);
      if (params.get("conn_id")) q.set("conn_id", params.get("conn_id"));
      request("GET", API + "checkpoints?" + q).then(function (data) {
        msg.textContent = data.checkpoints.length ? "" : "No slots match."; msg.className = "";
        body.replaceChildren.apply(body, data.checkpoints.map(function (row) {
          var link = tiLink(row);
          return el("tr", {"data-job": row.job, "data-slot": row.slot}, [
            el("td", {text: row.job}), el("td", {text: row.slot}),
            el("td", {}, [el("span", {"class": "badge " + row.status, text: row.status})]),
            el("td", {}, [bar(row), " " + (row.percent == null ? "" : row.percent.toFixed(0) + "%")]),
            el("td", {text: num(row.processed) + (row.total != null ? " / " + num(row.total) : "")}),
            el("td", {text: when(row.updated_at)}),
            el("td", {}, [link ? el("a", {href: link, target: "_top", text: row.dag_id + " / " + row.task_id +
              (row.map_index >= 0 ? "[" + row.map_index + "]" : "")}) : el("span", {"class": "muted", text: "—"})])
          ]);
        }));
        document.getElementById("refreshed").textContent = "updated " + new Date().toLocaleTimeString();
      }).catch(function (err) { msg.textContent = err.message; msg.className = "error"; })
        .then(function () { clearTimeout(timer); timer = setTimeout(load, LIST_REFRESH_MS); });
    }
    form.addEventListener("input", function () { clearTimeout(timer); timer = setTimeout(load, 300); });
    form.addEventListener("submit", function (e) { e.preventDefault(); load(); });
    load();
  }

  if (root.dataset.page === "checkpoint") checkpointPage(); else jobsPage();
})();
