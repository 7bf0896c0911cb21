// One Speak: a WebSocket session that sends text (at once, or word by word like a language
// model), plays the audio it gets and measures each segment's time to first audio.
// The text goes in one named context: its input.done gets context.done and the session stays open
// while the page plays, so that a Stop, however late, can still tell the server how much was
// played and learn which words were heard (docs/protocol.md, "What was heard, on barge-in").

import { CANNOT_CONNECT, describeClose, describeError, describeFailure } from "./messages.js";

export const WS_PATH = "/v1/audio/speech/stream";
export const CONTEXT = "speak"; // the context_id of the page's text

export function wsUrl(token) {
  const scheme = location.protocol === "https:" ? "wss" : "ws";
  return `${scheme}://${location.host}${WS_PATH}${token ? `?token=${encodeURIComponent(token)}` : ""}`;
}

// Tokens as a language model emits them: each word with the whitespace after it.
export const words = (text) => text.match(/\s*\S+\s*/g) || [];

// Whether the text has anything to say: the server never speaks a segment without a letter or digit.
export const speakable = (text) => /[\p{L}\p{N}]/u.test(text);

const encoder = new TextEncoder();
// The UTF-8 bytes `text` adds to an input.text frame (JSON escapes each character on its own).
const cost = (text) => encoder.encode(JSON.stringify(text)).length - 2;

// The text as input.text frames of at most `maxBytes` each (the session's `max_message_bytes`),
// cut between words; a word too long for one frame is cut between characters.
export function frames(text, maxBytes) {
  const budget = maxBytes - encoder.encode(JSON.stringify({ type: "input.text", context_id: CONTEXT, text: "" })).length;
  if (cost(text) <= budget) return [text];
  const out = [];
  let current = "";
  let used = 0;
  const add = (piece, size) => {
    if (used + size > budget && current) { out.push(current); current = ""; used = 0; }
    current += piece;
    used += size;
  };
  for (const word of words(text)) {
    const size = cost(word);
    if (size <= budget) add(word, size);
    else for (const character of word) add(character, cost(character));
  }
  if (current) out.push(current);
  return out;
}

export class Utterance {
  constructor({ url, config, text, pace, player, view }) {
    this.config = config;
    this.text = text;
    this.tokens = pace ? words(text) : [text]; // whole: cut into frames once the limits are known
    this.framesSent = 0;
    this.pace = pace;
    this.player = player;
    this.view = view; // {event(kind, data), segment(row), error(text), ended(utterance), words: WordView}
    this.sent = ""; // text sent so far, to find where each segment ends
    this.sends = []; // {end, at}: the text length after each input.text, and when it went
    this.doneAt = null;
    this.cursor = 0;
    this.segments = new Map();
    this.current = null;
    this.stopping = false;
    this.closed = false;
    this.wordsSent = 0;
    this.wordsAtFirstAudio = null;
    this.cancelledSentences = null;
    this.bytesReceived = 0;
    this.bytesAnnounced = 0;
    this.format = config.response_format;
    this.chain = Promise.resolve(); // see handle()
    this.ws = new WebSocket(url);
    this.ws.binaryType = "arraybuffer";
    this.ws.onopen = () => { this.connected = true; this.send({ type: "session.config", session: config }); };
    this.ws.onmessage = (message) => { this.handle(() => this.receive(message.data)); };
    this.ws.onerror = () => { this.failedToConnect = !this.connected; };
    this.ws.onclose = (event) => { this.handle(() => this.onClose(event)); };
  }

  get wordsTotal() { return this.tokens.length; }

  // Events are handled one after another, in order; an exception in the page is shown, never silent,
  // and ends the session (the close still runs onClose).
  handle(step) {
    this.chain = this.chain.then(step).catch((error) => {
      this.view.error(describeFailure(error));
      if (this.ws.readyState === WebSocket.OPEN) this.ws.close();
    });
  }

  send(message) {
    if (this.ws.readyState !== WebSocket.OPEN) return;
    // Word by word, one line per word would bury the server's events: only whole texts are listed.
    if (message.type !== "input.text" || !this.pace) this.view.event("client", message);
    this.ws.send(JSON.stringify(message));
  }

  sendText(text) {
    this.send({ type: "input.text", context_id: CONTEXT, text });
    this.sent += text;
    this.sends.push({ end: this.sent.length, at: performance.now() });
    this.wordsSent += 1;
    this.framesSent += 1;
  }

  async feed() {
    for (const token of this.tokens) {
      if (this.stopping || this.closed) return;
      this.sendText(token);
      if (this.pace) await new Promise((resolve) => { this.timer = setTimeout(resolve, this.pace); });
    }
    if (!this.stopping && !this.closed) {
      this.doneAt = performance.now();
      this.send({ type: "input.done", context_id: CONTEXT });
    }
  }

  // Every word was spoken (context.done) and the player has played it all: the session can end.
  // Until then a keepalive every half idle timeout holds the session open while the page plays; a
  // player that made no progress since the last one (its output stalled) ends it instead, so that
  // a stalled page holds no session of its key.
  finishWhenPlayed() {
    if (!this.contextDone || this.stopping || this.finishing || this.closed) return;
    if (this.player.idle) this.finish();
    else if (!this.keepalive) {
      let played = this.player.played;
      this.keepalive = setInterval(() => {
        if (this.player.played === played) this.finish();
        else this.send({ type: "session.keepalive" });
        played = this.player.played;
      }, this.idleTimeoutMs / 2);
    }
  }

  finish() {
    this.finishing = true;
    clearInterval(this.keepalive);
    this.send({ type: "input.done" });
  }

  async receive(data) {
    if (typeof data !== "string") return this.audio(data);
    const event = JSON.parse(data);
    this.view.event("server", event);
    switch (event.type) {
      case "session.configured":
        this.opened = true;
        this.sessionId = event.session_id;
        this.idleTimeoutMs = 1000 * event.limits.idle_timeout_s;
        if (!this.pace) this.tokens = frames(this.text, event.limits.max_message_bytes);
        await this.player.ready; // the context was made in the click; its worklet may still be loading
        if (this.player.rate !== event.sample_rate) await this.player.prepare(event.sample_rate);
        this.feed().catch((error) => this.view.error(describeFailure(error))); // runs beside the events
        break;
      case "audio.start":
        this.current = { index: event.sentence_index, text: event.sentence_text, completedAt: this.completion(event),
                         ttfa: null, samples: 0, end: "", start: this.player.expected, lastWordMs: 0 };
        this.segments.set(event.sentence_index, this.current);
        this.view.segment(this.current);
        this.view.words.segment(event.sentence_index, event.sentence_text, this.player.queuedMs);
        break;
      case "audio.timestamps":
        this.view.words.timestamps(event.sentence_index, event.words);
        if (this.current && event.words.length) this.current.lastWordMs = event.words[event.words.length - 1].end_ms;
        break;
      case "context.done":
        await this.player.drain(); // a compressed stream's last packets are decoded
        this.contextDone = true;
        this.finishWhenPlayed();
        break;
      case "audio.done": {
        this.bytesAnnounced += event.total_bytes;
        const row = this.segments.get(event.sentence_index) || { index: event.sentence_index, text: "", samples: 0, start: this.player.expected, lastWordMs: 0 };
        row.end = event.cancelled ? "cancelled" : event.error ? "failed" : "done";
        this.segments.set(row.index, row);
        this.view.segment(row);
        this.current = null;
        break;
      }
      case "input.cancelled":
        // Stop's cancel is through: end the session cleanly (the next Speak opens a new one).
        if (!this.stoppedByUser) this.player.clear(); // a cancel from the REST API or the admin
        this.cancelledSentences = event.cancelled_sentences;
        this.cancelled = event;
        this.view.words.heard(event, this.playedAt ?? event.played_ms);
        this.stopping = false;
        this.dropping = false;
        this.finish();
        break;
      case "error":
        this.view.error(describeError(event));
        break;
      default:
        break;
    }
  }

  // When the frame that completed this segment was sent: the first send after its last
  // character (a following space is what ends a sentence), or input.done.
  completion(event) {
    const start = this.sent.indexOf(event.sentence_text, this.cursor);
    if (start < 0) return this.sends.length ? this.sends[this.sends.length - 1].at : performance.now();
    const end = start + event.sentence_text.length;
    this.cursor = end;
    const after = this.sends.find((s) => s.end > end);
    return after ? after.at : (this.doneAt ?? this.sends[this.sends.length - 1].at);
  }

  audio(bytes) {
    this.bytesReceived += bytes.byteLength;
    if (this.dropping) return; // Stop was pressed: what is still in flight is never played
    const samples = this.player.push(this.format, bytes);
    if (this.wordsAtFirstAudio === null) this.wordsAtFirstAudio = this.wordsSent;
    const row = this.current;
    if (row) {
      if (row.ttfa === null) row.ttfa = performance.now() - row.completedAt;
      row.samples += samples;
      this.view.segment(row);
    }
  }

  // Barge-in: silence now, then tell the server how much the listener heard (the samples the
  // worklet had played when it dropped its queue); its answer says which words those were, and ends
  // the session.
  async stop() {
    this.stoppedByUser = true;
    clearTimeout(this.timer);
    const cleared = this.player.clear();
    if (this.closed) return;
    this.dropping = true;
    if (!this.opened) {
      this.ws.close();
      return;
    }
    this.stopping = true;
    clearInterval(this.keepalive);
    const played = await cleared;
    this.playedAt = (1000 * played) / this.player.rate; // in the page's own timeline (words.js)
    this.playedMs = Math.round(this.utteranceMs(played));
    this.send({ type: "input.cancel", context_id: CONTEXT, played_ms: this.playedMs });
  }

  // `samples` of the decoded audio played, as ms of the utterance's audio as the server counts it. A
  // compressed stream pads each segment's end with less than a codec frame of silence (docs/protocol.md):
  // the pad is taken as half a frame (never into the segment's last word), so each segment's figure is
  // within half a frame. Raw formats have no pad: the figure is exact.
  utteranceMs(samples) {
    const { rate, codecFrame } = this.player;
    let ms = 0;
    for (const row of this.segments.values()) {
      const length = Math.max(0, row.samples - codecFrame / 2, (row.lastWordMs * rate) / 1000);
      const within = samples - row.start;
      if (within < row.samples) return ms + (1000 * Math.max(0, Math.min(within, length))) / rate;
      ms += (1000 * length) / rate;
    }
    return ms;
  }

  onClose(event) {
    this.closed = true;
    clearTimeout(this.timer);
    clearInterval(this.keepalive);
    if (this.failedToConnect) this.view.error(CANNOT_CONNECT);
    else {
      const words = describeClose(event.code, event.reason);
      if (words && !this.view.hasError()) this.view.error(words);
    }
    this.view.event("close", { code: event.code, reason: event.reason });
    this.view.ended(this);
  }
}
