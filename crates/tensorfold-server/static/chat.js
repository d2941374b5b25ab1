// The chat page: streams replies from /v1/chat/completions, shows the live
// panel from each reply's usage and from /metrics, and can replay a request
// with "draft": false to show the drafted reply equals the serial one.
"use strict";

const $ = (id) => document.getElementById(id);
const history = [];
let modelId = null;
let controller = null;

function headers() {
  const h = { "content-type": "application/json" };
  const key = $("api_key").value.trim();
  if (key) h.authorization = "Bearer " + key;
  return h;
}

function addMessage(role, text) {
  const div = document.createElement("div");
  div.className = "message " + role;
  const label = document.createElement("span");
  label.className = "role";
  label.textContent = role;
  const body = document.createElement("span");
  body.className = "content";
  body.textContent = text;
  div.append(label, body);
  $("messages").append(div);
  $("messages").scrollTop = $("messages").scrollHeight;
  return div;
}

function number(id) {
  const v = $(id).value.trim();
  return v === "" ? null : Number(v);
}

function requestBody() {
  const messages = [];
  const system = $("system").value.trim();
  if (system) messages.push({ role: "system", content: system });
  messages.push(...history);
  const body = {
    model: modelId,
    messages,
    temperature: number("temperature") ?? 0,
    top_p: number("top_p") ?? 1,
    min_p: number("min_p") ?? 0,
    max_tokens: number("max_tokens") ?? 256,
  };
  const topK = number("top_k");
  if (topK) body.top_k = topK;
  let seed = number("seed");
  // A sampled reply is reproducible only under a seed: pick one so the
  // serial comparison draws the same tokens.
  if (seed === null && body.temperature > 0 && $("compare").checked) {
    seed = Math.floor(Math.random() * 2 ** 31);
  }
  if (seed !== null) body.seed = seed;
  return body;
}

async function apiError(response) {
  try {
    const json = await response.json();
    return (json.error && json.error.message) || JSON.stringify(json);
  } catch (_) {
    return "HTTP " + response.status;
  }
}

// Streams one reply into `target`; returns {text, usage, seconds}.
async function stream(body, target, signal) {
  const response = await fetch("/v1/chat/completions", {
    method: "POST",
    headers: headers(),
    body: JSON.stringify({ ...body, stream: true, stream_options: { include_usage: true } }),
    signal,
  });
  if (!response.ok) throw new Error(await apiError(response));
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "", text = "", usage = null, first = null;
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buffer += decoder.decode(value, { stream: true });
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const event = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      for (const line of event.split("\n")) {
        if (!line.startsWith("data:")) continue;
        const data = line.slice(5).trim();
        if (data === "[DONE]") continue;
        const chunk = JSON.parse(data);
        if (chunk.error) throw new Error(chunk.error.message);
        if (chunk.usage) usage = chunk.usage;
        const delta = chunk.choices && chunk.choices[0] && chunk.choices[0].delta;
        if (delta && delta.content) {
          if (first === null) first = performance.now();
          text += delta.content;
          target.textContent = text;
          $("messages").scrollTop = $("messages").scrollHeight;
          if (usage === null) $("tokens").textContent = "streaming…";
        }
      }
    }
  }
  const seconds = first === null ? 0 : (performance.now() - first) / 1000;
  return { text, usage, seconds };
}

function showUsage(usage, seconds) {
  if (!usage) return;
  const n = usage.completion_tokens;
  $("tokens").textContent = n;
  // Tokens after the first, over the time after the first: decode speed.
  $("tps").textContent = seconds > 0 && n > 1 ? ((n - 1) / seconds).toFixed(1) : "–";
  const d = usage.completion_tokens_details || {};
  $("drafts").textContent = (d.draft_tokens ?? 0) + " / " + (d.accepted_draft_tokens ?? 0);
  const p = usage.prompt_tokens_details || {};
  $("cached").textContent = (p.cached_tokens ?? 0) + " of " + usage.prompt_tokens;
}

async function serial(body, message, drafted) {
  const box = document.createElement("div");
  box.className = "serial";
  box.textContent = "serial decode…";
  message.append(box);
  const response = await fetch("/v1/chat/completions", {
    method: "POST",
    headers: headers(),
    body: JSON.stringify({ ...body, draft: false }),
  });
  if (!response.ok) {
    box.textContent = "serial request failed: " + (await apiError(response));
    return;
  }
  const json = await response.json();
  const text = json.choices[0].message.content || "";
  const same = text === drafted;
  box.textContent = "";
  const verdict = document.createElement("span");
  verdict.className = "verdict " + (same ? "same" : "differs");
  verdict.textContent = same
    ? "identical to the serial decode (\"draft\": false)"
    : "differs from the serial decode";
  box.append(verdict);
  if (!same) {
    const pre = document.createElement("div");
    pre.textContent = text;
    box.append(pre);
  }
}

async function send(event) {
  event.preventDefault();
  const text = $("input").value.trim();
  if (!text || controller) return;
  $("input").value = "";
  addMessage("user", text);
  history.push({ role: "user", content: text });
  const message = addMessage("assistant", "");
  const target = message.querySelector(".content");
  const body = requestBody();
  controller = new AbortController();
  $("send").disabled = true;
  $("stop").disabled = false;
  try {
    const reply = await stream(body, target, controller.signal);
    history.push({ role: "assistant", content: reply.text });
    showUsage(reply.usage, reply.seconds);
    message.dataset.done = "true";
    if ($("compare").checked) await serial(body, message, reply.text);
  } catch (e) {
    if (e.name !== "AbortError") {
      message.className = "message error";
      target.textContent = String(e.message || e);
    }
    history.pop();
  } finally {
    controller = null;
    $("send").disabled = false;
    $("stop").disabled = true;
  }
}

// Prometheus text: name -> value.
function parseMetrics(text) {
  const out = {};
  for (const line of text.split("\n")) {
    if (!line || line.startsWith("#")) continue;
    const [name, value] = line.split(/\s+/);
    out[name] = Number(value);
  }
  return out;
}

function mib(bytes) {
  return (bytes / 2 ** 20).toFixed(0) + " MiB";
}

async function pollMetrics() {
  try {
    const m = parseMetrics(await (await fetch("/metrics")).text());
    if ("tensorfold_resident_memory_bytes" in m) $("memory").textContent = mib(m.tensorfold_resident_memory_bytes);
    $("load").textContent = (m.tensorfold_running ?? 0) + " / " + (m.tensorfold_queue_depth ?? 0);
  } catch (_) {
    // The panel keeps its last values while the server is away.
  }
}

async function start() {
  try {
    const response = await fetch("/v1/models", { headers: headers() });
    const json = await response.json();
    modelId = json.data[0].id;
    $("model").textContent = modelId + " · context " + json.data[0].max_model_len;
  } catch (_) {
    $("model").textContent = "model list unavailable (API key?)";
  }
  pollMetrics();
  setInterval(pollMetrics, 1000);
}

$("composer").addEventListener("submit", send);
$("input").addEventListener("keydown", (e) => {
  if (e.key === "Enter" && !e.shiftKey) send(e);
});
$("stop").addEventListener("click", () => controller && controller.abort());
$("clear").addEventListener("click", () => {
  history.length = 0;
  $("messages").textContent = "";
});
$("api_key").addEventListener("change", start);
start();
