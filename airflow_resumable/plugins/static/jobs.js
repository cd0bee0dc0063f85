// The Resumable jobs page: plain JavaScript, no build step. The helpers it shares with the
// Checkpoint tab (requests, links into the Airflow UI, times, bars) come from resumable.js, loaded
// before this file (window.ResumableUI).
(function (R) {
  "use strict";
  var el = R.el, num = R.num, host = R.host, request = R.request, API = R.API, params = R.params, uiBase = R.uiBase,
    link = R.link, tabPath = R.tabPath, bar = R.bar, pace = R.pace, cell = R.cell, when = R.when, clock = R.clock,
    zone = R.zone, LIST_REFRESH_MS = R.LIST_REFRESH_MS, shown = R.shown, shownWhy = R.shownWhy, rangeKeys = R.rangeKeys;
  // A job's partitions by how they are shown (core/view.py liveness_of), in the order the line lists them.
  var KINDS = ["done", "running", "stalled", "abandoned", "paused", "failed", "waiting", "other"];

  // -- the Resumable jobs page -------------------------------------------------------------------
  var STATUSES = ["running", "paused", "failed", "cancelled", "done"];
  var ID_LEN = 250;  // Airflow's longest DAG id (the API refuses a longer filter)
  // A filter as typed or as a shared address gave it: no control characters (the API refuses a
  // NUL), at most ID_LEN characters.
  function cleanFilter(text) {
    return String(text || "").replace(/[\u0000-\u001f\u007f]/g, "").trim().slice(0, ID_LEN);
  }
  // The page's address with these parameters, for the frame and, where the Airflow UI shows the
  // page, for the page around it: a reload or a shared link keeps the filters. Airflow 3.3 mirrors
  // a nav page's frame as /plugin/<page><frame path><query> and gives that query back to the frame
  // on a reload; an older UI keeps /plugin/<page>, whose own query this page reads at its start.
  function keepInAddress(values) {
    var q = new URLSearchParams(location.search);
    Object.keys(values).forEach(function (k) { if (values[k]) q.set(k, values[k]); else q.delete(k); });
    var search = q.toString() ? "?" + q : "";
    history.replaceState(history.state, "", location.pathname + search);
    var top = host();
    if (!top) return;
    try {
      var path = top.location.pathname, at = path.indexOf("/plugin/");
      if (at < 0) return;
      var page = path.slice(0, at) + "/plugin/" + path.slice(at + 8).split("/")[0];
      var mirrored = path.slice(page.length) === location.pathname;
      top.history.replaceState(top.history.state, "", page + (mirrored ? location.pathname : "") + search);
    } catch (e) { /* the host cannot be reached: the frame's own address keeps them */ }
  }
  // The filters the address asks for: the frame's own, else the page's around it (an older UI).
  function askedFilters() {
    var own = new URLSearchParams(location.search), top = host(), theirs = new URLSearchParams();
    try { if (top) theirs = new URLSearchParams(top.location.search); } catch (e) { /* another origin */ }
    var from = own.has("dag_id") || own.has("status") || own.has("job") ? own : theirs;
    return {dag_id: cleanFilter(from.get("dag_id")), status: String(from.get("status") || ""),
      job: from.get("job"), run_id: from.get("run_id")};
  }
  // A job or DAG name that may wrap after its dots and underscores, never inside a word.
  function name(text) {
    var parts = String(text == null ? "" : text).split(/(?<=[._\/\]])/);
    return el("span", {}, parts.reduce(function (a, part, i) { return a.concat(i ? [el("wbr"), part] : [part]); }, []));
  }
  function plural(n, one, many) { return num(n) + " " + (n === 1 ? one : many); }
  function sentenceList(items) {
    return items.length < 2 ? items.join("") : items.slice(0, -1).join(", ") + " and " + items[items.length - 1];
  }

  function jobsPage() {
    var form = document.getElementById("filters"), body = document.querySelector("#jobs tbody");
    var msg = document.getElementById("message"), timer = null, generation = 0, rows = [];
    var summary = document.getElementById("job-summary"), summaryBody = document.querySelector("#summary tbody");
    var summaryMsg = document.getElementById("summary-message"), asking = null, hasJobs = true;
    var panel = document.getElementById("job-partitions"), panelBody = document.querySelector("#partitions tbody");
    var filterNote = document.getElementById("filter-note");
    var asked = askedFilters();
    var opened = asked.job ? {job: asked.job, run_id: asked.run_id} : null;
    form.elements.dag_id.value = asked.dag_id;
    if (STATUSES.indexOf(asked.status) >= 0) form.elements.status.value = asked.status;
    else if (asked.status) filterNote.textContent = "Status \u201c" + cleanFilter(asked.status) + "\u201d is not one of " +
      STATUSES.join(", ") + ": showing any status.";
    function conn(q) { if (params.get("conn_id")) q.set("conn_id", params.get("conn_id")); return q; }
    function filters() {
      return {dag_id: cleanFilter(form.elements.dag_id.value), status: form.elements.status.value,
        job: opened ? opened.job : "", run_id: opened && opened.run_id ? opened.run_id : ""};
    }
    function load() {
      var mine = ++generation;
      clearTimeout(timer);
      var f = filters();
      keepInAddress(f);
      var q = conn(new URLSearchParams({limit: "200"}));
      if (f.dag_id) q.set("dag_id_pattern", f.dag_id);
      if (f.status) q.set("status", f.status);
      var jobs = hasJobs ? request("GET", API + "jobs?" + conn(new URLSearchParams())).catch(function (err) {
        if (err.status === 404) hasJobs = false;  // an API without the summary: the slots alone
        return null;
      }) : Promise.resolve(null);
      Promise.all([request("GET", API + "checkpoints?" + q), jobs]).then(function (res) {
        if (mine !== generation) return;  // a newer filter's answer is on its way
        // A partitioned job's plan row (<job>#plan) is part of its job's line above, not a slot to watch.
        rows = res[0].checkpoints.filter(function (r) { return !/#plan$/.test(r.job); });
        msg.textContent = rows.length ? "" : "No slots match."; msg.className = "";
        body.replaceChildren.apply(body, rows.map(slotRow));
        renderSummary(res[1], f.dag_id);
        loadPartitions();
        document.getElementById("refreshed").textContent = "updated " + clock(new Date()) + " (" + zone() + ")";
      }).catch(function (err) { if (mine === generation) { msg.textContent = err.message; msg.className = "error"; } })
        .then(function () { if (mine === generation) timer = setTimeout(load, LIST_REFRESH_MS); });
    }
    function slotRow(row) {
      var path = tabPath(row);
      return el("tr", {"data-job": row.job, "data-slot": row.slot}, [
        el("td", {"class": "name"}, [name(row.job)]), cell(row.slot, {"class": "code"}),
        el("td", {}, [el("span", {"class": "badge " + shown(row), title: shownWhy(row) || null, text: shown(row)})]),
        el("td", {"class": "progress"}, [bar(row), row.percent == null ? "" : row.percent.toFixed(0) + "%"]),
        cell(num(row.processed) + (row.total != null ? " / " + num(row.total) : ""), {"class": "nowrap"}),
        cell(when(row.updated_at), {"class": "nowrap"}),
        el("td", {}, [path ? link(path, row.dag_id + " / " + row.task_id + (row.map_index >= 0 ? "[" + row.map_index + "]" : ""),
          {"class": "ti-link"}) : el("span", {"class": "muted", text: "—"})])
      ]);
    }
    // The run whose failed partitions a re-run clears: the job's own word, else its latest failed slot.
    function failedRun(job) {
      if (job.run_id) return job.run_id;
      var failed = rows.filter(function (r) { return r.dag_id === job.dag_id && r.task_id === job.task_id && r.status === "failed"; });
      return failed.length ? failed[0].run_id : null;
    }
    // How a job stands: a mapped or partitioned job's partitions counted; a job of one slot, its status.
    function standing(job) {
      var p = job.partitions || {};
      if (!(job.mapped || job.partitioned)) {
        var only = KINDS.filter(function (k) { return p[k]; })[0];
        var slot = rows.filter(function (r) { return r.job === job.job && r.slot === job.slot; })[0];
        // The line's own count first: it is judged with Airflow's task instance state, the listing is not.
        var one = only && only !== "other" ? only : slot ? shown(slot) : "unknown";
        return [el("span", {"class": "badge " + one, "data-count": only || "", text: one}), differs(job)];
      }
      var counts = KINDS.filter(function (k) { return p[k]; }).map(function (k) {
        return el("span", {"class": "badge " + (k === "other" || k === "waiting" ? "" : k), "data-count": k, text: num(p[k]) + " " + k,
          title: k === "abandoned" ? "Their rows still say running, but nobody runs them: the lease expired, or Airflow ended " +
            "the task instance. Restart or release them on their Checkpoint tab, or re-run the failed ones." : null});
      });
      return counts.reduce(function (a, c) { return a.concat([c, " "]); }, [])
        .concat([el("span", {"class": "muted", text: "of " + plural(p.total || 0, "partition", "partitions")}), differs(job)]);
    }
    // Where Airflow's task instance states differ from the partitions' rows, say so and why.
    function differs(job) {
      var t = job.task_instances, p = job.partitions || {};
      if (!t) return null;
      var failed = t.failed || 0, rowsFailed = p.failed || 0;
      var running = (t.running || 0), rowsRunning = (p.running || 0) + (p.stalled || 0);
      if (failed === rowsFailed && running === rowsRunning) return null;
      var airflow = Object.keys(t).map(function (k) { return num(t[k]) + " " + k; }).join(", ");
      var why = p.abandoned ? " — " + plural(p.abandoned, "row", "rows") + " still say running after " +
        (p.abandoned === 1 ? "its" : "their") + " attempt ended (abandoned)" : "";
      return el("div", {"class": "note ti-differs", text: "Airflow's task instances: " + airflow + why + "."});
    }
    function renderSummary(data, dag) {
      if (!data || !data.jobs) { summary.hidden = true; return; }
      var needle = dag.toLowerCase(), status = form.elements.status.value;
      var jobs = data.jobs.filter(function (j) { return !needle || String(j.dag_id || "").toLowerCase().indexOf(needle) >= 0; });
      summary.hidden = !jobs.length;
      summaryBody.replaceChildren.apply(summaryBody, jobs.map(function (job) {
        var p = job.partitions || {}, several = job.mapped || job.partitioned;
        // Offered when Airflow has failed task instances (what the re-run clears), else when a row says so.
        var tiFailed = job.task_instances ? job.task_instances.failed || 0 : p.failed;
        var runId = several && tiFailed ? failedRun(job) : null;
        var actions = [];
        if (runId) {  // first: the one that changes something
          var rerun = el("button", {type: "button", "class": "rerun-failed", text: "Re-run failed partitions",
            title: "Clears the " + plural(tiFailed, "failed partition", "failed partitions") + " of run " + runId +
              " in Airflow (its task instances Airflow has as failed): each resumes from its own checkpoint, the " +
              "others keep their state."});
          rerun.addEventListener("click", function () { ask({job: job.job, run_id: runId}); });
          actions.push(rerun);
        }
        if (several) {
          var open = el("button", {type: "button", "class": "show-partitions", text: "Partitions",
            title: "Lists this run's partitions below, each with its figures, its error and a link to its Checkpoint tab."});
          open.addEventListener("click", function () { opened = {job: job.job, run_id: job.run_id}; load(); });
          actions.push(open);
        }
        var show = el("button", {type: "button", "class": "show-slots", text: "Slots",
          title: "Filters the slots below to DAG " + job.dag_id + "."});
        show.addEventListener("click", function () { form.elements.dag_id.value = job.dag_id || ""; load(); });
        actions.push(show);
        var task = job.dag_id && job.task_id ? link(uiBase() + "/dags/" + encodeURIComponent(job.dag_id) + "/tasks/" +
          encodeURIComponent(job.task_id), "") : el("span", {"class": "muted", text: "—"});
        if (job.dag_id && job.task_id) task.replaceChildren(name(job.dag_id + " / " + job.task_id));
        return el("tr", {"data-job": job.job, hidden: status && !p[status] ? "" : null}, [
          // The job's actions under its name: in view however narrow the window (the table may
          // scroll sideways, from the right).
          el("td", {"class": "name"}, [name(job.job), planRequest(job), splitsList(job),
            el("div", {"class": "actions"}, actions)]),
          el("td", {"class": "name"}, [task]),
          el("td", {"class": "standing"}, p.total ? standing(job) : [el("span", {"class": "muted", text: "none"})]),
          el("td", {"class": "progress"}, [bar({percent: job.percent, status: p.failed || p.abandoned ? "failed" : p.total && p.done === p.total ? "done" : "running"}),
            job.percent == null ? "" : job.percent.toFixed(0) + "%"]),
          // The plan's rows, and the dead letters among the processed ones (the summary task tells them apart).
          cell(num(job.processed) + (job.total != null ? " / " + num(job.total) : "") +
            (job.skipped ? " · " + num(job.skipped) + " skipped" : "") +
            (job.planned != null ? " · " + num(job.planned) + " planned" : ""), {"class": "nowrap job-processed"}),
          cell(pace(job), {"class": "job-pace"}),
          cell(when(job.updated_at), {"class": "nowrap"})
        ]);
      }));
    }
    // A request pending on the job's plan row (a restart of the whole job): the planning task's next
    // run carries it out, or refuses it while a partition runs (its log says which); shown until then.
    function planRequest(job) {
      var r = job.plan_request;
      if (!r) return null;
      return el("div", {"class": "note plan-request", text: r.request + " of the whole job requested" +
        (r.requested_by ? " by " + r.requested_by : "") + ": not carried out yet; the planning task's next run " +
        "(Clear it) splits the job anew, or says why not"});
    }
    // The ranges rebalancing took from running partitions, in the order they were agreed: which range
    // took what (the keys it holds now) from which, when, by whom, and who runs it now, how far. Each
    // is part of its partition's line (the counts above count the partition once). Their texts come through the server's
    // outward_text, and go in as text nodes here, never as markup.
    function splitsList(job) {
      var splits = job.splits || [];
      if (!splits.length) return null;
      return el("ul", {"class": "note splits", title: "Ranges taken from running partitions (rebalancing)"},
        splits.map(function (s) {
          var runner = s.map_index == null ? "nobody has started it" : "run by [" + s.map_index + "], " +
            (s.shown_status || s.status) + ", " + num(s.processed) + (s.total != null ? " / " + num(s.total) : "");
          return el("li", {"data-range": s.range}, ["range " + s.range + " (" + s.job + ", " + rangeKeys(s) + ") taken from " +
            s.from + (s.by ? " by " + s.by : "") + (s.when ? " at " : ""), s.when ? when(s.when) : null, ": " + runner]);
        }));
    }
    // One job's partitions, each a way into its Checkpoint tab (the job of ?job=&run_id=, or the one opened).
    function loadPartitions() {
      if (!opened || !hasJobs) { panel.hidden = true; return; }
      var target = opened, q = conn(new URLSearchParams({job: target.job}));
      if (target.run_id) q.set("run_id", target.run_id);
      request("GET", API + "jobs/partitions?" + q).then(function (d) {
        if (opened !== target) return;
        var p = d.partitions || {};
        document.getElementById("partitions-title").replaceChildren(
          "Partitions of " + d.job + (d.run_id ? " (run " + d.run_id + ")" : "") + ": " +
          KINDS.filter(function (k) { return p[k] && k !== "other"; }).map(function (k) { return num(p[k]) + " " + k; }).join(", "),
          " ", (function () { var b = el("button", {type: "button", id: "close-partitions", text: "Close"});
            b.addEventListener("click", function () { opened = null; panel.hidden = true; keepInAddress(filters()); }); return b; })());
        panelBody.replaceChildren.apply(panelBody, (d.partition_rows || []).map(function (row) {
          var path = row.status === "waiting" ? null : tabPath(row);
          var error = row.status === "failed" || row.status === "cancelled" ? row.last_error || "" : "";
          return el("tr", {"data-partition": String(row.map_index), "data-status": shown(row)}, [
            cell(row.map_index >= 0 ? "[" + row.map_index + "]" : "—", {"class": "code"}),
            el("td", {}, [el("span", {"class": "badge " + (row.status === "waiting" ? "" : shown(row)), title: shownWhy(row) || null,
              text: shown(row) + (row.task_state && row.task_state !== "none" ? " · task instance " + row.task_state : "")})]),
            el("td", {"class": "progress"}, [bar(row), row.percent == null ? "" : row.percent.toFixed(0) + "%"]),
            cell(row.status === "waiting" ? "not started" : num(row.processed) + (row.total != null ? " / " + num(row.total) : ""), {"class": "nowrap"}),
            cell(pace(row), {"class": "nowrap"}), cell(when(row.updated_at), {"class": "nowrap"}),
            cell(error.length > 300 ? error.slice(0, 300) + "…" : error, {"class": "partition-error", title: error || null}),
            el("td", {}, [path ? link(path, "Checkpoint of " + row.job, {"class": "partition-link"}) : el("span", {"class": "muted", text: "—"})])
          ]);
        }));
        panel.hidden = false;
      }).catch(function (err) {
        panel.hidden = false;
        document.getElementById("partitions-title").replaceChildren(el("span", {"class": "error", text: err.message}));
        panelBody.replaceChildren();
      });
    }
    // The confirmation names what the re-run clears, read as the re-run reads it (Airflow's states, now).
    function ask(target) {
      asking = null;
      summaryMsg.replaceChildren(el("span", {"class": "muted", text: "Reading Airflow's failed task instances…"}));
      request("GET", API + "jobs/rerun_preview?" + conn(new URLSearchParams({job: target.job, run_id: target.run_id})))
        .then(function (d) { asking = {job: target.job, run_id: target.run_id, failed: d.failed || []}; renderAsk(); })
        .catch(function (err) { summaryMsg.replaceChildren(el("span", {"class": "error", text: "Re-run: " + err.message})); });
    }
    function renderAsk() {
      if (!asking) { summaryMsg.replaceChildren(); return; }
      var target = asking;
      var yes = el("button", {type: "button", id: "confirm", text: "Confirm re-run"});
      var no = el("button", {type: "button", id: "dismiss", text: "Never mind"});
      no.addEventListener("click", function () { asking = null; renderAsk(); });
      yes.addEventListener("click", function () {
        asking = null;
        request("POST", API + "jobs/rerun_failed?" + conn(new URLSearchParams({job: target.job, run_id: target.run_id})), {})
          .then(function (r) {
            var cleared = r.cleared || [], one = cleared.length === 1;
            var what = one && cleared[0] < 0 ? "the failed task instance" : one ? "failed partition " + cleared[0]
              : "failed partitions " + sentenceList(cleared.map(String));
            summaryMsg.replaceChildren(el("span", {id: "rerun-result", text: "Cleared " + what + " of " + target.job +
              " in run " + target.run_id + ": Airflow runs " + (one ? "it again from its checkpoint." : "them again, each from its checkpoint.")}));
          }).catch(function (err) { summaryMsg.replaceChildren(el("span", {"class": "error", text: "Re-run refused: " + err.message})); })
          .then(load);
      });
      var failed = target.failed, one = failed.length === 1;
      if (!failed.length) {
        summaryMsg.replaceChildren(el("span", {id: "rerun-none", text: "No task instance of " + target.job + " in run " +
          target.run_id + " is failed in Airflow now: nothing to re-run."}));
        asking = null;
        return;
      }
      var what = one && failed[0] < 0 ? "the failed task instance" : one ? "failed partition " + failed[0]
        : "failed partitions " + sentenceList(failed.map(String));
      summaryMsg.replaceChildren(el("div", {id: "confirmation", role: "alertdialog", "class": "confirm"},
        [el("span", {text: "Re-run " + what + " of " + target.job + " in run " + target.run_id + " (as Airflow has " +
          (one ? "it" : "them") + " now)? " + (one ? "Its task instance is" : "Their task instances are") +
          " cleared in Airflow and each resumes from its checkpoint. "}), yes, no]));
    }
    var typing = null;
    form.elements.dag_id.addEventListener("input", function () { clearTimeout(typing); typing = setTimeout(load, 250); });
    form.elements.status.addEventListener("change", function () { filterNote.textContent = ""; load(); });  // at once
    form.addEventListener("submit", function (e) { e.preventDefault(); load(); });
    load();
  }

  jobsPage();
})(window.ResumableUI);
