// The playground page: settings, credentials, Speak/Stop/Download, and the live views.
// `window.playground` exposes what the page measures (samples played, buffered, received), for
// people curious in the console and for the browser tests.

import { STREAMED, StreamDecoder } from "./codecs.js";
import { Player } from "./player.js";
import { NOTHING_TO_SPEAK, describeFailure, describeResponse, insecureContext } from "./messages.js";
import { Utterance, speakable, wsUrl } from "./utterance.js";
import { WordView } from "./words.js";

const settings = JSON.parse(document.getElementById("playground-settings").textContent);
const $ = (id) => document.getElementById(id);
const MAX_EVENTS = 300;

let apiKey = null; // typed by the user when keys are required: in memory only, never stored
let utterance = null;
let lastStop = null;
const player = new Player(onStats);
const canPlay = Player.supported; // false outside a secure context: Speak stays off, the page says why
const words = new WordView($("words"), { box: $("heard"), spoken: $("spoken"), unspoken: $("unspoken") });

function status(text) { $("status").textContent = text; }

function showError(text) {
  const box = $("error");
  box.textContent = text;
  box.hidden = false;
  logLine("error", text);
}

function clearError() { $("error").hidden = true; $("error").textContent = ""; }

function logLine(kind, text) {
  const list = $("events");
  const item = document.createElement("li");
  item.className = kind;
  item.textContent = text;
  list.append(item);
  while (list.children.length > MAX_EVENTS) list.firstElementChild.remove();
  list.scrollTop = list.scrollHeight;
}

function describeEvent(source, event) {
  if (source === "close") return `closed ${event.code}${event.reason ? ` ${event.reason}` : ""}`;
  const { type, ...fields } = event;
  const shown = (v) => (typeof v === "string" && v.length > 80 ? `${v.slice(0, 77)}…` : v);
  // A list (audio.timestamps' words) is counted, not printed: the full event is in the browser's tools.
  const value = (v) => (Array.isArray(v) ? `[${v.length} items]` : JSON.stringify(shown(v)));
  const brief = Object.entries(fields).filter(([k]) => k !== "limits" && k !== "session")
    .map(([k, v]) => `${k}=${value(v)}`).join(" ");
  return `${source === "client" ? "→" : "←"} ${type} ${brief}`;
}

const view = {
  event(source, event) {
    logLine(event.type === "error" ? "error" : source === "client" ? "client" : "server", describeEvent(source, event));
  },
  segment(row) {
    let tr = document.querySelector(`#segments tr[data-index="${row.index}"]`);
    if (!tr) {
      tr = document.createElement("tr");
      tr.dataset.index = row.index;
      tr.innerHTML = "<td class=num></td><td></td><td class=num></td><td class=num></td><td></td>";
      $("segments").tBodies[0].append(tr);
    }
    const seconds = player.rate ? (row.samples / player.rate).toFixed(2) : "";
    const cells = [row.index, row.text, row.ttfa == null ? "" : `${Math.round(row.ttfa)} ms`, `${seconds} s`, row.end];
    cells.forEach((value, i) => { tr.cells[i].textContent = value; });
  },
  words,
  error: showError,
  hasError: () => !$("error").hidden,
  ended(finished) {
    if (finished !== utterance) return;
    $("speak").disabled = false;
    setStop(player.buffered > 0);
    if (!finished.stoppedByUser) status(`Session ended. ${finished.segments.size} segment(s).`);
  },
};

// Stop on or off. Keyboard and screen-reader users stay on the controls: Speak moves the focus to
// Stop (speak()), and when Stop turns off with the focus on it, the focus goes back to Speak
// instead of falling to the page (a disabled button drops it).
function setStop(enabled) {
  const stopButton = $("stop");
  const hadFocus = document.activeElement === stopButton;
  stopButton.disabled = !enabled;
  if (!enabled && hadFocus) $("speak").focus();
}

function onStats(message) {
  $("download").disabled = player.played === 0;
  if (message.reason === "clear" && lastStop !== null) {
    status(`Stopped: silent ${Math.round(performance.now() - lastStop)} ms after Stop.`);
    lastStop = null;
  }
  if (utterance) utterance.finishWhenPlayed();
  if (player.buffered === 0 && (!utterance || utterance.closed)) setStop(false);
}

// Each displayed frame, the word under the playback position (the AudioContext's clock) is marked.
function follow() {
  if (player.rate) words.show((1000 * player.heard()) / player.rate);
  requestAnimationFrame(follow);
}

// -- credentials ---------------------------------------------------------------------------------
async function postToken(url, headers) {
  let response;
  try {
    response = await fetch(url, { method: "POST", headers, credentials: "same-origin" });
  } catch (_) {
    throw new Error("The server could not be reached to get a token.");
  }
  if (!response.ok) throw new Error(await describeResponse(response, "get a token"));
  return (await response.json()).token;
}

function csrfToken() {
  const match = document.cookie.match(/(?:^|;\s*)csrftoken=([^;]+)/);
  return match ? decodeURIComponent(match[1]) : "";
}

// A single-use token for the WebSocket, or null when the server wants none.
async function token() {
  if (!settings.requireKey) return null;
  if (apiKey) return postToken("/v1/audio/speech/tokens", { Authorization: `Bearer ${apiKey}` });
  if (settings.staff) return postToken(settings.staffTokenUrl, { "X-CSRFToken": csrfToken() });
  askForKey();
  throw new Error("This server needs an API key: enter one above.");
}

function askForKey() {
  $("key-form").hidden = false;
  $("key").focus();
}

async function useKey(event) {
  event.preventDefault();
  const typed = $("key").value.trim();
  $("key").value = ""; // not left in the page either
  if (!typed) return;
  clearError();
  if (await loadVoices(typed)) {
    apiKey = typed;
    $("key-form").hidden = true;
    status("Key accepted (kept in this page only).");
  }
}

// -- voices ----------------------------------------------------------------------------------------
function fillVoices(voices) {
  const select = $("voice");
  select.replaceChildren(...voices.map((v) => {
    const option = new Option(v.type === "uploaded" ? `${v.name} (uploaded)` : v.name, v.name);
    option.selected = v.name === settings.defaultVoice;
    return option;
  }));
  if (!canPlay) return;
  $("speak").disabled = false;
  status("Ready.");
}

async function loadVoices(key) {
  let response;
  try {
    response = await fetch("/v1/audio/voices", { headers: key ? { Authorization: `Bearer ${key}` } : {} });
  } catch (_) {
    showError("The server could not be reached to list its voices.");
    return false;
  }
  if (!response.ok) {
    showError(await describeResponse(response, "list the voices"));
    return false;
  }
  fillVoices((await response.json()).data.map((v) => ({ name: v.name, type: v.type })));
  return true;
}

// -- Speak, Stop, Download ------------------------------------------------------------------------
function config() {
  const session = { response_format: $("format").value, stream_audio: true, split_granularity: $("split").value,
                    voice: $("voice").value, speed: Number($("speed").value), timestamps: "word" };
  if ($("rate").value) session.sample_rate = Number($("rate").value);
  return session;
}

// Speak: every failure before the session starts is shown in words and leaves the page ready again.
async function speak() {
  clearError();
  const text = $("text").value;
  if (!speakable(text)) {
    showError(NOTHING_TO_SPEAK);
    $("text").focus();
    return;
  }
  if (utterance) utterance.stop();
  $("segments").tBodies[0].replaceChildren();
  words.reset();
  $("speak").disabled = true;
  $("download").disabled = true;
  status("Connecting…");
  try {
    await startUtterance(text);
  } catch (error) {
    showError(error instanceof SpeakError ? error.message : describeFailure(error));
    $("speak").disabled = false;
    $("speak").focus();
    status("Ready.");
    return;
  }
  setStop(true);
  $("stop").focus();
  status("Speaking…");
}

class SpeakError extends Error {} // a failure already in words (credentials)

async function startUtterance(text) {
  const session = config();
  const fmt = session.response_format;
  const expectedRate = fmt === "opus" ? 48000 : session.sample_rate || (["mulaw", "alaw"].includes(fmt) ? 8000 : settings.nativeRate);
  // In the click itself: browsers let a page start audio only in answer to a gesture.
  const ready = player.prepare(expectedRate);
  ready.catch(() => {}); // awaited below, after the credential: reported there, once
  let credential;
  try {
    credential = await token();
  } catch (error) {
    throw new SpeakError(error.message);
  }
  await ready;
  const pace = $("mode").value === "words" ? Math.max(10, Number($("pace").value) || 120) : 0;
  utterance = new Utterance({ url: wsUrl(credential), config: session, text, pace, player, view });
}

function stop() {
  lastStop = performance.now();
  if (utterance) utterance.stop();
  else player.clear();
}

function download() {
  const link = document.createElement("a");
  link.href = URL.createObjectURL(player.heardWav());
  link.download = "heard.wav";
  link.click();
  setTimeout(() => URL.revokeObjectURL(link.href), 10000);
}

window.playground = {
  get played() { return player.played; },
  get buffered() { return player.buffered; },
  get received() { return player.received; },
  get rate() { return player.rate; },
  get heardMs() { return player.rate ? (1000 * player.heard()) / player.rate : 0; },
  get audioContext() { return player.context; },
  get utterance() {
    const u = utterance;
    return u && { closed: u.closed, framesSent: u.framesSent, bytesReceived: u.bytesReceived, bytesAnnounced: u.bytesAnnounced,
                  wordsSent: u.wordsSent, wordsTotal: u.wordsTotal, wordsAtFirstAudio: u.wordsAtFirstAudio,
                  cancelledSentences: u.cancelledSentences, playedMs: u.playedMs ?? null, cancelled: u.cancelled ?? null,
                  segments: [...u.segments.values()].map((s) => ({ ...s })) };
  },
  heardWav: () => player.heardWav(),
  get highlights() { return [...words.highlights]; },
  get shown() { return [...words.shown]; },
};

$("speak").addEventListener("click", speak);
$("stop").addEventListener("click", stop);
$("download").addEventListener("click", download);
$("key-form").addEventListener("submit", useKey);

// Compressed streams are decoded by WebCodecs: where the browser has none, they cannot be chosen.
if (!StreamDecoder.supported()) {
  for (const option of $("format").options) {
    if (!STREAMED.includes(option.value)) continue;
    option.disabled = true;
    option.textContent += " (this browser has no WebCodecs decoder)";
  }
}
if (!canPlay) {
  showError(insecureContext(location.host));
  status("Cannot play on this page.");
}
requestAnimationFrame(follow);
if (settings.voices) fillVoices(settings.voices);
else if (settings.requireKey && !settings.staff) { askForKey(); status("Waiting for an API key."); }
else loadVoices(null);
