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
    this.segments = []; // {index, start (ms in the utterance), words: [{start, end, span}]}
    this.current = null;
    this.stopped = false;
    this.highlights = []; // "segment:word" in the order words became current: for the browser tests
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
    this.segments.push({ index, text, start, span, words: [] });
  }

  // Timestamps: `sentence_text[char_start:char_end]` in code points (a Python slice), not UTF-16 units.
  timestamps(index, words) {
    const segment = this.segments.find((s) => s.index === index);
    if (!segment) return;
    const chars = Array.from(segment.text);
    let at = segment.words.length ? segment.words[segment.words.length - 1].charEnd : 0;
    const tail = segment.span.lastChild && segment.span.lastChild.nodeType === Node.TEXT_NODE ? segment.span.lastChild : null;
    if (tail) tail.remove(); // the text not yet cut into words
    for (const word of words) {
      segment.span.append(chars.slice(at, word.char_start).join(""));
      const span = document.createElement("span");
      span.className = "word";
      span.textContent = chars.slice(word.char_start, word.char_end).join("");
      span.dataset.start = segment.start + word.start_ms; // ms into the utterance
      span.dataset.end = segment.start + word.end_ms;
      segment.span.append(span);
      segment.words.push({ start: word.start_ms, end: word.end_ms, charEnd: word.char_end, span });
      at = word.char_end;
    }
    segment.span.append(chars.slice(at).join(""));
  }

  // `ms` of the utterance played: words that ended by then are heard, the one playing is current.
  show(ms) {
    if (this.stopped) return;
    let current = null;
    for (const segment of this.segments) {
      segment.words.forEach((word, i) => {
        const heard = segment.start + word.end <= ms;
        const playing = !heard && segment.start + word.start <= ms;
        word.span.classList.toggle("heard", heard);
        if (playing) current = { key: `${segment.index}:${i}`, span: word.span };
      });
    }
    if ((current && current.key) === (this.current && this.current.key)) return;
    if (this.current) { this.current.span.classList.remove("current"); this.current.span.removeAttribute("aria-current"); }
    if (current) {
      current.span.classList.add("current");
      current.span.setAttribute("aria-current", "true");
      this.highlights.push(current.key);
    }
    this.current = current;
  }

  // After Stop: the server's split of the text (input.cancelled), and the words not heard struck through;
  // the marks no longer follow the player.
  // `playedMs`: where the player stopped, in this view's timeline (the server's figure may differ by
  // the codec frames' padding).
  heard(event, playedMs) {
    this.stopped = true;
    if (this.current) { this.current.span.classList.remove("current"); this.current.span.removeAttribute("aria-current"); }
    this.current = null;
    for (const segment of this.segments) {
      for (const word of segment.words) {
        const heard = segment.start + word.end <= playedMs; // the server's rule
        word.span.classList.toggle("heard", heard);
        word.span.classList.toggle("unheard", !heard);
      }
    }
    this.summary.spoken.textContent = event.spoken_text || "(nothing)";
    this.summary.unspoken.textContent = event.unspoken_text || "(nothing)";
    this.summary.box.hidden = false;
  }
}
