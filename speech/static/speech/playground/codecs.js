// Streamed mp3, opus and aac (docs/protocol.md, streamed compressed audio) decoded by the browser's
// WebCodecs AudioDecoder. The session's binary frames are one stream: MP3 frames, ADTS AAC frames, or
// one Ogg Opus stream (its two header pages first). They are cut here into the codec's own packets,
// each fed to the decoder as one chunk; every packet says how many samples it decodes to, so the page
// knows where each segment begins in the audio before the decoder has produced it.

export const STREAMED = ["mp3", "opus", "aac"];
const CODECS = { mp3: "mp3", opus: "opus", aac: "mp4a.40.2" }; // AAC without a description: ADTS

// MPEG-1 and MPEG-2/2.5 layer III bit rates (kbit/s) by index; sample rates by version and index.
const MP3_KBPS = [
  [0, 32, 40, 48, 56, 64, 80, 96, 112, 128, 160, 192, 224, 256, 320],
  [0, 8, 16, 24, 32, 40, 48, 56, 64, 80, 96, 112, 128, 144, 160],
];
const MP3_RATES = { 3: [44100, 48000, 32000], 2: [22050, 24000, 16000], 0: [11025, 12000, 8000] };

// One MP3 frame at `at`: {size, samples}, or null when the bytes there are not a frame header.
function mp3Frame(bytes, at) {
  if (bytes[at] !== 0xff || (bytes[at + 1] & 0xe6) !== 0xe2) return null; // sync, layer III
  const version = (bytes[at + 1] >> 3) & 3; // 3: MPEG-1, 2: MPEG-2, 0: MPEG-2.5
  const kbps = MP3_KBPS[version === 3 ? 0 : 1][bytes[at + 2] >> 4];
  const rate = (MP3_RATES[version] || [])[(bytes[at + 2] >> 2) & 3];
  if (!kbps || !rate) return null;
  const padding = (bytes[at + 2] >> 1) & 1;
  const perFrame = version === 3 ? 1152 : 576;
  return { size: Math.floor(((perFrame / 8) * kbps * 1000) / rate) + padding, samples: perFrame };
}

// One ADTS AAC frame at `at` (ISO/IEC 13818-7): {size, samples}, or null.
function adtsFrame(bytes, at) {
  if (bytes[at] !== 0xff || (bytes[at + 1] & 0xf6) !== 0xf0) return null;
  const size = ((bytes[at + 3] & 3) << 11) | (bytes[at + 4] << 3) | (bytes[at + 5] >> 5);
  return size >= 7 ? { size, samples: 1024 * ((bytes[at + 6] & 3) + 1) } : null;
}

// Samples at 48 kHz an Opus packet decodes to, from its TOC byte (RFC 6716, 3.1).
export function opusSamples(packet) {
  const config = packet[0] >> 3;
  const tenths = config < 12 ? [100, 200, 400, 600][config & 3] // SILK: 10, 20, 40, 60 ms
    : config < 16 ? [100, 200][config & 1] // hybrid: 10, 20 ms
      : [25, 50, 100, 200][config & 3]; // CELT: 2.5, 5, 10, 20 ms
  const code = packet[0] & 3;
  const frames = code === 0 ? 1 : code < 3 ? 2 : packet[1] & 0x3f;
  return (frames * tenths * 48) / 10;
}

// Packets of an Ogg stream, page by page (RFC 3533): a packet may run on over several pages.
export class OggPackets {
  constructor() {
    this.pending = new Uint8Array(0); // bytes of an incomplete page
    this.packet = []; // parts of a packet that runs on into the next page
  }

  push(bytes) {
    const data = concat(this.pending, bytes);
    const packets = [];
    let at = 0;
    while (data.length - at >= 27) {
      if (data[at] !== 0x4f || data[at + 1] !== 0x67 || data[at + 2] !== 0x67 || data[at + 3] !== 0x53) {
        throw new Error("the opus stream is not an Ogg stream (no OggS page here)");
      }
      const count = data[at + 26];
      const lacing = data.subarray(at + 27, at + 27 + count);
      const size = lacing.reduce((sum, n) => sum + n, 0);
      if (lacing.length < count || data.length - at < 27 + count + size) break; // the page is not all here
      let body = at + 27 + count;
      for (const n of lacing) {
        this.packet.push(data.subarray(body, body + n));
        body += n;
        if (n < 255) packets.push(concat(...this.packet.splice(0)));
      }
      at = body;
    }
    this.pending = data.slice(at);
    return packets;
  }
}

function concat(...parts) {
  const out = new Uint8Array(parts.reduce((sum, p) => sum + p.length, 0));
  let at = 0;
  for (const part of parts) { out.set(part, at); at += part.length; }
  return out;
}

// A streamed session's audio decoded: push() takes a binary frame and says how many samples it will
// give; onSamples(Float32Array) gets them, in order; drain() resolves once all are out.
export class StreamDecoder {
  static supported() {
    return typeof AudioDecoder === "function";
  }

  constructor(format, rate, onSamples) {
    this.format = format;
    this.rate = rate;
    this.onSamples = onSamples;
    this.time = 0; // µs: the next chunk's timestamp
    this.frame = 0; // samples of a codec frame (the largest packet seen)
    this.failure = null;
    this.ogg = format === "opus" ? new OggPackets() : null;
    this.headers = 0; // Ogg Opus header packets seen (OpusHead, OpusTags)
    this.pending = new Uint8Array(0); // bytes of an incomplete MP3 / ADTS frame
    this.decoder = new AudioDecoder({
      output: (data) => this.output(data),
      error: (error) => { this.failure = error; },
    });
    if (format !== "opus") this.decoder.configure({ codec: CODECS[format], sampleRate: rate, numberOfChannels: 1 });
  }

  // One binary frame: the samples its packets decode to (at the session's rate).
  push(bytes) {
    this.check();
    let samples = 0;
    for (const [packet, n] of this.packets(new Uint8Array(bytes))) {
      this.decoder.decode(new EncodedAudioChunk({ type: "key", timestamp: this.time, data: packet }));
      this.time += (1e6 * n) / this.rate;
      this.frame = Math.max(this.frame, n);
      samples += n;
    }
    return samples;
  }

  * packets(bytes) {
    if (this.ogg) {
      for (const packet of this.ogg.push(bytes)) {
        if (this.headers === 0) { // OpusHead: the decoder's description (RFC 7845, 5.1)
          this.decoder.configure({ codec: "opus", sampleRate: 48000, numberOfChannels: 1, description: packet });
        }
        if (this.headers < 2) { this.headers += 1; continue; }
        yield [packet, opusSamples(packet)];
      }
      return;
    }
    const data = concat(this.pending, bytes);
    const frameAt = this.format === "mp3" ? mp3Frame : adtsFrame;
    let at = 0;
    while (data.length - at >= 7) {
      const frame = frameAt(data, at);
      if (!frame) throw new Error(`the ${this.format} stream has no frame header where one should be`);
      if (data.length - at < frame.size) break;
      yield [data.slice(at, at + frame.size), frame.samples];
      at += frame.size;
    }
    this.pending = data.slice(at);
  }

  output(data) {
    const samples = new Float32Array(data.numberOfFrames);
    data.copyTo(samples, { planeIndex: 0, format: "f32-planar" });
    data.close();
    this.onSamples(samples);
  }

  // Every chunk pushed so far is decoded and handed on (the end of a session's audio).
  async drain() {
    try {
      if (this.decoder.state === "configured") await this.decoder.flush();
    } catch (error) {
      if (this.decoder.state !== "closed") throw error; // closed by a Stop: nothing more is wanted
    }
    this.check();
  }

  check() {
    if (this.failure) throw new Error(`the browser could not decode the ${this.format} stream: ${this.failure.message}`);
  }

  close() {
    if (this.decoder.state !== "closed") this.decoder.close();
  }
}
