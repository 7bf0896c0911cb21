// G.711 decoding (ITU-T G.711, as in Sun's g711.c): one byte a sample to 16-bit PCM.

function mulawSample(byte) {
  const u = ~byte & 0xff;
  let t = ((u & 0x0f) << 3) + 0x84;
  t <<= (u & 0x70) >> 4;
  return u & 0x80 ? 0x84 - t : t - 0x84;
}

function alawSample(byte) {
  const a = byte ^ 0x55;
  let t = (a & 0x0f) << 4;
  const segment = (a & 0x70) >> 4;
  if (segment === 0) t += 8;
  else if (segment === 1) t += 0x108;
  else t = (t + 0x108) << (segment - 1);
  return a & 0x80 ? t : -t;
}

const MULAW = Int16Array.from({ length: 256 }, (_, i) => mulawSample(i));
const ALAW = Int16Array.from({ length: 256 }, (_, i) => alawSample(i));

export const decodeMulaw = (bytes) => Int16Array.from(bytes, (b) => MULAW[b]);
export const decodeAlaw = (bytes) => Int16Array.from(bytes, (b) => ALAW[b]);
