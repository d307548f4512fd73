// Switchboard console: reads over POST /rpc (bearer token), follows GET /events (SSE).
// Plain browser JavaScript, no build step. Every value from the api is shown with
// textContent, never parsed as HTML.
"use strict";

const TOKEN_KEY = "switchboard.token"; // where older consoles kept the token: cleared
// The console session (from POST /console/login; derived from the token, expiring).
const SESSION_KEY = "switchboard.session";
const TREE_DEPTH = 3;
// Sessions fetched per listing (newest first; narrower filters reach older ones) and shown
// per page: the table stays a few dozen rows however many sessions Redis holds.
const FETCH_LIMIT = 1000;
const PAGE_SIZE = 50;
const DELIVERIES_LIMIT = 200;
const TICK_MS = 5000;
const BATCHES_SHOWN = 20; // the newest batches listed, their progress refreshed every few seconds
const BATCHES_EVERY_MS = 2000;
// The URL hash carries the whole view: these filter fields, the page, the open session.
const FILTERS = { kind: "filter-kind", agent: "filter-agent", active: "filter-active",
  search: "filter-search" };
const state = {
  token: null, current: null, rows: new Map(), flowIds: new Set(), source: null,
  pendingRun: null, ended: new Map(), // runId → status of recently ended runs
  listed: [], page: 0, listedFor: null, // the fetched sessions, the page shown, their filters
};

const $ = (id) => document.getElementById(id);

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (name === "class") node.className = value;
    else if (name === "text") node.textContent = value;
    else if (name.startsWith("on")) node.addEventListener(name.slice(2), value);
    else node.setAttribute(name, value === true ? "" : String(value));
  }
  for (const child of children.flat()) {
    if (child === undefined || child === null || child === false) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

function badge(status) {
  const text = status || "—";
  return el("span", { class: `badge status-${text}`, text });
}

// A run's stored status as its run-ledger state: queued, running (parked included),
// succeeded, failed, timed_out, cancelled, lost. Sessions and run events show this.
const LEDGER_STATES = { queued: "queued", running: "running", parked: "running", ok: "succeeded",
  error: "failed", timeout: "timed_out", cancelled: "cancelled", lost: "lost" };

function ledgerState(status) {
  return LEDGER_STATES[status] || status;
}

function runBadge(status) {
  const node = badge(ledgerState(status));
  if (status && ledgerState(status) !== status) node.title = `stored status: ${status}`;
  return node;
}

// A spawned child's completion delivery (OpenClaw 2026.9.6's vocabulary: pending, delivered,
// session_queued, failed, dismissed, parent_missing, not_applicable); nothing for a root.
function deliveryBadge(status) {
  if (!status) return null;
  const node = badge(status);
  node.classList.add("delivery");
  node.title = `completion delivery: ${status}`;
  return node;
}

// Short enough for a narrow column at any age: "12s ago" … "9d ago", then the date alone.
function when(ms) {
  if (!ms) return "";
  const date = new Date(Number(ms));
  const age = (Date.now() - date.getTime()) / 1000;
  if (age < 60) return `${Math.max(0, Math.floor(age))}s ago`;
  if (age < 3600) return `${Math.floor(age / 60)}m ago`;
  if (age < 86400) return `${Math.floor(age / 3600)}h ago`;
  if (age < 864000) return `${Math.floor(age / 86400)}d ago`;
  return date.toLocaleDateString();
}

// A relative time that keeps ticking (see tickTimes); the exact time is its tooltip.
function ago(ms) {
  if (!ms) return "";
  const date = new Date(Number(ms));
  return el("time", { class: "ago", "data-ms": Number(ms), datetime: date.toISOString(),
    title: date.toLocaleString(), text: when(ms) });
}

function tickTimes() {
  for (const node of document.querySelectorAll("time.ago[data-ms]")) {
    const text = when(node.dataset.ms);
    if (node.textContent !== text) node.textContent = text;
  }
}

// One line of a long value; a click shows all of it and copies it.
function trunc(text, attrs = {}) {
  const full = String(text ?? "");
  return el("span", { ...attrs, class: `trunc ${attrs.class || ""}`.trim(), title: full,
    text: full, onclick: (event) => {
      event.stopPropagation();
      event.currentTarget.classList.toggle("open");
      copy(full);
    } });
}

// Text that, cut, loses its start rather than its end (…e4f20780ff17).
function endFirst(text, attrs = {}) {
  return el("span", { ...attrs, class: `end-first ${attrs.class || ""}`.trim() },
    el("bdi", { text }));
}

// A session key on one line that keeps its distinctive end: when space runs short the start
// gives way (agent:main:disc…:release-planning) before the last segment does, and that one
// loses its own start last. The page holds the whole key: it is the tooltip, and copying any
// part of it copies all of it (copyKeys).
function keyText(key, attrs = {}) {
  const full = String(key ?? "");
  const cut = full.lastIndexOf(":");
  return el("span", { ...attrs, class: `mkey mono ${attrs.class || ""}`.trim(), title: full,
    "data-full": full },
  cut > 0 ? el("span", { class: "mkey-head", text: full.slice(0, cut) }) : null,
  endFirst(cut > 0 ? full.slice(cut) : full, { class: "mkey-tail" }));
}

function lastSegment(key) {
  return String(key ?? "").split(":").pop();
}

// A selection inside one key (its drawn end, say) copies the whole key.
function copyKeys(event) {
  const selection = getSelection();
  if (!selection || selection.isCollapsed) return;
  const inKey = (node) => (node instanceof Element ? node : node?.parentElement)?.closest(".mkey");
  const box = inKey(selection.anchorNode);
  if (!box || box !== inKey(selection.focusNode)) return;
  event.clipboardData.setData("text/plain", box.dataset.full);
  event.preventDefault();
}

function copy(text) {
  if (navigator.clipboard) navigator.clipboard.writeText(text).catch(() => { /* shown anyway */ });
}

function short(text, limit = 140) {
  const flat = String(text ?? "").replace(/\s+/g, " ").trim();
  return flat.length > limit ? `${flat.slice(0, limit - 1)}…` : flat;
}

function toast(message) {
  const box = $("toast");
  box.textContent = message;
  box.hidden = false;
  clearTimeout(toast.timer);
  toast.timer = setTimeout(() => { box.hidden = true; }, 6000);
}

// At most one call per `ms`, however many events ask for it (never starved by a busy stream).
function coalesce(fn, ms) {
  let timer = null;
  return () => {
    if (timer === null) timer = setTimeout(() => { timer = null; fn(); }, ms);
  };
}

// ---- api -------------------------------------------------------------------------------

class AuthError extends Error {}

async function rpc(method, params = {}, token = state.token) {
  const resp = await fetch("/rpc", {
    method: "POST",
    headers: { "Content-Type": "application/json", Authorization: `Bearer ${token}` },
    body: JSON.stringify({ method, params }),
  });
  const body = await resp.json().catch(() => ({}));
  if (resp.status === 401 || resp.status === 429) {
    throw new AuthError(body?.error?.message || "token rejected");
  }
  if (!resp.ok) throw new Error(`${method}: ${body?.error?.message || resp.statusText}`);
  return body;
}

async function getJson(path, token = state.token) {
  const resp = await fetch(path, { headers: { Authorization: `Bearer ${token}` } });
  const body = await resp.json().catch(() => ({}));
  if (resp.status === 401 || resp.status === 429) {
    throw new AuthError(body?.error?.message || "token rejected");
  }
  if (!resp.ok) throw new Error(`${path}: ${body?.error?.message || resp.statusText}`);
  return body;
}

async function post(path, token = state.token) {
  const resp = await fetch(path, { method: "POST", headers: { Authorization: `Bearer ${token}` } });
  if (!resp.ok) throw new AuthError("token rejected");
  return resp.json().catch(() => ({}));
}

// ---- login -----------------------------------------------------------------------------

function showLogin(message) {
  state.token = null;
  if (state.source) state.source.close();
  state.source = null;
  $("app").hidden = true;
  $("logout").hidden = true;
  $("login").hidden = false;
  $("login-error").textContent = message || "";
  setLive("off", "offline");
  $("token").focus();
}

// Trade the token (or a saved session) for a console session; only the session is kept.
async function start(credential) {
  await rpc("sessions.list", { limit: 1 }, credential);
  const answer = await post("/console/login", credential);
  const session = answer.session || credential;
  state.token = session;
  localStorage.removeItem(TOKEN_KEY);
  localStorage.setItem(SESSION_KEY, session);
  $("login").hidden = true;
  $("app").hidden = false;
  $("logout").hidden = false;
  connectEvents();
  await applyRoute();
  await loadBatches();
}

async function login(event) {
  event.preventDefault();
  const token = $("token").value.trim();
  if (!token) return;
  try {
    await start(token);
    $("token").value = "";
  } catch (err) {
    showLogin(err instanceof AuthError ? `Sign-in failed: ${err.message}` : String(err));
  }
}

async function logout() {
  try { await post("/console/logout"); } catch { /* the cookie expires anyway */ }
  localStorage.removeItem(SESSION_KEY);
  showLogin("Signed out.");
}

function guard(fn) {
  return async (...args) => {
    try {
      return await fn(...args);
    } catch (err) {
      if (err instanceof AuthError) {
        localStorage.removeItem(SESSION_KEY);
        showLogin(`Signed out: ${err.message}`);
      } else {
        toast(err.message || String(err));
      }
    }
  };
}

// ---- sessions table --------------------------------------------------------------------

// ---- the URL is the state ------------------------------------------------------------

function filterValues() {
  const values = {};
  for (const [name, id] of Object.entries(FILTERS)) values[name] = $(id).value.trim();
  return values;
}

function routeHash(route) {
  const query = new URLSearchParams();
  if (route.session) query.set("session", route.session);
  for (const name of Object.keys(FILTERS)) if (route[name]) query.set(name, route[name]);
  if (route.page > 0) query.set("page", String(route.page + 1));
  const text = query.toString();
  return text ? `#${text}` : "";
}

function readRoute() {
  const query = new URLSearchParams(location.hash.slice(1));
  const route = { session: query.get("session") || null,
    page: Math.max(0, (parseInt(query.get("page"), 10) || 1) - 1) };
  for (const name of Object.keys(FILTERS)) route[name] = query.get(name) || "";
  return route;
}

// Record what the page shows as a new history entry (back returns to the previous one).
function pushRoute() {
  setHash(routeHash({ ...filterValues(), session: state.current, page: state.page }), true);
}

function setHash(hash, push) {
  if (hash !== location.hash) {
    const url = hash || location.pathname;
    if (push) history.pushState(null, "", url);
    else history.replaceState(null, "", url);
  }
  state.appliedHash = location.hash;
}

// Show what the URL says: on load, on back/forward, on a pasted or edited link.
// A newer URL change overtakes one still loading: only the newest route is drawn.
const applyRoute = guard(async () => {
  state.appliedHash = location.hash;
  const seq = (state.routeSeq = (state.routeSeq || 0) + 1);
  const route = readRoute();
  for (const [name, id] of Object.entries(FILTERS)) $(id).value = route[name];
  const filters = JSON.stringify(filterValues());
  if (state.listedFor !== filters) await fetchSessions();
  if (seq !== state.routeSeq) return;
  state.page = route.page;
  renderSessions();
  if (route.session && route.session !== state.current) await openSession(route.session, false);
  else if (!route.session) closeSession();
});

// Back/forward fire popstate, an edited hash fires both it and hashchange: apply once.
function onUrlChange() {
  if (state.token && location.hash !== state.appliedHash) applyRoute();
}

// ---- sessions table --------------------------------------------------------------------

function filterParams() {
  const params = { limit: FETCH_LIMIT };
  const { kind, agent, search } = filterValues();
  const active = parseInt($("filter-active").value, 10);
  if (kind) params.kinds = [kind];
  if (agent) params.agentId = agent;
  if (active > 0) params.activeMinutes = active;
  if (search) params.search = search;
  return params;
}

async function fetchSessions() {
  const filters = JSON.stringify(filterValues());
  const result = await rpc("sessions.list", filterParams());
  state.listed = result.sessions;
  state.listedFor = filters;
  for (const row of result.sessions) state.rows.set(row.key, row);
}

function sessionRowView(row) {
  const label = row.label || row.displayName;
  return el("tr", {
    "data-key": row.key,
    class: row.key === state.current ? "selected" : null,
    // A click that ends a text selection (a key being copied) does not open the session.
    onclick: () => { if (getSelection().isCollapsed) openSession(row.key); },
  },
  el("td", { class: "grow" }, keyText(row.key, { class: "session-key" }),
    label ? el("div", { class: "muted trunc", title: label, text: label }) : null),
  el("td", { class: "snug" }, row.kind, el("div", { class: "muted", text: row.channel || "" })),
  el("td", { class: "snug" }, runBadge(row.status)),
  el("td", { class: "snug" }, ago(row.updatedAt)));
}

function renderSessions() {
  const total = state.listed.length;
  const pages = Math.max(1, Math.ceil(total / PAGE_SIZE));
  state.page = Math.min(Math.max(0, state.page), pages - 1);
  const first = state.page * PAGE_SIZE;
  const shown = state.listed.slice(first, first + PAGE_SIZE);
  $("sessions").tBodies[0].replaceChildren(...shown.map(sessionRowView));
  const more = total >= FETCH_LIMIT ? ` (the newest ${FETCH_LIMIT}: filter to reach older)` : "";
  $("sessions-count").textContent = total
    ? `${first + 1}–${first + shown.length} of ${total} session(s)${more} · page ${state.page + 1}/${pages}`
    : "0 session(s)";
  $("page-prev").disabled = state.page === 0;
  $("page-next").disabled = state.page >= pages - 1;
}

const loadSessions = guard(async () => {
  await fetchSessions();
  renderSessions();
});

const applyFilters = guard(async () => {
  state.page = 0;
  await loadSessions();
  pushRoute();
});

function turnPage(delta) {
  state.page += delta;
  renderSessions();
  $("sessions").parentElement.scrollTop = 0;
  pushRoute();
}

// ---- batches (the Batches API) ----------------------------------------------------------

function batchRowView(batch) {
  const counts = batch.request_counts || { completed: 0, failed: 0, total: 0 };
  const answered = counts.completed + counts.failed;
  const failed = counts.failed ? `, ${counts.failed} failed` : "";
  return el("tr", { "data-batch": batch.id },
    el("td", {}, el("span", { class: "mono trunc", title: batch.id, text: batch.id }),
      el("div", { class: "muted trunc", text: batch.endpoint })),
    el("td", { class: "nowrap" }, badge(batch.status)),
    el("td", { class: "nowrap" },
      el("progress", { max: Math.max(1, counts.total), value: answered }),
      el("div", { class: "muted", text: `${answered}/${counts.total}${failed}` })),
    el("td", { class: "nowrap" }, ago(batch.created_at * 1000)));
}

const loadBatches = guard(async () => {
  const page = await getJson(`/v1/batches?limit=${BATCHES_SHOWN}`);
  $("batches").tBodies[0].replaceChildren(...page.data.map(batchRowView));
  $("batches-count").textContent = page.data.length ? "" : "No batches yet.";
});

// ---- one session -----------------------------------------------------------------------

async function sessionRow(key) {
  if (state.rows.has(key)) return state.rows.get(key);
  const found = await rpc("sessions.list", { search: key, limit: 20 });
  const row = found.sessions.find((r) => r.key === key);
  if (row) state.rows.set(key, row);
  return row || { key };
}

const openSession = guard(async (ref, push = true) => {
  const { key } = await rpc("sessions.resolve", { key: ref });
  state.current = key;
  if (push) pushRoute();
  else setHash(routeHash({ ...readRoute(), session: key }), false);
  for (const tr of $("sessions").tBodies[0].rows) {
    tr.classList.toggle("selected", tr.dataset.key === key);
  }
  $("detail").hidden = false;
  $("empty").hidden = true;
  $("send-status").textContent = "";
  await loadDetail();
});

function closeSession() {
  state.current = null;
  for (const tr of $("sessions").tBodies[0].rows) tr.classList.remove("selected");
  $("detail").hidden = true;
  $("empty").hidden = false;
}

const loadDetail = guard(async () => {
  const key = state.current;
  if (!key) return;
  const [row, chat, flows, deliveries] = await Promise.all([
    sessionRow(key),
    rpc("chat.history", { sessionKey: key, limit: 200 }),
    rpc("flows.list", { sessionKey: key, limit: 20 }),
    rpc("deliveries.list", { sessionKey: key, limit: DELIVERIES_LIMIT }),
  ]);
  if (key !== state.current) return;
  renderMeta(row);
  renderTranscript(chat.messages);
  renderFlows(flows.flows);
  renderDeliveries(deliveries.deliveries);
  await renderTree(row);
});

function renderMeta(row) {
  $("detail-title").textContent = row.key;
  const meta = $("detail-meta");
  meta.replaceChildren();
  const fields = [
    ["kind", row.kind], ["channel", row.channel], ["state", row.status && ledgerState(row.status)],
    ["label", row.label], ["model", row.model], ["sessionId", row.sessionId],
    ["tokens", row.totalTokens], ["updated", ago(row.updatedAt)],
  ];
  for (const [name, value] of fields) {
    if (value === undefined || value === null || value === "") continue;
    meta.append(el("dt", { text: name }), el("dd", {}, value instanceof Node ? value : String(value)));
  }
}

function blocksOf(content) {
  if (typeof content === "string") return [{ type: "text", text: content }];
  return Array.isArray(content) ? content : [];
}

function renderTranscript(messages) {
  const list = $("transcript");
  const atBottom = list.scrollTop + list.clientHeight >= list.scrollHeight - 20;
  list.replaceChildren();
  for (const msg of messages) {
    const prov = msg.provenance || {};
    const inter = prov.kind === "inter_session";
    const head = el("div", { class: "msg-head" },
      el("strong", { text: msg.role }),
      msg.toolName ? el("span", { class: "mono", text: msg.toolName }) : null,
      msg.model ? el("span", { text: msg.model }) : null,
      el("span", {}, ago(msg.timestamp)));
    if (inter) {
      const from = prov.sourceSessionKey || "another session";
      const via = prov.sourceTool ? ` via ${prov.sourceTool}` : "";
      // Text around the key keeps its spaces for copy and tests; the flex gap draws them.
      head.append(el("span", {
        class: "badge provenance",
        "data-source": prov.sourceSessionKey || "",
        title: "inter-session message: routed from another session, not typed by a person",
      }, "from ", prov.sourceSessionKey ? keyText(from) : from, via));
    } else if (prov.kind) {
      head.append(el("span", { class: "badge", text: prov.kind.replace("_", " ") }));
    }
    const body = el("div", { class: "msg-body" });
    for (const block of blocksOf(msg.content)) {
      if (block.type === "text") body.append(el("div", { text: block.text }));
      else if (block.type === "toolCall") {
        body.append(el("div", {
          class: "tool-call", text: `→ ${block.name}(${short(JSON.stringify(block.arguments), 300)})`,
        }));
      } else if (block.type === "thinking") {
        body.append(el("details", {}, el("summary", { text: "thinking" }),
          el("div", { text: block.thinking })));
      }
    }
    list.append(el("li", {
      class: `msg role-${msg.role}${inter ? " inter-session" : ""}`,
      "data-seq": msg.__openclaw?.seq,
    }, head, body));
  }
  if (atBottom || !list.dataset.key || list.dataset.key !== state.current) {
    list.scrollTop = list.scrollHeight;
  }
  list.dataset.key = state.current;
}

// A link that opens a session: its middle-cut key, or `text` (the whole key as tooltip).
function keyLink(key, text) {
  return el("a", { class: "key mono", href: `#session=${encodeURIComponent(key)}`,
    title: text ? key : null, onclick: (event) => { event.preventDefault(); openSession(key); } },
  text || keyText(key));
}

// Children shown per node of the tree (newest first); one more is asked to know if there are.
const TREE_WIDTH = 50;

async function childrenOf(key) {
  const result = await rpc("sessions.list", { spawnedBy: key, limit: TREE_WIDTH + 1 });
  return result.sessions;
}

async function subtree(row, depth) {
  // One line per node: the key's last segment (whole key on hover), the label, the state.
  const item = el("li", { class: row.key === state.current ? "current" : null, "data-key": row.key },
    el("div", { class: "node" }, keyLink(row.key, endFirst(lastSegment(row.key))), " ",
      row.label ? el("span", { class: "muted node-label", title: row.label, text: row.label }) : null,
      " ", runBadge(row.status), " ", deliveryBadge(row.deliveryStatus)));
  if (depth < TREE_DEPTH) {
    const kids = await childrenOf(row.key);
    if (kids.length) {
      const list = el("ul", {});
      for (const kid of kids.slice(0, TREE_WIDTH)) list.append(await subtree(kid, depth + 1));
      if (kids.length > TREE_WIDTH) {
        list.append(el("li", { class: "muted more", text: `… more: the newest ${TREE_WIDTH} shown` }));
      }
      item.append(list);
    }
  }
  return item;
}

async function renderTree(row) {
  const tree = $("tree");
  const root = el("ul", {}, await subtree(row, 0));
  const parts = [];
  if (row.spawnedBy) parts.push(el("p", { class: "spawned-by" }, "spawned by ", keyLink(row.spawnedBy)));
  parts.push(root);
  if (!root.querySelector("ul")) parts.push(el("p", { class: "muted", text: "no spawned sessions" }));
  tree.replaceChildren(...parts);
}

function renderFlows(flows) {
  const box = $("flows");
  state.flowIds = new Set(flows.map((f) => f.flowId));
  if (!flows.length) {
    box.replaceChildren(el("p", { class: "muted", text: "no reply-back flows" }));
    return;
  }
  box.replaceChildren(...flows.map((flow) => {
    const steps = el("ol", { class: "timeline" });
    steps.append(el("li", { class: "step-request" },
      el("strong", { text: "request " }),
      flow.requesterSessionKey ? keyLink(flow.requesterSessionKey) : "(no session)",
      " → ", keyLink(flow.targetSessionKey), el("div", { class: "muted", text: short(flow.message) })));
    for (const round of flow.rounds || []) {
      const title = round.turn === 0 ? "round 1 · target replies" : `round ${round.turn + 1} · ${round.speaker}`;
      steps.append(el("li", { class: "step-round", "data-turn": round.turn },
        el("strong", { text: `${title} ` }), badge(round.status),
        el("div", { class: "muted", text: short(round.reply ?? round.error ?? "") })));
    }
    if (flow.stopReason) steps.append(el("li", { class: "step-stop", text: `stopped: ${flow.stopReason}` }));
    const announce = flow.announce || {};
    steps.append(el("li", { class: "step-announce" },
      el("strong", { text: "announce " }), badge(announce.status),
      announce.reply ? el("div", { class: "muted", text: short(announce.reply) }) : null));
    if (announce.delivery) {
      const d = announce.delivery;
      steps.append(el("li", { class: "step-delivery" },
        el("strong", { text: `delivery to ${d.channel}${d.to ? `:${d.to}` : ""} ` }), badge(d.status),
        d.lastError ? el("div", { class: "muted", text: d.lastError }) : null));
    }
    return el("div", { class: "flow", "data-flow": flow.flowId },
      el("div", {}, el("span", { class: "mono", text: flow.flowId.slice(0, 8) }), " ",
        badge(flow.status), " ", el("span", { class: "muted" }, ago(flow.createdAt))),
      steps);
  }));
}

function renderDeliveries(rows) {
  const body = $("deliveries").tBodies[0];
  body.replaceChildren();
  if (!rows.length) {
    body.append(el("tr", {}, el("td", { colspan: 5, class: "muted", text: "no deliveries" })));
    $("deliveries-count").textContent = "";
    return;
  }
  for (const d of rows) {
    body.append(el("tr", { "data-delivery": d.deliveryId, "data-status": d.status },
      el("td", { class: "nowrap", text: d.channel, title: d.channel }),
      el("td", {}, trunc(d.to || "", { class: "mono" })),
      el("td", {}, badge(d.status), d.lastError ? trunc(d.lastError, { class: "muted" }) : null),
      el("td", { class: "nowrap", text: String(d.attempts ?? 0) }),
      el("td", {}, trunc(d.message, { class: "message" }))));
  }
  const more = rows.length >= DELIVERIES_LIMIT ? ` (the newest ${DELIVERIES_LIMIT})` : "";
  $("deliveries-count").textContent = `${rows.length} deliver${rows.length === 1 ? "y" : "ies"}${more}`;
}

const send = guard(async (event) => {
  event.preventDefault();
  const text = $("send-text").value.trim();
  if (!text || !state.current) return;
  const button = $("send-form").querySelector("button");
  button.disabled = true;
  try {
    const started = await rpc("chat.send", { sessionKey: state.current, message: text });
    $("send-text").value = "";
    $("send-status").textContent = started.runId
      ? `sent (run ${started.runId.slice(0, 8)}); the reply appears when the run ends`
      : short(started.reply || started.status);
    state.pendingRun = started.runId || null;
    // A fast run may have ended (and its event arrived) before this answer did.
    if (state.ended.has(state.pendingRun)) showReplied(state.ended.get(state.pendingRun));
  } finally {
    button.disabled = false;
  }
});

// ---- live updates ----------------------------------------------------------------------

function setLive(stateName, text) {
  $("live").dataset.state = stateName;
  $("live").textContent = text;
}

// A listing is up to FETCH_LIMIT rows: refetched at most every 1.5 s however busy the stream.
const refreshSessions = coalesce(() => loadSessions(), 1500);
const refreshDetail = coalesce(() => loadDetail(), 250);

function logEvent(type, data) {
  const log = $("event-log");
  const state = type.startsWith("run.") && data.status ? ledgerState(data.status) : data.status;
  const parts = [type, data.sessionKey, state].filter(Boolean).join(" · ");
  log.prepend(el("li", { "data-type": type, text: `${new Date().toLocaleTimeString()} ${parts}` }));
  while (log.children.length > 50) log.lastChild.remove();
}

function showReplied(status) {
  $("send-status").textContent = `reply received (${status})`;
  state.pendingRun = null;
}

function onEvent(type, data) {
  logEvent(type, data);
  refreshSessions();
  const mine = data.sessionKey === state.current || state.flowIds.has(data.flowId);
  if (mine || type === "delivery.settled") refreshDetail();
  if (type === "run.ended" && data.runId) {
    state.ended.set(data.runId, data.status);
    if (state.ended.size > 200) state.ended.delete(state.ended.keys().next().value);
    if (data.runId === state.pendingRun) showReplied(data.status);
  }
}

function connectEvents() {
  if (state.source) state.source.close();
  const source = new EventSource("/events");
  state.source = source;
  source.addEventListener("ready", () => setLive("on", "live"));
  for (const type of ["run.started", "run.parked", "run.ended", "delivery", "delivery.settled"]) {
    source.addEventListener(type, (event) => {
      let data = {};
      try { data = JSON.parse(event.data); } catch { /* keep {} */ }
      onEvent(type, data);
    });
  }
  source.onerror = () => {
    if (source.readyState === EventSource.CLOSED) {
      // Refused (cookie expired or missing): log in again, then reconnect.
      setLive("retry", "reconnecting");
      setTimeout(async () => {
        if (state.source !== source || !state.token) return;
        try {
          await post("/console/login");
          connectEvents();
        } catch {
          showLogin("Signed out: token rejected");
        }
      }, 2000);
    } else {
      setLive("retry", "reconnecting");
    }
  };
}

// ---- wiring ----------------------------------------------------------------------------

document.addEventListener("DOMContentLoaded", () => {
  $("login-form").addEventListener("submit", login);
  $("logout").addEventListener("click", logout);
  $("filters").addEventListener("submit", (event) => { event.preventDefault(); applyFilters(); });
  $("filter-kind").addEventListener("change", () => applyFilters());
  $("page-prev").addEventListener("click", () => turnPage(-1));
  $("page-next").addEventListener("click", () => turnPage(1));
  $("copy-key").addEventListener("click", () => copy(state.current || ""));
  $("close-detail").addEventListener("click", (event) => {
    event.preventDefault();
    closeSession();
    pushRoute();
  });
  window.addEventListener("popstate", onUrlChange);
  window.addEventListener("hashchange", onUrlChange);
  setInterval(tickTimes, TICK_MS);
  setInterval(() => { if (state.token && !$("app").hidden) loadBatches(); }, BATCHES_EVERY_MS);
  $("send-form").addEventListener("submit", send);
  document.addEventListener("copy", copyKeys);
  localStorage.removeItem(TOKEN_KEY);
  const saved = localStorage.getItem(SESSION_KEY);
  if (saved) {
    start(saved).catch((err) => showLogin(err instanceof AuthError ? "Sign in again." : String(err)));
  } else {
    showLogin("");
  }
});
