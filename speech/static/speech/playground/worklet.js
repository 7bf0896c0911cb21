// Plays mono float samples posted by the page, gapless, at the AudioContext's rate.
// It reports how many samples it has played and how many wait in its queue, so the page (and its
// tests) know what was actually heard; "clear" drops the queue at once (the Stop button).

const REPORT_EVERY_S = 0.02;

class PcmPlayer extends AudioWorkletProcessor {
  constructor() {
    super();
    this.queue = [];
    this.offset = 0; // read position in queue[0]
    this.buffered = 0;
    this.played = 0;
    this.generation = 0;
    this.sinceReport = 0;
    this.port.onmessage = (event) => this.command(event.data);
  }

  command(message) {
    if (message.type === "samples") {
      if (message.generation !== this.generation) return; // audio of an utterance already stopped
      this.queue.push(message.samples);
      this.buffered += message.samples.length;
      return;
    }
    // "clear" drops what is queued; "reset" also starts a new utterance's count.
    this.queue = [];
    this.offset = 0;
    this.buffered = 0;
    if (message.type === "reset") {
      this.played = 0;
      this.generation = message.generation;
    }
    this.report(message.type);
  }

  // `time`: when, on the AudioContext clock, the output reaches the `played` samples.
  report(reason, time = currentTime) {
    this.sinceReport = 0;
    this.port.postMessage({ type: "stats", reason, generation: this.generation, played: this.played,
                            buffered: this.buffered, time });
  }

  process(inputs, outputs) {
    const out = outputs[0][0];
    let filled = 0;
    while (filled < out.length && this.queue.length) {
      const head = this.queue[0];
      const n = Math.min(out.length - filled, head.length - this.offset);
      out.set(head.subarray(this.offset, this.offset + n), filled);
      filled += n;
      this.offset += n;
      if (this.offset === head.length) {
        this.queue.shift();
        this.offset = 0;
      }
    }
    out.fill(0, filled); // an underrun is silence, never a repeat
    if (filled) {
      this.played += filled;
      this.buffered -= filled;
      this.sinceReport += out.length;
      if (this.buffered === 0 || this.sinceReport >= REPORT_EVERY_S * sampleRate) {
        this.report("played", currentTime + filled / sampleRate);
      }
    }
    return true;
  }
}

registerProcessor("pcm-player", PcmPlayer);
