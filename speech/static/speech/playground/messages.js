// Server errors and close codes in words a person understands (the contract's messages are
// precise but written for programs). The server's own message is always kept at the end.

const QUEUE_FULL = "The request queue is full.";

export function describeError(event) {
  const message = event.message || "unknown error";
  switch (event.error_type) {
    case "authentication_error":
      return "The server did not accept the API key (or the token made from it). Enter a valid key and try again.";
    case "rate_limit_error":
      return `Too many sessions are open with this key at once. Wait for one to end, then try again. (${message})`;
    case "server_error":
      if (message === QUEUE_FULL) return "The server is busy: its synthesis queue is full. Try again in a moment.";
      return `The server could not make this audio. (${message})`;
    default: {
      const which = event.sentence_index === undefined ? "" : ` Sentence ${event.sentence_index} was skipped.`;
      return `The server refused part of the request: ${message}.${which}`;
    }
  }
}

const CLOSES = {
  1006: "The connection to the server was lost.",
  4001: "The server ended the session (an operator stopped it, its voice was removed, or the server is shutting down).",
  4008: "The server closed the session.",
  4009: "A message was too large for the server.",
  4011: "The server hit an internal error and closed the session.",
  4013: "The server is at capacity. Try again shortly.",
};

export function describeClose(code, reason) {
  if (code === 1000) return null;
  const words = CLOSES[code] || `The connection closed unexpectedly (code ${code}).`;
  return reason ? `${words} (${reason})` : words;
}

export const CANNOT_CONNECT = "Could not connect to the speech server: it is not reachable, or it refused this page.";

// A REST answer that is not OK, in words: the contract's envelope when there is one.
export async function describeResponse(response, what) {
  let message = `HTTP ${response.status}`;
  try {
    const body = await response.json();
    if (body && body.error && body.error.message) message = body.error.message;
  } catch (_) { /* not JSON: the status says enough */ }
  if (response.status === 401) return `The server did not accept the API key. Check it and enter it again. (${message})`;
  if (response.status === 403) return `The server does not allow this: ${message}.`;
  return `Could not ${what}: ${message}.`;
}

// Why this page cannot play, before anything is tried: browsers give the AudioWorklet it plays
// through only to secure contexts (HTTPS, or localhost on this machine).
export function insecureContext(host) {
  return `This page cannot play audio here: browsers allow its audio player (an AudioWorklet) only on `
    + `HTTPS pages or on localhost, and ${host} over plain HTTP is neither. Open it over HTTPS `
    + `(docs/deployment.md), or reach it through a tunnel to localhost, e.g. `
    + `ssh -L 8000:${host}:8000 that-machine, then http://localhost:8000/.`;
}

export const NOTHING_TO_SPEAK = "There is nothing to speak: type some words (the text has no letter or digit).";

// Any exception during Speak, in words: that it failed, then the browser's own message.
export function describeFailure(error) {
  const detail = error && error.message ? error.message : String(error);
  return `Speak failed in this page: ${detail}. Reload the page to try again.`;
}
