// Switchboard console: reads over POST /rpc (bearer token), follows GET /events (SSE).
// Plain browser JavaScript, no build step. Every value from the api is shown with
// textContent, never parsed as HTML.
"use strict";

const TOKEN_KEY = "switchboard.token";
const TREE_DEPTH = 3;
const state = {
  token: null, current: null, rows: new Map(), flowIds: new Set(), source: null,
  pendingRun: null, ended: new Map(), // runId → status of recently ended runs
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

function when(ms) {
  if (!ms) return "";
  const date = new Date(Number(ms));
  const age = (Date.now() - date.getTime()) / 1000;
  if (age < 60) return `${Math.max(0, Math.round(age))}s ago`;
  if (age < 3600) return `${Math.round(age / 60)}m ago`;
  return date.toLocaleString();
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

async function post(path, token = state.token) {
  const resp = await fetch(path, { method: "POST", headers: { Authorization: `Bearer ${token}` } });
  if (!resp.ok) throw new AuthError("token rejected");
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

async function start(token) {
  await rpc("sessions.list", { limit: 1 }, token);
  await post("/console/login", token);
  state.token = token;
  localStorage.setItem(TOKEN_KEY, token);
  $("login").hidden = true;
  $("app").hidden = false;
  $("logout").hidden = false;
  connectEvents();
  await loadSessions();
  const fromHash = new URLSearchParams(location.hash.slice(1)).get("session");
  if (fromHash) await openSession(fromHash);
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
  localStorage.removeItem(TOKEN_KEY);
  showLogin("Signed out.");
}

function guard(fn) {
  return async (...args) => {
    try {
      return await fn(...args);
    } catch (err) {
      if (err instanceof AuthError) {
        localStorage.removeItem(TOKEN_KEY);
        showLogin(`Signed out: ${err.message}`);
      } else {
        toast(err.message || String(err));
      }
    }
  };
}

// ---- sessions table --------------------------------------------------------------------

function filterParams() {
  const params = { limit: 200 };
  const kind = $("filter-kind").value;
  const agent = $("filter-agent").value.trim();
  const active = parseInt($("filter-active").value, 10);
  const search = $("filter-search").value.trim();
  if (kind) params.kinds = [kind];
  if (agent) params.agentId = agent;
  if (active > 0) params.activeMinutes = active;
  if (search) params.search = search;
  return params;
}

const loadSessions = guard(async () => {
  const result = await rpc("sessions.list", filterParams());
  const body = $("sessions").tBodies[0];
  body.replaceChildren();
  for (const row of result.sessions) {
    state.rows.set(row.key, row);
    const label = row.label || row.displayName;
    body.append(el("tr", {
      "data-key": row.key,
      class: row.key === state.current ? "selected" : null,
      onclick: () => openSession(row.key),
    },
    el("td", { class: "wrap" }, el("span", { class: "mono", text: row.key }),
      label ? el("div", { class: "muted", text: label }) : null),
    el("td", { class: "nowrap", text: row.kind }),
    el("td", { class: "nowrap", text: row.channel || "" }),
    el("td", { class: "nowrap" }, badge(row.status)),
    el("td", { class: "nowrap", text: when(row.updatedAt), title: String(row.updatedAt || "") })));
  }
  $("sessions-count").textContent = `${result.count} session(s)`;
});

// ---- one session -----------------------------------------------------------------------

async function sessionRow(key) {
  if (state.rows.has(key)) return state.rows.get(key);
  const found = await rpc("sessions.list", { search: key, limit: 20 });
  const row = found.sessions.find((r) => r.key === key);
  if (row) state.rows.set(key, row);
  return row || { key };
}

const openSession = guard(async (ref) => {
  const { key } = await rpc("sessions.resolve", { key: ref });
  state.current = key;
  history.replaceState(null, "", `#session=${encodeURIComponent(key)}`);
  for (const tr of $("sessions").tBodies[0].rows) {
    tr.classList.toggle("selected", tr.dataset.key === key);
  }
  $("detail").hidden = false;
  $("empty").hidden = true;
  $("send-status").textContent = "";
  await loadDetail();
});

const loadDetail = guard(async () => {
  const key = state.current;
  if (!key) return;
  const [row, chat, flows, deliveries] = await Promise.all([
    sessionRow(key),
    rpc("chat.history", { sessionKey: key, limit: 200 }),
    rpc("flows.list", { sessionKey: key, limit: 20 }),
    rpc("deliveries.list", { sessionKey: key, limit: 50 }),
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
    ["kind", row.kind], ["channel", row.channel], ["status", row.status],
    ["label", row.label], ["model", row.model], ["sessionId", row.sessionId],
    ["tokens", row.totalTokens], ["updated", when(row.updatedAt)],
  ];
  for (const [name, value] of fields) {
    if (value === undefined || value === null || value === "") continue;
    meta.append(el("dt", { text: name }), el("dd", { text: String(value) }));
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
      el("span", { text: when(msg.timestamp) }));
    if (inter) {
      const from = prov.sourceSessionKey || "another session";
      const via = prov.sourceTool ? ` via ${prov.sourceTool}` : "";
      head.append(el("span", {
        class: "badge provenance",
        "data-source": prov.sourceSessionKey || "",
        title: "inter-session message: routed from another session, not typed by a person",
        text: `from ${from}${via}`,
      }));
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

function keyLink(key, text) {
  return el("a", { class: "key mono", href: `#session=${encodeURIComponent(key)}`,
    onclick: (event) => { event.preventDefault(); openSession(key); }, text: text || key });
}

async function childrenOf(key) {
  const result = await rpc("sessions.list", { spawnedBy: key, limit: 50 });
  return result.sessions;
}

async function subtree(row, depth) {
  const item = el("li", { class: row.key === state.current ? "current" : null, "data-key": row.key },
    el("span", { class: "node-key" }, keyLink(row.key)), " ",
    row.label ? el("span", { class: "muted", text: row.label }) : null, " ",
    badge(row.status));
  if (depth < TREE_DEPTH) {
    const kids = await childrenOf(row.key);
    if (kids.length) {
      const list = el("ul", {});
      for (const kid of kids) list.append(await subtree(kid, depth + 1));
      item.append(list);
    }
  }
  return item;
}

async function renderTree(row) {
  const tree = $("tree");
  const root = el("ul", {}, await subtree(row, 0));
  const parts = [];
  if (row.spawnedBy) parts.push(el("p", {}, "spawned by ", keyLink(row.spawnedBy)));
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
        badge(flow.status), " ", el("span", { class: "muted", text: when(flow.createdAt) })),
      steps);
  }));
}

function renderDeliveries(rows) {
  const body = $("deliveries").tBodies[0];
  body.replaceChildren();
  if (!rows.length) {
    body.append(el("tr", {}, el("td", { colspan: 5, class: "muted", text: "no deliveries" })));
    return;
  }
  for (const d of rows) {
    body.append(el("tr", { "data-delivery": d.deliveryId, "data-status": d.status },
      el("td", { class: "nowrap", text: d.channel }),
      el("td", { class: "mono nowrap", text: d.to || "" }),
      el("td", {}, badge(d.status), d.lastError ? el("div", { class: "muted", text: d.lastError }) : null),
      el("td", { class: "nowrap", text: String(d.attempts ?? 0) }),
      el("td", { class: "wrap", text: short(d.message, 80) })));
  }
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

const refreshSessions = coalesce(() => loadSessions(), 500);
const refreshDetail = coalesce(() => loadDetail(), 250);

function logEvent(type, data) {
  const log = $("event-log");
  const parts = [type, data.sessionKey, data.status].filter(Boolean).join(" · ");
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
  $("filters").addEventListener("submit", (event) => { event.preventDefault(); loadSessions(); });
  $("filter-kind").addEventListener("change", () => loadSessions());
  $("send-form").addEventListener("submit", send);
  const saved = localStorage.getItem(TOKEN_KEY);
  if (saved) {
    start(saved).catch((err) => showLogin(err instanceof AuthError ? "Sign in again." : String(err)));
  } else {
    showLogin("");
  }
});
