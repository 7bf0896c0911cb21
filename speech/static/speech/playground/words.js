// The words as they are heard: each segment's text with its words (audio.timestamps) as spans, the
// word under the playback position marked "current", those before it "heard"; after Stop, the
// server's account of what was heard and what was not (input.cancelled). Marks are classes and
// attributes a screen reader and the eye both get (underline, strike-through), never colour alone.

export class WordView {
  constructor(root, summary) {
    this.root = root; // the element the words go in
    this.summary = summary; // {box, spoken, unspoken}: shown after a Stop
    this.reset();
  }

  reset() {
    this.segments = []; // {index, text, start (ms in the utterance), span, charEnd (of its last word)}
    this.words = []; // every word in order: {key, start, end (ms in the utterance), span}
    this.next = 0; // the first word not heard yet: marks only move forward while a session plays
    this.current = null;
    this.stopped = false;
    this.highlights = []; // "segment:word" in the order words became current: for the browser tests
    this.shown = []; // the positions (ms) show() marked, in order, each once: for the browser tests
    this.root.replaceChildren();
    this.summary.box.hidden = true;
  }

  // A segment begins `start` ms into the utterance; its words come with its timestamps.
  segment(index, text, start) {
    const span = document.createElement("span");
    span.className = "segment";
    span.textContent = text;
    if (this.root.childNodes.length) this.root.append(" ");
    this.root.append(span);
    this.segments.push({ index, text, start, span, charEnd: 0, count: 0 });
  }

  // Timestamps: `sentence_text[char_start:char_end]` in code points (a Python slice), not UTF-16 units.
  timestamps(index, words) {
    const segment = this.segments.findLast((s) => s.index === index); // the last one, as a rule
    if (!segment) return;
    const chars = Array.from(segment.text);
    let at = segment.charEnd;
    const tail = segment.span.lastChild && segment.span.lastChild.nodeType === Node.TEXT_NODE ? segment.span.lastChild : null;
    if (tail) tail.remove(); // the text not yet cut into words
    for (const word of words) {
      segment.span.append(chars.slice(at, word.char_start).join(""));
      const span = document.createElement("span");
      span.className = "word";
      span.textContent = chars.slice(word.char_start, word.char_end).join("");
      const start = segment.start + word.start_ms; // ms into the utterance
      const end = segment.start + word.end_ms;
      Object.assign(span.dataset, { start, end });
      segment.span.append(span);
      this.words.push({ key: `${index}:${segment.count}`, start, end, span });
      segment.count += 1;
      at = word.char_end;
    }
    segment.charEnd = at;
    segment.span.append(chars.slice(at).join(""));
  }

  // `ms` of the utterance played: words that ended by then are heard, the one playing is current.
  show(ms) {
    if (this.stopped) return;
    if (this.words.length && ms !== this.shown.at(-1)) this.shown.push(ms); // one entry per played position
    while (this.next < this.words.length && this.words[this.next].end <= ms) {
      this.words[this.next].span.classList.add("heard");
      this.next += 1;
    }
    const word = this.words[this.next];
    const current = word && word.start <= ms ? word : null;
    if (current === this.current) return;
    this.unmark();
    if (current) {
      current.span.classList.add("current");
      current.span.setAttribute("aria-current", "true");
      this.highlights.push(current.key);
    }
    this.current = current;
  }

  unmark() {
    if (this.current) {
      this.current.span.classList.remove("current");
      this.current.span.removeAttribute("aria-current");
    }
    this.current = null;
  }

  // `playedMs`: where the player stopped, in this view's timeline (the server's figure may differ by
  // the codec frames' padding).
  heard(event, playedMs) {
    this.stopped = true;
    this.unmark();
    for (const word of this.words) {
      const heard = word.end <= playedMs; // the server's rule
      word.span.classList.toggle("heard", heard);
      word.span.classList.toggle("unheard", !heard);
    }
    this.summary.spoken.textContent = event.spoken_text || "(nothing)";
    this.summary.unspoken.textContent = event.unspoken_text || "(nothing)";
    this.summary.box.hidden = false;
  }
}
