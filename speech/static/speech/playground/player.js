// Web Audio output: an AudioContext at the stream's own rate (no resampling in the page) and the
// pcm-player worklet. Raw formats are decoded here, streamed mp3/opus/aac by WebCodecs (codecs.js).
// Keeps what was received so "what was heard" can be saved as a WAV file.

import { STREAMED, StreamDecoder } from "./codecs.js";
import { decodeAlaw, decodeMulaw } from "./g711.js";

const MAX_REPORTS = 64; // about a second of the worklet's reports: more than any output latency

export class Player {
  constructor(onStats) {
    this.onStats = onStats;
    this.context = null;
    this.node = null;
    this.ready = null;
    this.generation = 0;
    this.chunks = []; // Int16Array per frame of the current utterance
    this.decoder = null; // StreamDecoder of a compressed stream
    this.expected = 0; // samples the frames pushed so far decode to
    this.codecFrame = 0; // samples of the compressed stream's codec frame (0: raw)
    this.received = 0; // samples decoded (given to the worklet)
    this.played = 0;
    this.buffered = 0;
    this.reports = []; // the worklet's last reports: {played, buffered, time}, oldest first
    this.cleared = []; // resolvers waiting for the worklet to confirm a clear
  }

  // Whether this browser can play here: the AudioWorklet exists only in secure contexts.
  static get supported() {
    return window.isSecureContext && typeof AudioWorkletNode === "function";
  }

  // Called inside the click handler: creating and resuming the context there satisfies autoplay rules.
  // Throws (or the promise rejects) when the browser cannot play: the page shows why (app.js).
  prepare(rate) {
    if (!Player.supported) throw new Error("this browser gives this page no AudioWorklet (not a secure context)");
    if (!this.context || this.context.sampleRate !== rate) {
      if (this.context) this.context.close();
      const context = new AudioContext({ sampleRate: rate, latencyHint: "interactive" });
      this.context = context;
      this.node = null;
      this.ready = context.audioWorklet.addModule(new URL("./worklet.js", import.meta.url)).then(() => {
        const node = new AudioWorkletNode(context, "pcm-player", { outputChannelCount: [1] });
        node.port.onmessage = (event) => this.stats(event.data);
        node.connect(context.destination);
        this.node = node;
      });
    }
    this.context.resume();
    this.generation += 1;
    this.chunks = [];
    if (this.decoder) this.decoder.close();
    this.decoder = null;
    this.expected = 0;
    this.codecFrame = 0;
    this.received = 0;
    this.played = 0;
    this.buffered = 0;
    this.reports = [];
    const generation = this.generation;
    return this.ready.then(() => this.node.port.postMessage({ type: "reset", generation }));
  }

  get rate() {
    return this.context ? this.context.sampleRate : 0;
  }

  // Where the next frame's audio begins in the utterance, in ms: a segment's start (audio.start).
  get queuedMs() {
    return this.rate ? (1000 * this.expected) / this.rate : 0;
  }

  // Everything decoded has been played (after drain(): everything received).
  get idle() {
    return this.buffered === 0 && this.played === this.received;
  }

  // Every frame pushed is decoded and queued for the worklet.
  async drain() {
    if (this.decoder) await this.decoder.drain();
  }

  // One binary frame of `format`: the samples it holds (for mp3, opus, aac: will hold once decoded).
  push(format, bytes) {
    let samples;
    if (STREAMED.includes(format)) {
      if (!this.decoder) this.decoder = new StreamDecoder(format, this.rate, (decoded) => this.play(decoded));
      samples = this.decoder.push(bytes);
      this.codecFrame = this.decoder.frame;
    } else {
      const pcm = format === "pcm" ? new Int16Array(bytes.slice(0, bytes.byteLength & ~1))
        : format === "mulaw" ? decodeMulaw(new Uint8Array(bytes)) : decodeAlaw(new Uint8Array(bytes));
      samples = pcm.length;
      this.play(Float32Array.from(pcm, (v) => v / 32768), pcm);
    }
    this.expected += samples;
    return samples;
  }

  // Float samples to the worklet; kept as 16-bit (`pcm`, when the frame was that already).
  play(samples, pcm = Int16Array.from(samples, (v) => Math.max(-32768, Math.min(32767, Math.round(v * 32768))))) {
    this.chunks.push(pcm);
    this.received += samples.length;
    this.buffered += samples.length;
    this.node.port.postMessage({ type: "samples", generation: this.generation, samples }, [samples.buffer]);
  }

  // Silence at once: the worklet drops its queue; what was played stays counted. Resolves to the
  // samples played when the worklet dropped it (what the listener will have heard).
  clear() {
    if (this.decoder) this.decoder.close(); // what it still holds is never played either
    this.decoder = null;
    if (!this.node) return Promise.resolve(this.played);
    const done = new Promise((resolve) => this.cleared.push(resolve));
    this.node.port.postMessage({ type: "clear" });
    return done;
  }

  // Samples of the current utterance the listener has heard by now: the worklet's reports placed on
  // the AudioContext's clock at the time the output device is playing (not when audio arrived).
  heard() {
    if (!this.context || !this.reports.length) return 0;
    const stamp = this.context.getOutputTimestamp ? this.context.getOutputTimestamp() : {};
    const now = stamp.contextTime > 0 ? stamp.contextTime : this.context.currentTime - (this.context.outputLatency || 0);
    const before = this.reports.filter((r) => r.time <= now);
    if (!before.length) return Math.max(0, this.reports[0].played - (this.reports[0].time - now) * this.rate);
    const last = before[before.length - 1];
    return last.played + Math.min(last.buffered, Math.max(0, (now - last.time) * this.rate));
  }

  stats(message) {
    if (message.reason === "clear") this.cleared.splice(0).forEach((resolve) => resolve(message.played));
    if (message.generation !== this.generation) return;
    this.played = message.played;
    this.buffered = message.buffered;
    this.reports.push({ played: message.played, buffered: message.buffered, time: message.time });
    if (this.reports.length > MAX_REPORTS) this.reports.shift();
    this.onStats(message);
  }

  // The samples played so far, in order, as a 16-bit mono WAV file.
  heardWav() {
    const heard = new Int16Array(this.played);
    let at = 0;
    for (const chunk of this.chunks) {
      if (at >= heard.length) break;
      const part = chunk.subarray(0, heard.length - at);
      heard.set(part, at);
      at += part.length;
    }
    return wavFile(heard, this.rate);
  }
}

export function wavFile(samples, rate) {
  const header = new DataView(new ArrayBuffer(44));
  const text = (offset, s) => [...s].forEach((c, i) => header.setUint8(offset + i, c.charCodeAt(0)));
  const bytes = samples.length * 2;
  text(0, "RIFF");
  header.setUint32(4, 36 + bytes, true);
  text(8, "WAVE");
  text(12, "fmt ");
  header.setUint32(16, 16, true);
  header.setUint16(20, 1, true); // PCM
  header.setUint16(22, 1, true); // mono
  header.setUint32(24, rate, true);
  header.setUint32(28, rate * 2, true);
  header.setUint16(32, 2, true);
  header.setUint16(34, 16, true);
  text(36, "data");
  header.setUint32(40, bytes, true);
  const body = new Int16Array(samples); // little-endian on every platform browsers run on
  return new Blob([header.buffer, body.buffer], { type: "audio/wav" });
}
