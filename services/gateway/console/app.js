// Troupe's web console. It uses the gateway's HTTP API and nothing else (docs/http-api.md):
// Connect's JSON for unary calls, and Subscribe's enveloped stream for a session's events.
// Everything the API returns is put on the page as text (textContent), never as markup.
// The API key lives in this tab's sessionStorage, so it survives a reload and no more.
const API = "/troupe.v1.GatewayService/";
const ADMIN_API = "/troupe.v1.AdminService/";
const $ = (id) => document.getElementById(id);
const state = { key: sessionStorage.getItem("troupe.key") ?? "", session: "", stream: undefined, lastSeq: 0 };

class ApiError extends Error {
  constructor(code, message) {
    super(`${code}: ${message}`);
    this.code = code;
  }
}

async function call(method, body, api = API) {
  const res = await fetch(api + method, {
    method: "POST",
    headers: { "content-type": "application/json", authorization: `Bearer ${state.key}` },
    body: JSON.stringify(body),
  });
  const json = await res.json().catch(() => ({ code: "unknown", message: `HTTP ${res.status}` }));
  if (!res.ok) throw new ApiError(json.code, json.message);
  return json;
}

/** A session's events after `afterSeq`: Connect's stream framing, one flag byte and a length per message. */
async function* subscribe(sessionId, afterSeq, signal) {
  const request = new TextEncoder().encode(JSON.stringify({ sessionId, afterSeq: String(afterSeq) }));
  const body = new Uint8Array(5 + request.length);
  new DataView(body.buffer).setUint32(1, request.length);
  body.set(request, 5);
  const res = await fetch(`${API}Subscribe`, {
    method: "POST",
    headers: { "content-type": "application/connect+json", authorization: `Bearer ${state.key}` },
    body,
    signal,
  });
  if (!res.ok) throw new ApiError("unavailable", `HTTP ${res.status}`);
  const reader = res.body.getReader();
  const decoder = new TextDecoder();
  let buf = new Uint8Array(0);
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    const joined = new Uint8Array(buf.length + value.length);
    joined.set(buf);
    joined.set(value, buf.length);
    buf = joined;
    while (buf.length >= 5) {
      const length = new DataView(buf.buffer, buf.byteOffset).getUint32(1);
      if (buf.length < 5 + length) break;
      const flags = buf[0];
      const message = JSON.parse(decoder.decode(buf.subarray(5, 5 + length)));
      buf = buf.subarray(5 + length);
      if (flags & 2) {
        if (message.error) throw new ApiError(message.error.code, message.error.message);
        return;
      }
      yield message.event;
    }
  }
}

// ---- the page ----

function el(tag, className, text) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (text !== undefined) node.textContent = text;
  return node;
}

function show(signedIn) {
  $("sign-in").hidden = signedIn;
  $("app").hidden = !signedIn;
  $("sign-out").hidden = !signedIn;
}

async function signIn(key) {
  state.key = key;
  try {
    await refreshSessions();
  } catch (err) {
    state.key = "";
    sessionStorage.removeItem("troupe.key");
    $("sign-in-error").textContent = err.message;
    show(false);
    return;
  }
  sessionStorage.setItem("troupe.key", key);
  $("sign-in-error").textContent = "";
  $("who").textContent = `signed in with key …${key.slice(-4)}`;
  show(true);
  // Admin keys see the operator's views; the API says which keys those are.
  const admin = await call("ListAuditRecords", { limit: 1 }, ADMIN_API).then(
    () => true,
    () => false,
  );
  $("admin-nav").hidden = !admin;
  const last = sessionStorage.getItem("troupe.session");
  if (last) await openSession(last);
}

async function refreshSessions() {
  const { sessions = [] } = await call("ListSessions", { pageSize: 200 });
  sessions.sort((a, b) => (b.updateTime ?? "").localeCompare(a.updateTime ?? ""));
  const list = $("sessions");
  list.replaceChildren(
    ...sessions.map((s) => {
      const item = el("li", s.sessionId === state.session ? "current" : "", s.sessionId);
      item.dataset.session = s.sessionId;
      const when = s.updateTime ? new Date(s.updateTime).toLocaleString() : "";
      const waits = s.pending?.length ? ` · waits on ${s.pending.length} decision(s)` : "";
      item.append(el("small", "", `${s.agentId} · ${when}${s.running ? " · running" : ""}${waits}`));
      item.onclick = () => openSession(s.sessionId);
      return item;
    }),
  );
}

/** Renders events as they come; messages by id, tool calls (and calls held for a decision) by call id. */
const view = { messages: new Map(), tools: new Map(), held: new Map() };

const VERDICTS = [
  ["Approve", "TOOL_VERDICT_APPROVE"],
  ["Reject", "TOOL_VERDICT_REJECT"],
  ["Edit", "TOOL_VERDICT_EDIT"],
];

/** Sends a decision on a held call (docs/approvals.md); a reject asks why, an edit asks for the arguments. */
async function decide(toolCallId, verdict, argumentsJson) {
  const body = { sessionId: state.session, frameId: crypto.randomUUID(), toolCallId, verdict };
  if (verdict === "TOOL_VERDICT_REJECT") body.message = window.prompt("Why not? (the agent reads this)") ?? "";
  if (verdict === "TOOL_VERDICT_EDIT") {
    const edited = window.prompt("Run it with these arguments (JSON):", argumentsJson);
    if (edited === null) return;
    body.argumentsJson = edited;
  }
  try {
    await call("DecideToolCall", body);
    $("status").textContent = "";
  } catch (err) {
    $("status").textContent = err.message;
  }
}

function note(text, error = false) {
  $("events").append(el("div", error ? "note error" : "note", text));
}

function render(event) {
  const events = $("events");
  const kind = Object.keys(event).find((k) => !["sessionId", "seq", "turnId", "time"].includes(k));
  const p = event[kind] ?? {};
  if (kind === "messageStart" && p.message?.role === "ROLE_USER") {
    events.append(el("div", "msg user", p.message.text));
  } else if (kind === "messageStart" && p.message?.role === "ROLE_ASSISTANT") {
    const node = el("div", "msg assistant");
    node.dataset.message = p.message.id;
    view.messages.set(p.message.id, node);
    events.append(node);
  } else if (kind === "messageUpdate") {
    const node = view.messages.get(p.messageId);
    if (node && p.text) node.append(p.text);
    if (node && p.thinking) node.before(el("div", "thinking", p.thinking));
  } else if (kind === "messageEnd" && p.message?.role === "ROLE_ASSISTANT") {
    let node = view.messages.get(p.message.id);
    if (!node) events.append((node = el("div", "msg assistant")));
    node.textContent = p.message.text || "";
    if (!p.message.text && !p.message.toolCalls?.length) node.remove();
    else if (!p.message.text) node.hidden = true;
  } else if (kind === "toolExecutionStart") {
    const node = el("div", "tool", `⚙ ${p.toolName} ${p.argumentsJson ?? ""}`);
    node.append(el("pre"));
    view.tools.set(p.toolCallId, node);
    events.append(node);
  } else if (kind === "toolExecutionUpdate") {
    view.tools.get(p.toolCallId)?.querySelector("pre").append(p.output ?? "");
  } else if (kind === "toolExecutionEnd") {
    const node = view.tools.get(p.toolCallId) ?? events.appendChild(el("div", "tool", `⚙ ${p.toolName}`));
    if (!node.querySelector("pre")) node.append(el("pre"));
    node.querySelector("pre").textContent = p.skipped ? "(skipped)" : (p.result ?? "");
    if (p.isError) node.classList.add("failed");
  } else if (kind === "toolApprovalRequested") {
    const node = el("div", "tool held", `⏸ ${p.toolName} ${p.argumentsJson ?? ""}`);
    node.dataset.call = p.toolCallId;
    node.append(el("small", "", `${p.rule ?? ""}; on ${p.deadline ? new Date(p.deadline).toLocaleString() : "?"} the policy will ${p.onTimeout ?? "deny"}`));
    const buttons = el("div", "decide");
    for (const [label, verdict] of VERDICTS) {
      const button = el("button", "", label);
      button.type = "button";
      button.dataset.verdict = verdict;
      button.onclick = () => decide(p.toolCallId, verdict, p.argumentsJson ?? "{}");
      buttons.append(button);
    }
    node.append(buttons);
    view.held.set(p.toolCallId, node);
    events.append(node);
  } else if (kind === "toolDecided") {
    view.held.get(p.toolCallId)?.querySelector(".decide")?.remove();
    const word = { TOOL_VERDICT_APPROVE: "approved", TOOL_VERDICT_REJECT: "rejected", TOOL_VERDICT_EDIT: "edited" }[p.verdict] ?? "decided";
    note(`${p.toolCallId}: ${word} by ${p.decidedBy}${p.message ? `: ${p.message}` : ""}`);
  } else if (kind === "clientToolCall") {
    note(`the client is asked to run ${p.toolName} ${p.argumentsJson ?? ""}`);
  } else if (kind === "runWaiting") {
    note("the run waits for a decision");
  } else if (kind === "frameAccepted") {
    note(`${(p.kind ?? "").replace("FRAME_KIND_", "").toLowerCase()} accepted${p.queuePosition ? `, ${p.queuePosition} ahead` : ""}`);
  } else if (kind === "queueApplied") {
    note(`${(p.kind ?? "").replace("FRAME_KIND_", "").toLowerCase()} applied`);
  } else if (kind === "error") {
    note(`error ${p.code}: ${p.message}`, true);
  } else if (kind === "agentEnd") {
    note(`run ended: ${(p.stopReason ?? "").replace("STOP_REASON_", "").toLowerCase()}${p.errorMessage ? ` (${p.errorMessage})` : ""}`, p.stopReason === "STOP_REASON_ERROR");
  } else if (["modelRetry", "modelFallback", "compactionStart", "messageBlocked", "runResumed"].includes(kind)) {
    note(`${kind}: ${JSON.stringify(p)}`, kind === "messageBlocked");
  }
  events.scrollTop = events.scrollHeight;
}

/** Follows a session's events from after `lastSeq`; a broken stream resumes from the last seq seen. */
async function follow(sessionId) {
  const controller = new AbortController();
  state.stream = controller;
  while (!controller.signal.aborted && state.session === sessionId) {
    try {
      for await (const event of subscribe(sessionId, state.lastSeq, controller.signal)) {
        state.lastSeq = Number(event.seq);
        $("events").dataset.seq = String(state.lastSeq);
        render(event);
      }
    } catch (err) {
      if (controller.signal.aborted) return;
      $("status").textContent = `reconnecting after seq ${state.lastSeq} (${err.message})`;
    }
    await new Promise((r) => setTimeout(r, 1000));
  }
}

async function openSession(sessionId) {
  state.stream?.abort();
  $("admin").hidden = true;
  state.session = sessionId;
  state.lastSeq = 0;
  view.messages.clear();
  view.tools.clear();
  view.held.clear();
  sessionStorage.setItem("troupe.session", sessionId);
  $("session").hidden = false;
  $("title").textContent = sessionId;
  $("status").textContent = "";
  $("events").replaceChildren();
  for (const li of $("sessions").children) li.classList.toggle("current", li.dataset.session === sessionId);
  void follow(sessionId);
  const { schedules = [] } = await call("ListSchedules", { sessionId }).catch(() => ({}));
  $("schedules").replaceChildren(
    ...(schedules.length === 0
      ? [el("li", "", "none")]
      : schedules.map((s) =>
          el("li", "", `${s.scheduleId}: ${s.cron ? `cron "${s.cron}" ${s.timeZone ?? ""}` : `every ${s.everySeconds} s`} — ${s.text ?? ""}`),
        )),
  );
}

// ---- the operator's views (admin keys) ----

const when = (t) => (t ? new Date(t).toLocaleString() : "");

const ADMIN_VIEWS = {
  sandboxes: {
    title: "Sandboxes",
    columns: ["name", "scope", "state", "runtime", "commands", "created", "last used"],
    async rows() {
      const { sandboxes = [] } = await call("ListAllSandboxes", {}, ADMIN_API);
      return sandboxes.map((b) => [
        b.name,
        b.pooled ? "(pooled)" : b.scopeKey,
        b.state,
        b.runtime,
        String(b.runningCommands ?? 0),
        when(b.createTime),
        when(b.lastUseTime),
      ]);
    },
  },
  audit: {
    title: "Audit log",
    columns: ["time", "action", "tenant", "session", "why", "excerpt"],
    async rows() {
      const { entries = [] } = await call("ListAuditRecords", { limit: 200 }, ADMIN_API);
      return entries.map((a) => {
        const r = a.record ?? {};
        const why = [r.check, r.level, r.reason].filter(Boolean).join(" · ");
        return [when(a.time), a.action, a.tenant ?? "", a.sessionId ?? "", why, r.excerpt ?? ""];
      });
    },
  },
};

async function openAdmin(name) {
  const v = ADMIN_VIEWS[name];
  state.stream?.abort();
  state.session = "";
  sessionStorage.removeItem("troupe.session");
  for (const li of $("sessions").children) li.classList.remove("current");
  $("session").hidden = true;
  $("admin").hidden = false;
  $("admin").dataset.view = name;
  $("admin-title").textContent = v.title;
  $("admin-head").replaceChildren(...v.columns.map((c) => el("th", "", c)));
  try {
    const rows = await v.rows();
    $("admin-rows").replaceChildren(...rows.map((cells) => {
      const tr = el("tr");
      tr.append(...cells.map((c) => el("td", "", c)));
      return tr;
    }));
    $("admin-status").textContent = `${rows.length} ${rows.length === 1 ? "row" : "rows"}, read ${new Date().toLocaleTimeString()}`;
  } catch (err) {
    $("admin-status").textContent = err.message;
  }
}

// ---- wiring ----

for (const button of $("admin-nav").querySelectorAll("button")) button.onclick = () => openAdmin(button.dataset.view);
$("admin-refresh").onclick = () => openAdmin($("admin").dataset.view);

$("sign-in").addEventListener("submit", (e) => {
  e.preventDefault();
  void signIn($("api-key").value.trim());
});
$("sign-out").onclick = () => {
  state.stream?.abort();
  sessionStorage.clear();
  location.reload();
};
$("new-session").onclick = async () => {
  const { session } = await call("CreateSession", {});
  await refreshSessions();
  await openSession(session.sessionId);
};
$("composer").addEventListener("submit", async (e) => {
  e.preventDefault();
  const kind = e.submitter?.dataset.kind ?? "prompt";
  const text = $("text").value.trim();
  if (!text) return;
  const method = { prompt: "SendMessage", steer: "Steer", followUp: "FollowUp" }[kind];
  try {
    await call(method, { sessionId: state.session, frameId: crypto.randomUUID(), text });
    $("text").value = "";
    $("status").textContent = "";
  } catch (err) {
    $("status").textContent = err.message;
  }
});
$("abort").onclick = async () => {
  try {
    await call("Abort", { sessionId: state.session, frameId: crypto.randomUUID(), reason: "from the console" });
  } catch (err) {
    $("status").textContent = err.message;
  }
};

if (state.key) void signIn(state.key);
