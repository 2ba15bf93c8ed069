// The chat page: keeps the conversation, sends it whole to /v1/chat/completions with
// stream: true, and renders the server-sent events as they arrive. Send turns into Stop
// while a reply streams; stopping aborts the request, which cancels it on the server.
"use strict";

const $ = (id) => document.getElementById(id);
const conversation = [];
let controller = null;

function bubble(role, text) {
  const node = document.createElement("div");
  node.className = "message " + role;
  node.textContent = text;
  $("messages").appendChild(node);
  node.scrollIntoView({block: "end"});
  return node;
}

function headers() {
  const h = {"Content-Type": "application/json"};
  const key = $("api-key").value || localStorage.getItem("mnnllm-api-key");
  if (key) h["Authorization"] = "Bearer " + key;
  return h;
}

function requestBody() {
  const body = {messages: conversation, stream: true, stream_options: {include_usage: true}};
  const temperature = $("temperature").value, maxTokens = $("max-tokens").value;
  if (temperature !== "") body.temperature = Number(temperature);
  if (maxTokens !== "") body.max_tokens = Number(maxTokens);
  return body;
}

async function failure(response) {
  if (response.status === 401) $("key-row").hidden = false;
  try { return (await response.json()).error.message; } catch { return response.statusText; }
}

// Yields the parsed `data:` payloads of a server-sent event stream.
async function* events(response) {
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const {value, done} = await reader.read();
    if (done) return;
    buffer += decoder.decode(value, {stream: true});
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const event = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      for (const line of event.split("\n")) {
        if (!line.startsWith("data: ")) continue;
        const data = line.slice(6);
        if (data === "[DONE]") return;
        yield JSON.parse(data);
      }
    }
  }
}

// The line under a reply: the server's usage when the reply ended by itself ("cut at max tokens" when the
// limit ended it); when Stop ended it, the reply is marked (class "stopped") and the line says what came.
function showStats(usage, finish, stopped, chunks, seconds) {
  const node = document.createElement("div");
  node.className = "stats";
  if (usage) {
    const cached = usage.prompt_tokens_details ? usage.prompt_tokens_details.cached_tokens : 0;
    node.textContent = `${usage.prompt_tokens} prompt tokens (${cached} cached) · ${usage.completion_tokens} ` +
                       `tokens in ${seconds.toFixed(1)} s` + (finish === "length" ? " · cut at max tokens" : "");
  } else if (stopped) {
    node.textContent = `stopped · ${chunks} chunks in ${seconds.toFixed(1)} s`;
  } else {
    return;
  }
  $("messages").appendChild(node);
}

async function send(text) {
  conversation.push({role: "user", content: text});
  bubble("user", text);
  const answer = bubble("assistant", "");
  answer.dataset.chunks = "0";
  controller = new AbortController();
  $("send").textContent = "Stop";
  const started = performance.now();
  let usage = null, failed = false, stopped = false, finish = null;
  try {
    const response = await fetch("/v1/chat/completions", {
      method: "POST", headers: headers(), body: JSON.stringify(requestBody()), signal: controller.signal});
    if (!response.ok) throw new Error(await failure(response));
    for await (const chunk of events(response)) {
      if (chunk.error) throw new Error(chunk.error.message);
      if (chunk.usage) usage = chunk.usage;
      const choice = chunk.choices && chunk.choices[0];
      if (choice && choice.finish_reason) finish = choice.finish_reason;
      const delta = choice && choice.delta;
      if (delta && delta.content) {
        answer.textContent += delta.content;
        answer.dataset.chunks = String(Number(answer.dataset.chunks) + 1);
        answer.scrollIntoView({block: "end"});
      }
    }
  } catch (err) {
    stopped = err.name === "AbortError";
    failed = !stopped;
    if (failed) bubble("error", String(err.message || err));
  } finally {
    controller = null;
    $("send").textContent = "Send";
    if (failed && !answer.textContent) {  // nothing came back: the question can be asked again
      conversation.pop();
      answer.remove();
    } else {
      conversation.push({role: "assistant", content: answer.textContent});
    }
    if (stopped) answer.classList.add("stopped");
    answer.dataset.done = "true";
    showStats(usage, finish, stopped, Number(answer.dataset.chunks), (performance.now() - started) / 1000);
  }
}

$("composer").addEventListener("submit", (event) => {
  event.preventDefault();
  if (controller) { controller.abort(); return; }
  const text = $("prompt").value.trim();
  if (!text) return;
  $("prompt").value = "";
  send(text);
});

$("prompt").addEventListener("keydown", (event) => {
  if (event.key === "Enter" && !event.shiftKey) {
    event.preventDefault();
    if (!controller) $("composer").requestSubmit();  // while a reply streams, only the button stops it
  }
});

$("new-chat").addEventListener("click", () => {
  if (controller) controller.abort();
  conversation.length = 0;
  $("messages").replaceChildren();
});

$("api-key").addEventListener("change", () => localStorage.setItem("mnnllm-api-key", $("api-key").value));

fetch("/v1/models", {headers: headers()})
  .then((r) => r.ok ? r.json() : Promise.reject(r))
  .then((list) => { $("model").textContent = list.data[0].id; })
  .catch((r) => { if (r.status === 401) $("key-row").hidden = false; });
