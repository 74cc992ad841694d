// smx console: pages over smx's HTTP API (the routes the CLI's clients
// use). Presentation only: every decision, count and verification result
// comes from the server. Text from the API is always set as text, never
// as HTML.
"use strict";

const view = document.getElementById("view");
let stopPage = () => {}; // ends the current page's streams and timers

// el builds an element: el("td", {class: "x"}, "text", child, ...).
function el(tag, attrs, ...kids) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
    else e.setAttribute(k, v === true ? "" : v);
  }
  for (const k of kids.flat()) {
    if (k === undefined || k === null || k === false) continue;
    e.append(k instanceof Node ? k : String(k));
  }
  return e;
}

class APIError extends Error {
  constructor(status, body) {
    super((body && body.message) || "HTTP " + status);
    this.status = status;
    this.class = body && body.class;
  }
}

async function api(method, path, body) {
  const opt = { method, headers: {} };
  if (body !== undefined) {
    opt.headers["Content-Type"] = "application/json";
    opt.body = JSON.stringify(body);
  }
  const r = await fetch(path, opt);
  if (r.status === 204) return null;
  let data = null;
  try { data = await r.json(); } catch (e) { /* not JSON */ }
  if (!r.ok) throw new APIError(r.status, data);
  return data;
}

// stream reads a JSON-lines response, calling fn with each object, until
// signal aborts or the server ends it.
async function stream(path, signal, fn) {
  const r = await fetch(path, { signal });
  if (!r.ok) {
    let data = null;
    try { data = await r.json(); } catch (e) { /* not JSON */ }
    throw new APIError(r.status, data);
  }
  const reader = r.body.getReader();
  const dec = new TextDecoder();
  let buf = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buf += dec.decode(value, { stream: true });
    let i;
    while ((i = buf.indexOf("\n")) >= 0) {
      const line = buf.slice(0, i).trim();
      buf = buf.slice(i + 1);
      if (line) fn(JSON.parse(line));
    }
  }
}

function setLive(text) { document.getElementById("live").textContent = text; }

function debounce(fn, ms) {
  let t = null;
  return () => { if (!t) t = setTimeout(() => { t = null; fn(); }, ms); };
}

function fmtDuration(s) {
  if (s < 60) return s + "s";
  if (s < 3600) return Math.floor(s / 60) + "m " + (s % 60) + "s";
  return Math.floor(s / 3600) + "h " + Math.floor((s % 3600) / 60) + "m";
}

function fmtBytes(n) {
  if (n === undefined || n === null) return "";
  if (n < 1024) return n + " B";
  if (n < 1 << 20) return (n / 1024).toFixed(1) + " KiB";
  if (n < 1 << 30) return (n / (1 << 20)).toFixed(1) + " MiB";
  return (n / (1 << 30)).toFixed(1) + " GiB";
}

// ask shows the dialog and resolves to the text entered, or null.
function ask(label, hint, value) {
  const d = document.getElementById("ask");
  document.getElementById("ask-label").textContent = label;
  document.getElementById("ask-hint").textContent = hint || "";
  const inp = document.getElementById("ask-input");
  inp.value = value || "";
  return new Promise((resolve) => {
    d.addEventListener("close", () => resolve(d.returnValue === "ok" ? inp.value.trim() : null), { once: true });
    d.showModal();
    inp.focus();
  });
}

// approvals returns the pending questions, or null when this server has
// no approvals route.
async function approvals() {
  try {
    const r = await api("GET", "/v1/approvals");
    return (r && r.approvals) || [];
  } catch (e) {
    if (e.status === 404) return null;
    throw e;
  }
}

async function updateQuestionCount() {
  const b = document.getElementById("questions-count");
  try {
    const l = await approvals();
    const n = l ? l.filter((a) => !a.state || a.state === "pending").length : 0;
    b.textContent = n;
    b.hidden = n === 0;
    b.className = "badge warn";
    b.setAttribute("aria-label", n + " pending questions");
    return l;
  } catch (e) {
    return null;
  }
}

// ---- Sandboxes -------------------------------------------------------

const agentInfo = new Map(); // name -> {preset, workspace} or null (not an agent)

async function sandboxesPage() {
  const ctl = new AbortController();
  const tbody = el("tbody");
  const msg = el("p", { class: "error", role: "alert" });
  view.replaceChildren(
    el("h1", {}, "Sandboxes"),
    msg,
    el("table", { id: "sandboxes" },
      el("thead", {}, el("tr", {},
        ["Name", "State", "Preset", "Workspace", "Profile", "Uptime", "CPU / memory", "Refusals", "Questions", "Actions"]
          .map((h) => el("th", { scope: "col" }, h)))),
      tbody),
    el("p", { class: "muted", id: "empty", hidden: true }, "No sandboxes. Create one with smx agent create NAME or smx agent run."));
  let list = [];
  let questions = [];
  const render = () => {
    document.getElementById("empty").hidden = list.length > 0;
    const byBox = {};
    for (const q of questions || []) {
      if (!q.state || q.state === "pending") byBox[q.sandbox] = (byBox[q.sandbox] || 0) + 1;
    }
    tbody.replaceChildren(...list.map((s) => sandboxRow(s, questions ? byBox[s.name] || 0 : null, msg, refresh)));
  };
  const refresh = debounce(async () => {
    try {
      list = await api("GET", "/v1/sandboxes");
      await Promise.all(list.filter((s) => !agentInfo.has(s.name)).map(async (s) => {
        try {
          const a = await api("GET", "/v1/agents/" + encodeURIComponent(s.name));
          agentInfo.set(s.name, { preset: a.preset, workspace: a.workspace });
        } catch (e) {
          agentInfo.set(s.name, null);
        }
      }));
      questions = await updateQuestionCount(); // null: the server has no approvals
      render();
    } catch (e) {
      msg.textContent = "Could not list sandboxes: " + e.message;
    }
  }, 150);
  refresh();
  const tick = setInterval(() => {
    for (const td of tbody.querySelectorAll("td[data-started]")) {
      td.textContent = fmtDuration(Math.max(0, Math.floor((Date.now() - Date.parse(td.dataset.started)) / 1000)));
    }
  }, 1000);
  const poll = setInterval(refresh, 5000); // questions, and what the stream cannot say
  watchEvents(ctl.signal, refresh);
  stopPage = () => { ctl.abort(); clearInterval(tick); clearInterval(poll); };
}

// watchEvents follows GET /v1/events, calling onEvent for each, and
// reconnects after a break.
async function watchEvents(signal, onEvent) {
  while (!signal.aborted) {
    try {
      setLive("live");
      await stream("/v1/events", signal, onEvent);
    } catch (e) {
      if (signal.aborted) return;
      setLive("disconnected: " + e.message + "; retrying");
    }
    await new Promise((r) => setTimeout(r, 1000));
  }
}

function sandboxRow(s, nQuestions, msg, refresh) {
  const a = agentInfo.get(s.name);
  const q = encodeURIComponent(s.name);
  const act = (label, method, path, body, cls) => el("button", {
    class: cls,
    "aria-label": label + " " + s.name,
    onclick: async (ev) => {
      ev.target.disabled = true;
      msg.textContent = "";
      try {
        await api(method, path, typeof body === "function" ? await body() : body);
      } catch (e) {
        if (e.message !== "cancelled") msg.textContent = label + " " + s.name + ": " + e.message;
      }
      ev.target.disabled = false;
      refresh();
    },
  }, label);
  const live = s.status === "running" || s.status === "paused";
  const started = s.status === "running" && s.started ? s.started : null;
  return el("tr", { "data-name": s.name },
    el("td", {}, el("a", { href: "#/sandbox/" + q }, s.name)),
    el("td", { class: "state state-" + s.status }, s.status, s.error ? el("div", { class: "muted" }, s.error) : null),
    el("td", {}, a ? a.preset : el("span", { class: "muted" }, "—")),
    el("td", { class: "mono" }, a && a.workspace ? a.workspace : el("span", { class: "muted" }, "—")),
    el("td", {}, el("a", { href: "#/profile/" + q }, s.profile)),
    el("td", started ? { "data-started": started } : {}, started ? fmtDuration(s.uptime_seconds || 0) : "—"),
    el("td", { class: "usage" }, s.cpus + " CPU, " + s.memory_mib + " MiB", usage(s)),
    el("td", {}, el("a", { href: "#/sandbox/" + q + "?refused=1", class: "badge" + (s.refusals ? " bad" : ""),
      "aria-label": s.refusals + " refusals" }, s.refusals)),
    el("td", {}, nQuestions === null ? el("span", { class: "muted", title: "this smx serves no approvals" }, "—") :
      el("a", { href: "#/questions", class: "badge" + (nQuestions ? " warn" : ""), "aria-label": nQuestions + " pending questions" }, nQuestions)),
    el("td", {},
      !live ? act("Start", "POST", "/v1/sandboxes/" + q + "/start") : null,
      live ? act("Stop", "POST", "/v1/sandboxes/" + q + "/stop") : null,
      s.status === "running" ? act("Pause", "POST", "/v1/sandboxes/" + q + "/pause") : null,
      s.status === "paused" || s.status === "suspended" ? act("Resume", "POST", "/v1/sandboxes/" + q + "/resume") : null,
      live ? act("Snapshot", "POST", "/v1/sandboxes/" + q + "/snapshots", async () => {
        const n = await ask("Snapshot name", "The sandbox keeps running; fork it later from this snapshot.", s.name + "-snap");
        if (!n) throw new Error("cancelled");
        return { name: n };
      }) : null,
      el("button", { "aria-label": "Fork " + s.name, onclick: () => fork(s, msg, refresh) }, "Fork"),
      act("Remove", "DELETE", "/v1/sandboxes/" + q + "?force=true", async () => {
        const n = await ask("Type the name to remove it", "Stops and removes " + s.name + "; its log stays.", "");
        if (n !== s.name) throw new Error("cancelled");
        return undefined;
      }, "danger")));
}

const cpuSeen = new Map(); // name -> {cpu, at}: the last CPU time read

// usage says what a live sandbox's QEMU uses on the host: CPU as a share
// of one core since the last reading, and resident memory.
function usage(s) {
  if (!s.rss_bytes) return null;
  let pct = "";
  const prev = cpuSeen.get(s.name);
  const now = Date.now();
  if (prev && now > prev.at && s.cpu_seconds >= prev.cpu) {
    pct = "CPU " + Math.round(((s.cpu_seconds - prev.cpu) * 100000) / (now - prev.at)) + "% · ";
  }
  if (!prev || now - prev.at > 2000) cpuSeen.set(s.name, { cpu: s.cpu_seconds, at: now });
  return el("div", { class: "muted" }, pct + "RSS " + fmtBytes(s.rss_bytes));
}

// fork starts a new sandbox from this sandbox's newest snapshot.
async function fork(s, msg, refresh) {
  msg.textContent = "";
  try {
    const snaps = (await api("GET", "/v1/snapshots")).filter((sn) => sn.source === s.name);
    if (snaps.length === 0) {
      msg.textContent = "Fork " + s.name + ": it has no snapshot yet; take one with Snapshot first.";
      return;
    }
    snaps.sort((x, y) => Date.parse(y.created) - Date.parse(x.created));
    const n = await ask("New sandbox name", "Forked from snapshot " + snaps[0].name + ".", s.name + "-fork");
    if (!n) return;
    await api("POST", "/v1/snapshots/" + encodeURIComponent(snaps[0].name) + "/fork", { name: n });
  } catch (e) {
    msg.textContent = "Fork " + s.name + ": " + e.message;
  }
  refresh();
}

// ---- Timeline --------------------------------------------------------

const channels = [
  ["all", "All channels"], ["exec", "Commands"], ["net", "Network"], ["cred", "Credentials"],
  ["git", "Git"], ["ssh", "SSH"], ["file", "Files"], ["approval", "Questions"], ["lifecycle", "Lifecycle"],
];

function channelOf(kind) {
  const p = kind.split(".")[0];
  if (p === "run" || p === "exec") return "exec";
  if (p === "net" || p === "port") return "net";
  if (p === "file" || p === "copy") return "file";
  if (["cred", "git", "ssh", "approval"].includes(p)) return p;
  return "lifecycle";
}

function isRefusal(r) {
  return r.kind.endsWith(".refused") || (r.fields && r.fields.refused === true);
}

// summary is one line saying what a record is about.
function summary(r) {
  const f = r.fields || {};
  const dst = f.host ? f.host + (f.dst ? " (" + f.dst + ")" : "") : (f.dst || "");
  switch (r.kind) {
    case "run.start": case "exec.start":
      return "$ " + (f.args || []).join(" ") + (f.user && f.user !== "root" ? "  (as " + f.user + ")" : "");
    case "run.end": case "exec.end":
      return f.error ? "failed: " + f.error : "exit " + f.exit_code + (f.signal ? " (signal " + f.signal + ")" : "") +
        " after " + f.duration_ms + " ms, " + fmtBytes(f.output_bytes) + " output";
    case "net.flow":
      return (f.proto || "") + " " + dst + "  ↑" + fmtBytes(f.bytes_out) + " ↓" + fmtBytes(f.bytes_in) + " in " + f.duration_ms + " ms";
    case "net.refused":
      return (f.proto || "") + " " + dst + (f.method ? " " + f.method + " " + (f.path || "") : "");
    case "cred.use":
      return (f.credential || "") + (f.secret ? " (secret " + f.secret + ")" : "") + " → " +
        (f.http_host || f.sni || f.host || f.forge || "") + (f.method ? " " + f.method : "") + (f.path ? " " + f.path : "");
    case "cred.usage":
      return (f.credential || "") + " → " + (f.provider || "") + (f.model ? " " + f.model : "") +
        (f.input_tokens !== undefined ? ": " + f.input_tokens + " in, " + (f.output_tokens || 0) + " out" : "") +
        (f.cache_read_tokens ? ", " + f.cache_read_tokens + " cache read" : "") +
        (f.total_tokens !== undefined ? " (total " + f.total_tokens + (f.day_tokens !== undefined ? ", today " + f.day_tokens : "") + ")" : "");
    case "git.fetch":
      return "fetch " + (f.repo || "") + (f.wants ? " (" + f.wants + " wants)" : "") + (f.bytes ? " " + fmtBytes(f.bytes) : "");
    case "git.push": case "git.refused":
      return (f.op || f.access || "push") + " " + (f.repo || "") +
        (Array.isArray(f.refs) ? " " + f.refs.map((r) => r.ref + " " + short(r.old) + "→" + short(r.new) + (r.result ? " (" + r.result + ")" : "")).join(", ")
          : (f.ref ? " " + f.ref : ""));
    case "ssh.session": case "ssh.refused": case "ssh.forward":
      return (f.user ? f.user + "@" : "") + (f.host || "") + (f.port ? ":" + f.port : "") + (f.command ? " $ " + f.command : "") +
        (f.exit_status !== undefined ? " exit " + f.exit_status : "");
    case "file.refused": case "copy.refused":
      return (f.op || "") + " " + (f.path || "");
  }
  if (r.kind.startsWith("approval.")) {
    return (f.channel ? f.channel + ": " : "") + (f.what || "") + (f.decision ? " — " + f.decision : "") + (f.by ? " by " + f.by : "");
  }
  const keys = Object.keys(f).filter((k) => !["rule", "reason", "profile"].includes(k));
  return keys.map((k) => k + "=" + (typeof f[k] === "object" ? JSON.stringify(f[k]) : f[k])).join(" ");
}

function short(h) { return h ? String(h).slice(0, 8) : "0"; }

// explainRequest turns a refusal into the request `explain` takes, or "".
function explainRequest(r) {
  const f = r.fields || {};
  switch (channelOf(r.kind)) {
    case "net": {
      const host = f.host || f.sni || f.http_host || (f.dst ? f.dst.replace(/:\d+$/, "").replace(/^\[|\]$/g, "") : "");
      const port = f.dst && /:(\d+)$/.test(f.dst) ? f.dst.match(/:(\d+)$/)[1] : "";
      if (!host) return "";
      if (f.proto === "udp") return "udp:" + host + ":" + port;
      if (port === "443") return "https://" + host + (f.path || "/");
      if (port === "80") return "http://" + host + (f.path || "/");
      return "tcp:" + (host.includes(":") ? "[" + host + "]" : host) + ":" + port;
    }
    case "file":
      return f.path ? "file:" + (/^(read|open-ro|lookup|getattr|readdir|readlink|stat)/.test(f.op || "") ? "ro" : "rw") + ":" + f.path : "";
    case "git": {
      if (!f.repo) return "";
      // A push names each ref it was refused; explain the first of them.
      const r = Array.isArray(f.refs) ? (f.refs.find((x) => x.result === "refused") || f.refs[0]) : null;
      if (r) return "git:" + (r.access || "push") + ":" + f.repo + ":" + r.ref;
      return "git:" + (f.access || (f.op === "fetch" ? "read" : "read")) + ":" + f.repo + (f.ref ? ":" + f.ref : "");
    }
    case "ssh":
      return f.host ? "ssh:" + (f.user ? f.user + "@" : "") + f.host + ":" + (f.port || 22) : "";
  }
  return "";
}

function hashParams() {
  const h = location.hash;
  const i = h.indexOf("?");
  return new URLSearchParams(i >= 0 ? h.slice(i + 1) : "");
}

async function timelinePage(name) {
  const ctl = new AbortController();
  const q = encodeURIComponent(name);
  const params = hashParams();
  const chan = el("select", { id: "channel" }, channels.map(([v, t]) => el("option", { value: v }, t)));
  const outcome = el("select", { id: "outcome" },
    el("option", { value: "all" }, "Allowed and refused"), el("option", { value: "refused" }, "Refused only"),
    el("option", { value: "allowed" }, "Allowed only"));
  if (params.get("refused")) outcome.value = "refused";
  const status = el("div", { id: "verify", class: "banner warn", role: "status" }, "Verifying the log…");
  const tbody = el("tbody");
  const count = el("span", { class: "muted", id: "count" });
  const msg = el("p", { class: "error", role: "alert" });
  view.replaceChildren(
    el("h1", {}, "Timeline of ", el("span", { class: "mono" }, name), " ",
      el("a", { href: "#/profile/" + q, class: "muted" }, "profile")),
    status, msg,
    el("div", { class: "filters" },
      el("label", {}, "Channel ", chan), el("label", {}, "Outcome ", outcome), count),
    el("table", { id: "timeline" },
      el("thead", {}, el("tr", {}, ["#", "Time", "Kind", "What", "Rule"].map((h) => el("th", { scope: "col" }, h)))),
      tbody));
  const records = [];
  let firstBad = -1;
  let verified = 0; // records 0..verified-1 were under the last verification
  const rows = new Map(); // seq -> tr
  const apply = () => {
    let shown = 0;
    for (const r of records) {
      const tr = rows.get(r.seq);
      const ok = (chan.value === "all" || channelOf(r.kind) === chan.value) &&
        (outcome.value === "all" || (outcome.value === "refused") === isRefusal(r));
      tr.hidden = !ok;
      tr.classList.toggle("tampered", r.seq === firstBad);
      // From the first bad record on nothing is trusted; records newer
      // than the last verification are not yet checked.
      tr.classList.toggle("untrusted", firstBad >= 0 && r.seq > firstBad);
      tr.classList.toggle("unverified", firstBad < 0 && r.seq >= verified);
      tr.title = r.seq === firstBad ? "verification fails here" : firstBad >= 0 && r.seq > firstBad ? "after the first bad record: not trusted" :
        firstBad < 0 && r.seq >= verified ? "newer than the last verification; checking" : "";
      if (ok) shown++;
    }
    const unchecked = firstBad < 0 ? records.filter((r) => r.seq >= verified).length : 0;
    count.textContent = shown + " of " + records.length + " records" +
      (unchecked ? " · " + unchecked + " newer than the verification above (marked ·), checking" : "");
  };
  chan.addEventListener("change", apply);
  outcome.addEventListener("change", apply);
  const add = (r) => {
    if (rows.has(r.seq)) return;
    const refused = isRefusal(r);
    const f = r.fields || {};
    const req = refused ? explainRequest(r) : "";
    const tr = el("tr", { "data-seq": r.seq, "data-kind": r.kind, class: refused ? "refused" : "" },
      el("td", { class: "mono" }, r.seq),
      el("td", { class: "mono nowrap", title: r.time }, new Date(r.time).toLocaleTimeString([], { hour12: false })),
      el("td", { class: "kind mono" }, r.kind),
      el("td", {}, el("details", {}, el("summary", {}, summary(r)), el("pre", {}, JSON.stringify(f, null, 2)))),
      el("td", {},
        f.rule ? el("div", { class: "rule" }, f.rule) : null,
        Array.isArray(f.refs) ? f.refs.filter((x) => x.rule).map((x) => el("div", { class: "rule" }, x.ref + ": " + x.rule +
          (x.reason ? " — " + x.reason : ""))) : null,
        refused && f.reason ? el("div", { class: "muted" }, f.reason) : null,
        refused && f.profile ? el("div", { class: "muted" }, "profile " + f.profile) : null,
        req ? el("a", { href: "#/profile/" + q + "?req=" + encodeURIComponent(req), class: "explain" }, "Explain") : null));
    rows.set(r.seq, tr);
    records.push(r);
    tbody.append(tr);
  };
  const verify = async () => {
    try {
      const v = await api("GET", "/v1/sandboxes/" + q + "/logs/verify");
      showVerify(status, v);
      firstBad = v.ok ? -1 : v.first_bad;
      verified = v.records;
      apply();
    } catch (e) {
      status.className = "banner bad";
      status.textContent = "Could not verify the log: " + e.message;
    }
  };
  const reverify = debounce(verify, 700);
  stopPage = () => ctl.abort();
  await verify();
  let batch = 0;
  const flush = debounce(() => { apply(); batch = 0; }, 100);
  try {
    setLive("live");
    await stream("/v1/sandboxes/" + q + "/logs?follow=true", ctl.signal, (r) => {
      add(r);
      batch++;
      flush();
      reverify();
    });
  } catch (e) {
    if (!ctl.signal.aborted) msg.textContent = "Log stream: " + e.message;
  }
}

function showVerify(box, v) {
  const kids = [];
  if (v.ok) {
    box.className = "banner ok";
    kids.push(el("strong", {}, "Verified: "),
      v.records + " records, hash chain intact, " + v.checkpoints + " signed checkpoint" + (v.checkpoints === 1 ? "" : "s") +
      (v.uncovered ? ", " + v.uncovered + " newest records not yet under a checkpoint" : ", every record covered") +
      (v.closed ? ", log closed" : ", log open"));
  } else {
    box.className = "banner bad";
    kids.push(el("strong", {}, "Verification FAILED"),
      v.first_bad >= 0 ? " at record " + v.first_bad : "", ": what this page shows from there on cannot be trusted.");
    if (v.problems && v.problems.length) kids.push(el("ul", {}, v.problems.map((p) => el("li", {}, p))));
  }
  const notes = v.notes || [];
  const key = {
    pinned: "the key pinned for this machine",
    unpinned: "this state directory's own key, not pinned (run smx logs export-key to pin it)",
    replaced: "NOT the pinned key: it was replaced; checked against the pin",
    given: "a key given for this check",
  }[v.key] || "unknown";
  kids.push(el("div", { class: "muted", id: "verify-key", "data-key": v.key || "" }, "Signing key: " + key + " · log " + (v.log_id || "")));
  if (notes.length) kids.push(el("ul", {}, notes.map((n) => el("li", {}, n))));
  box.replaceChildren(...kids);
}

// ---- Profile and explain --------------------------------------------

const kinds = {
  url: { label: "URL", fields: [["url", "https://api.example.com/v1"]], build: (v) => v.url },
  tcp: { label: "TCP host:port", fields: [["host", "10.0.0.5"], ["port", "5432"]], build: (v) => "tcp:" + v.host + ":" + v.port },
  udp: { label: "UDP host:port", fields: [["host", "1.1.1.1"], ["port", "53"]], build: (v) => "udp:" + v.host + ":" + v.port },
  file: { label: "File path", fields: [["mode", "rw or ro"], ["path", "/work/app/.env"]], build: (v) => "file:" + (v.mode || "rw") + ":" + v.path },
  git: { label: "Git repo and ref", fields: [["access", "read, push, delete, force-push"], ["repo", "github.com/acme/app"], ["ref", "refs/heads/main"]],
    build: (v) => "git:" + (v.access || "read") + ":" + v.repo + (v.ref ? ":" + v.ref : "") },
  ssh: { label: "SSH target", fields: [["target", "deploy@build1:22"]], build: (v) => "ssh:" + v.target },
};

async function profilePage(name) {
  const q = encodeURIComponent(name);
  const params = hashParams();
  const msg = el("p", { class: "error", role: "alert" });
  const kind = el("select", { id: "explain-kind" }, Object.entries(kinds).map(([k, d]) => el("option", { value: k }, d.label)));
  const fieldsBox = el("div", { class: "form", id: "explain-fields" });
  const request = el("input", { id: "explain-request", size: 60, "aria-describedby": "request-hint" });
  const result = el("div", { id: "explain-result", role: "status", "aria-live": "polite" });
  const inputs = {};
  const compose = () => {
    const v = {};
    for (const [k, i] of Object.entries(inputs)) v[k] = i.value.trim();
    request.value = kinds[kind.value].build(v);
  };
  const showFields = () => {
    for (const k of Object.keys(inputs)) delete inputs[k];
    fieldsBox.replaceChildren(...kinds[kind.value].fields.flatMap(([f, ph]) => {
      const i = el("input", { id: "explain-" + f, placeholder: ph, oninput: compose });
      inputs[f] = i;
      return [el("label", { for: "explain-" + f }, f), i];
    }));
  };
  kind.addEventListener("change", () => { showFields(); compose(); });
  showFields();
  const form = el("form", { id: "explain", onsubmit: async (ev) => {
    ev.preventDefault();
    result.replaceChildren();
    try {
      const x = await api("POST", "/v1/sandboxes/" + q + "/explain", { request: request.value });
      result.replaceChildren(
        el("p", { class: "decision " + (x.allow ? "allow" : "deny") }, (x.allow ? "allow " : "deny ") + x.request),
        el("p", {}, "rule ", el("span", { class: "rule", id: "explain-rule" }, x.rule)),
        showRule(yaml, x.rule) ? el("p", { class: "muted" }, "Marked in the frozen profile below.") : null,
        el("p", { class: "muted" }, x.reason));
    } catch (e) {
      result.replaceChildren(el("p", { class: "error" }, e.message));
    }
  } },
  el("div", { class: "form" }, el("label", { for: "explain-kind" }, "Kind"), kind), fieldsBox,
  el("div", { class: "form" }, el("label", { for: "explain-request" }, "Request"), request),
  el("p", { class: "muted", id: "request-hint" }, "The request as smx profile explain takes it; the fields above fill it in."),
  el("button", { type: "submit" }, "Explain"));
  const yaml = el("pre", { id: "profile-yaml", tabindex: "0", "aria-label": "Frozen profile" }, "loading…");
  const meta = el("p", { class: "muted" });
  view.replaceChildren(
    el("h1", {}, "Profile of ", el("span", { class: "mono" }, name), " ", el("a", { href: "#/sandbox/" + q, class: "muted" }, "timeline")),
    msg, el("h2", {}, "Explain a request"), form, result, el("h2", {}, "Frozen profile"), meta, yaml);
  stopPage = () => {};
  try {
    const p = await api("GET", "/v1/sandboxes/" + q + "/profile");
    meta.textContent = p.name + " from " + p.source + " · " + p.hash;
    yaml.replaceChildren(...p.yaml.split("\n").map((l) => el("span", { class: "line" }, l + "\n")));
  } catch (e) {
    yaml.textContent = "";
    msg.textContent = "Could not read the profile: " + e.message;
  }
  if (params.get("req")) {
    request.value = params.get("req");
    form.requestSubmit();
  }
}

// showRule marks, in the frozen profile, the rule a decision cites: the
// frozen copy notes each rule's origin as "# @ FILE:LINE:COL".
function showRule(yaml, rule) {
  for (const l of yaml.querySelectorAll(".hit")) l.classList.remove("hit");
  const m = /^(\S+:\d+:\d+) /.exec(rule || "");
  if (!m) return false;
  const lines = [...yaml.querySelectorAll(".line")];
  const i = lines.findIndex((l) => l.textContent.includes("@ " + m[1] + " ") || l.textContent.trimEnd().endsWith("@ " + m[1]));
  if (i < 0) return false;
  const indent = (s) => s.length - s.trimStart().length;
  const base = indent(lines[i].textContent);
  lines[i].classList.add("hit");
  const inline = !lines[i].textContent.trimStart().startsWith("#");
  for (let j = i + 1; !inline && j < lines.length; j++) {
    const t = lines[j].textContent;
    if (t.trim() === "" || t.includes("# @") || indent(t) < base) break;
    if (indent(t) === base && !t.trimStart().startsWith("- ") && j > i + 1) break;
    if (j > i + 1 && t.trimStart().startsWith("- ")) break;
    lines[j].classList.add("hit");
  }
  lines[i].scrollIntoView({ block: "center" });
  return true;
}

// ---- Questions -------------------------------------------------------

let lastAnswer = null; // the Questions page's note of the last answer

const answers = [
  ["deny", "Deny"], ["once", "Allow once"], ["sandbox", "Allow for this sandbox"], ["always", "Always allow"],
];

async function questionsPage() {
  const list = el("div", { id: "questions" });
  const msg = el("p", { class: "error", role: "alert" });
  const boxes = new Map(); // question id -> its box
  lastAnswer = el("div", { id: "last-answer", role: "status", "aria-live": "polite" });
  view.replaceChildren(el("h1", {}, "Questions"), msg, lastAnswer, list);
  const refresh = debounce(async () => {
    let l;
    try {
      l = await updateQuestionCount();
    } catch (e) {
      msg.textContent = e.message;
      return;
    }
    if (l === null) {
      list.replaceChildren(el("p", { class: "muted" }, "This smx serves no approvals: questions appear here once profiles have ask rules and the server supports them."));
      return;
    }
    const pending = l.filter((a) => !a.state || a.state === "pending");
    if (pending.length === 0) {
      boxes.clear();
      list.replaceChildren(el("p", { class: "muted" }, "No questions are waiting."));
      return;
    }
    // Keep the box of a question still pending as it is (an open
    // confirmation, the focus); add new ones, drop answered ones.
    const ids = new Set(pending.map((a) => String(a.id)));
    for (const [id, box] of [...boxes]) {
      if (!ids.has(id)) {
        box.remove();
        boxes.delete(id);
      }
    }
    for (const c of [...list.children]) if (!c.classList.contains("question")) c.remove();
    for (const a of pending) {
      const id = String(a.id);
      if (!boxes.has(id)) {
        boxes.set(id, question(a, msg, refresh));
        list.append(boxes.get(id)); // oldest first, as the server lists them
      }
    }
  }, 150);
  const ctl = new AbortController();
  refresh();
  const poll = setInterval(refresh, 2000);
  watchEvents(ctl.signal, refresh);
  stopPage = () => { ctl.abort(); clearInterval(poll); };
}

function question(a, msg, refresh) {
  const box = el("section", { class: "question", "data-id": a.id, "aria-label": "Question from " + a.sandbox });
  const send = async (decision) => {
    msg.textContent = "";
    for (const b of box.querySelectorAll("button")) b.disabled = true;
    try {
      const r = await api("POST", "/v1/approvals/" + encodeURIComponent(a.id), { decision });
      box.remove(); // answered: gone at once, whatever the next listing says
      // The server answers with the approval as decided; for always, the
      // rule it wrote and where.
      lastAnswer.replaceChildren(...[el("p", {}, "Answered " + ((r && r.decision) || decision) + ": " + a.sandbox + " " + a.what),
        r && r.rule_written ? el("p", {}, "Wrote to " + (r.profile_file || "the profile") + ":") : null,
        r && r.rule_written ? el("pre", { id: "rule-written" }, r.rule_written) : null].filter(Boolean));
    } catch (e) {
      msg.textContent = "Answer to " + a.sandbox + ": " + e.message;
      for (const b of box.querySelectorAll("button")) b.disabled = false;
    }
    refresh();
  };
  const file = el("code", {}, "the sandbox's profile file");
  const confirm = el("div", { class: "banner warn confirm", hidden: true },
    el("p", {}, "Always allowing writes a rule into ", file, " that allows ", el("strong", { class: "mono" }, a.what),
      ", reloads the sandbox's profile, and lets this request through. The exact rule is shown once written."),
    el("p", { class: "muted" }, "It takes the place of asking under ", el("span", { class: "rule" }, a.rule || ""),
      a.source ? " (" + a.source + ")" : "", "."),
    el("button", { "data-decision": "always-confirm", onclick: () => send("always") }, "Write the rule and allow"),
    el("button", { onclick: () => { confirm.hidden = true; delete box.dataset.confirm; } }, "Cancel"));
  const showConfirm = async () => {
    confirm.hidden = false;
    box.dataset.confirm = "1";
    try {
      const p = await api("GET", "/v1/sandboxes/" + encodeURIComponent(a.sandbox) + "/profile");
      file.textContent = p.source;
    } catch (e) { /* the sentence stays general */ }
  };
  box.append(
    el("p", {}, el("a", { href: "#/sandbox/" + encodeURIComponent(a.sandbox) }, a.sandbox), " asks: ",
      el("strong", { class: "mono what" }, a.what), " ", el("span", { class: "badge" }, a.channel)),
    el("p", { class: "muted" }, "rule ", el("span", { class: "rule" }, a.rule || ""), a.source ? " at " + a.source : "",
      a.expires ? " · refused at " + new Date(a.expires).toLocaleTimeString([], { hour12: false }) + " unless answered" : ""),
    el("div", {}, answers.map(([d, label]) => el("button", {
      "data-decision": d, class: d === "deny" ? "danger" : "",
      onclick: () => (d === "always" ? showConfirm() : send(d)),
    }, label))),
    confirm);
  return box;
}

// ---- Routing ---------------------------------------------------------

function route() {
  stopPage();
  stopPage = () => {};
  const h = location.hash.replace(/\?.*$/, "");
  let m;
  for (const a of document.querySelectorAll("nav a")) a.removeAttribute("aria-current");
  if ((m = h.match(/^#\/sandbox\/(.+)$/))) timelinePage(decodeURIComponent(m[1]));
  else if ((m = h.match(/^#\/profile\/(.+)$/))) profilePage(decodeURIComponent(m[1]));
  else if (h === "#/questions") {
    document.getElementById("nav-questions").setAttribute("aria-current", "page");
    questionsPage();
  } else {
    document.getElementById("nav-sandboxes").setAttribute("aria-current", "page");
    sandboxesPage();
  }
  view.focus({ preventScroll: true });
}

window.addEventListener("hashchange", route);
route();
updateQuestionCount();
