"use strict";
// The stare-agents rollout viewer. Data sits in <script type="application/json"> blocks: "meta" (overview),
// "prompts" (each distinct prompt once), one "step-NAME" per step and one "heldout-RUN-POINT" per held-out
// evaluation point, each parsed when first needed. Text is only ever inserted as text nodes, with every
// character that hides or reorders text (meta.invisible, the Python side's INVISIBLE_RANGES) shown as a chip.
(function () {
  const app = document.getElementById("app");
  const meta = JSON.parse(document.getElementById("meta").textContent);
  const cache = new Map();
  const PAGE = 100; // trajectories listed at a time
  const TOKEN_PAGE = 200; // tokens listed at a time
  const FILTERS = { rmin: "", rmax: "", stop: "", group: "", status: "", tool: "", q: "", sort: "",
    tscope: "", tstat: "", top: ">", tval: "" };
  const state = { step: null, prompt: null, heldout: null, tokens: false, open: null, tok: null, mode: "stare", scale: "log",
    limit: PAGE, tlimit: TOKEN_PAGE, hfilter: "", hq: "", ...FILTERS };

  // ---- text: every string goes in as text, its invisible characters made visible ----
  // C0 controls (but tab and newline) and DEL: their Unicode control pictures (U+2400...). Every other character
  // of meta.invisible: a chip naming the code point, so that text never renders reordered or hidden.
  const RANGES = meta.invisible || [];
  const HIDDEN = new RegExp("[" + RANGES.map(([lo, hi]) => "\\u{" + lo.toString(16) + "}-\\u{" + hi.toString(16) + "}").join("") + "]", "gu");
  function hex(code) { return code.toString(16).toUpperCase().padStart(4, "0"); }
  function nameOf(code) {
    const range = RANGES.find(([lo, hi]) => code >= lo && code <= hi);
    if (!range) return "";
    if (range[2] === "tag character" && code >= 0xe0020 && code <= 0xe007e) {
      return "tag character (hidden '" + String.fromCharCode(code - 0xe0000) + "')";
    }
    return range[2];
  }
  function glyph(c) {
    const code = c.codePointAt(0);
    if ((code < 0x20 && code !== 9 && code !== 10) || code === 0x7f) return String.fromCharCode(code === 0x7f ? 0x2421 : 0x2400 + code);
    const span = document.createElement("span");
    span.className = "ctl";
    span.title = "U+" + hex(code) + " " + nameOf(code) + " (shown, not applied)";
    span.textContent = "\u27e8U+" + hex(code) + "\u27e9";
    return span;
  }
  function textOf(text) {
    HIDDEN.lastIndex = 0;
    if (!HIDDEN.test(text)) return document.createTextNode(text);
    const fragment = document.createDocumentFragment();
    let last = 0;
    text.replace(HIDDEN, (c, at) => {
      if (at > last) fragment.append(text.slice(last, at));
      fragment.append(glyph(c));
      last = at + c.length;
      return c;
    });
    if (last < text.length) fragment.append(text.slice(last));
    return fragment;
  }

  // ---- the display cap: a long text or run of action tokens is drawn cut, with a marker and "show all" ----
  // only the drawing is cut: the data keeps everything (the search reads it) and "show all" draws the rest
  const CAP = meta.cap;
  function capMarker(hidden, unit, total, drawRest) {
    const marker = el("span", { class: "cap-marker", "data-hidden": hidden },
      "… " + hidden.toLocaleString("en") + " more " + unit + " hidden (" + total.toLocaleString("en") + " in all) ",
      el("button", { type: "button", class: "show-all", onclick: () => marker.replaceWith(drawRest()) }, "show all"));
    return marker;
  }
  function cappedText(text) { // a text of at most CAP.chars characters, then the marker
    const holder = el("span", { class: "capped" });
    if (text.length <= CAP.chars) { holder.append(textOf(text)); return holder; }
    const code = text.charCodeAt(CAP.chars - 1);
    const cut = code >= 0xd800 && code <= 0xdbff ? CAP.chars - 1 : CAP.chars; // never split a surrogate pair
    holder.append(textOf(text.slice(0, cut)),
      capMarker(text.length - cut, "characters", text.length, () => textOf(text.slice(cut))));
    return holder;
  }

  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [key, value] of Object.entries(attrs || {})) {
      if (value === null || value === undefined || value === false) continue;
      if (key === "class") node.className = value;
      else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
      else node.setAttribute(key, String(value));
    }
    for (const child of children) {
      if (child === null || child === undefined || child === false) continue;
      node.append(child instanceof Node ? child : textOf(String(child)));
    }
    return node;
  }
  const SVG = "http://www.w3.org/2000/svg";
  function svgOf(id, width, height) {
    const svg = document.createElementNS(SVG, "svg");
    svg.setAttribute("width", width); svg.setAttribute("height", height);
    if (id) svg.setAttribute("id", id);
    const add = (tag, attrs, text, parent) => {
      const node = document.createElementNS(SVG, tag);
      for (const [k, v] of Object.entries(attrs)) if (v !== null && v !== undefined) node.setAttribute(k, v);
      if (text !== undefined) node.textContent = text;
      (parent || svg).append(node);
      return node;
    };
    return [svg, add];
  }
  function fmt(x, digits) {
    if (x === null || x === undefined) return "-";
    if (typeof x === "number") return Number.isInteger(x) ? String(x) : x.toFixed(digits === undefined ? 3 : digits);
    return String(x);
  }
  function num(x) { // a tick label: 3 significant digits, no trailing zeros
    if (x === 0) return "0";
    const a = Math.abs(x);
    return a >= 1e4 || a < 1e-4 ? x.toExponential(1) : String(Number(x.toPrecision(3)));
  }
  function safeId(name) { return String(name).replace(/[^A-Za-z0-9_-]/g, "_"); }
  function block(id) {
    if (!cache.has(id)) {
      const node = document.getElementById(id);
      cache.set(id, node ? JSON.parse(node.textContent) : null);
    }
    return cache.get(id);
  }
  function stepData(name) { return block("step-" + safeId(name)); }
  function prompts() { return block("prompts") || { text: [], task: [], steps: [] }; }
  function promptText(t) { return t.prompt !== undefined ? t.prompt : prompts().text[t.p]; }
  function link(params) { return "#" + new URLSearchParams(params).toString(); }
  function isNum(v) { return typeof v === "number" && Number.isFinite(v); }

  // ---- routing: #step=NAME[&traj=I[&tok=J]], #prompt=P, #heldout[=TASK] ----
  function readHash() {
    const params = new URLSearchParams(location.hash.slice(1));
    const step = params.get("step"), prompt = params.get("prompt"), traj = params.get("traj"), tok = params.get("tok");
    if (step !== state.step && !(step === null && params.has("tokens"))) Object.assign(state, FILTERS, { limit: PAGE, tlimit: TOKEN_PAGE });
    state.step = step;
    state.prompt = prompt === null ? null : Number(prompt);
    state.heldout = params.get("heldout");
    state.tokens = params.has("tokens");
    state.open = traj === null ? null : Number(traj);
    state.tok = tok === null ? null : Number(tok);
  }
  window.addEventListener("hashchange", () => { readHash(); render(); });

  // ---- the entropy curve: axes, ticks, the target band; trained batch and all sampled, of each run ----
  function ticks(lo, hi, count) {
    const span = hi - lo || 1, raw = span / count, power = Math.pow(10, Math.floor(Math.log10(raw)));
    const step = [1, 2, 5, 10].map((m) => m * power).find((s) => span / s <= count) || 10 * power;
    const out = [];
    for (let v = Math.ceil(lo / step) * step; v <= hi + step * 1e-9; v += step) out.push(Number(v.toPrecision(12)));
    return out;
  }
  const RUN_COLOURS = { A: ["#0b5cad", "#d46a00"], B: ["#7b2cbf", "#2a9d8f"] };
  function curve() {
    const runs = (meta.runs && meta.runs.length ? meta.runs : [{ run: "A", title: meta.title, curve: meta.curve, target: meta.target }]);
    const series = [];
    for (const r of runs) {
      const suffix = r.run === "A" ? "" : "-b", prefix = runs.length > 1 ? r.title + ": " : "";
      const [trainedColour, allColour] = RUN_COLOURS[r.run];
      series.push({ name: "all" + suffix, points: r.curve.filter((p) => isNum(p.all)), value: (p) => p.all, colour: allColour,
        label: prefix + "all sampled trajectories", dash: r.run === "B" ? "6 3" : null });
      series.push({ name: "trained" + suffix, points: r.curve.filter((p) => isNum(p.entropy)), value: (p) => p.entropy, colour: trainedColour,
        label: prefix + "trained batch (the gate's input)", dash: r.run === "B" ? "6 3" : null });
    }
    if (!series.some((s) => s.points.length)) return null;
    const W = 680, H = 230 + (runs.length > 1 ? 18 : 0), left = 56, right = 16, top = 26 + (runs.length > 1 ? 18 : 0), bottom = 40;
    const target = runs[0].target, band = meta.band || 0.3;
    const steps = series.flatMap((s) => s.points.map((p) => p.step));
    const values = series.flatMap((s) => s.points.map(s.value));
    if (target !== null && target !== undefined) values.push(target * (1 + band));
    const x0 = Math.min(...steps), x1 = Math.max(...steps, x0 + 1);
    const y0 = 0, y1 = Math.max(...values, 1e-6) * 1.08;
    const x = (s) => left + ((s - x0) / (x1 - x0)) * (W - left - right);
    const y = (v) => H - bottom - ((v - y0) / (y1 - y0)) * (H - top - bottom);
    const [svg, add] = svgOf("entropy-curve", W, H);
    if (target !== null && target !== undefined) {
      add("rect", { class: "target-band", x: left, width: W - left - right, y: y(target * (1 + band)),
        height: y(target * (1 - band)) - y(target * (1 + band)), fill: "#2ca02c", "fill-opacity": 0.12,
        "data-low": target * (1 - band), "data-high": target * (1 + band) });
      add("line", { class: "target", x1: left, x2: W - right, y1: y(target), y2: y(target), stroke: "#2ca02c", "stroke-dasharray": "5 4" });
      add("text", { x: W - right - 4, y: y(target) - 4, fill: "#2ca02c", "font-size": 11, "text-anchor": "end" },
        "target " + num(target) + " (band ±" + Math.round(band * 100) + "%)");
    }
    const xAxis = add("g", { class: "x-axis" }), yAxis = add("g", { class: "y-axis" });
    add("line", { x1: left, x2: W - right, y1: H - bottom, y2: H - bottom, stroke: "#888" }, undefined, xAxis);
    add("line", { x1: left, x2: left, y1: top, y2: H - bottom, stroke: "#888" }, undefined, yAxis);
    for (const s of ticks(x0, x1, 8).filter((v) => Number.isInteger(v))) {
      add("line", { x1: x(s), x2: x(s), y1: H - bottom, y2: H - bottom + 4, stroke: "#888" }, undefined, xAxis);
      add("text", { class: "tick", x: x(s), y: H - bottom + 15, "font-size": 10, "text-anchor": "middle", fill: "#555" }, String(s), xAxis);
    }
    for (const v of ticks(y0, y1, 5)) {
      add("line", { x1: left - 4, x2: W - right, y1: y(v), y2: y(v), stroke: "#eee" }, undefined, yAxis);
      add("text", { class: "tick", x: left - 6, y: y(v) + 3, "font-size": 10, "text-anchor": "end", fill: "#555" }, num(v), yAxis);
    }
    add("text", { class: "label", x: (left + W - right) / 2, y: H - 6, "font-size": 11, "text-anchor": "middle", fill: "#333" }, "RL step", xAxis);
    add("text", { class: "label", x: 12, y: (top + H - bottom) / 2, "font-size": 11, "text-anchor": "middle", fill: "#333",
      transform: "rotate(-90 12 " + (top + H - bottom) / 2 + ")" }, "entropy (nats)", yAxis);
    let legendX = left, legendY = 16;
    for (const s of series) {
      const text = s.points.length ? s.label : s.label + ": not logged";
      if (s.points.length) {
        add("polyline", { class: s.name, points: s.points.map((p) => x(p.step) + "," + y(s.value(p))).join(" "), fill: "none", stroke: s.colour, "stroke-width": 2, "stroke-dasharray": s.dash });
        for (const p of s.points) add("circle", { class: s.name, cx: x(p.step), cy: y(s.value(p)), r: 3, fill: s.colour, "data-step": p.step, "data-value": s.value(p) });
      }
      if (legendX + 30 + text.length * 5.6 > W) { legendX = left; legendY += 18; }
      add("line", { x1: legendX, x2: legendX + 16, y1: legendY - 4, y2: legendY - 4, stroke: s.points.length ? s.colour : "#bbb", "stroke-width": 2, "stroke-dasharray": s.dash });
      const legend = add("text", { class: "legend " + s.name, x: legendX + 20, y: legendY, "font-size": 11, fill: s.points.length ? "#333" : "#999" }, text);
      legendX += 30 + text.length * 5.6;
      legend.dataset.series = s.name;
    }
    return svg;
  }

  function overview() {
    const head = el("tr", {}, el("th", { class: "l" }, "step"), el("th", {}, "saved"));
    for (const title of Object.values(meta.columns)) head.append(el("th", {}, title));
    head.append(el("th", { title: "the lowest surprisal among the step's selected L+ tokens" }, "L+ cut-off"));
    head.append(el("th", { class: "l" }, "statuses"));
    const rows = meta.overview.map((row) => {
      const tr = el("tr", { "data-step": row.step, class: row.step === state.step ? "open" : null },
        el("td", { class: "l" }, el("a", { href: link({ step: row.step }), class: "step-link" }, row.step)),
        el("td", {}, row.saved));
      for (const key of Object.keys(meta.columns)) {
        const value = row[key];
        if (key === "stare/gate_on" && value !== null && value !== undefined) {
          tr.append(el("td", { class: value ? "gate-on" : "gate-off" }, value ? "on" : "off"));
        } else tr.append(el("td", {}, fmt(value)));
      }
      const cut = row.cut || {};
      tr.append(el("td", { class: "cut" }, cut["+"] === undefined ? "-" : "s ≥ " + cut["+"].toFixed(3)));
      tr.append(el("td", { class: "l muted" }, Object.entries(row.statuses).map(([k, v]) => k + " " + v).join(", ")));
      return tr;
    });
    return el("div", {},
      el("h2", {}, "Steps"),
      curve(),
      el("div", { class: "scroll" }, el("table", { id: "overview" }, el("thead", {}, head), el("tbody", {}, ...rows))));
  }

  // ---- per-token colourings and their scales ----
  const MODES = {
    stare: { label: "STARE weight" },
    surprisal: { label: "surprisal -log π", key: "s", lo: 1e-3, hi: 10, rgb: [255, 127, 14], unit: "nats" },
    entropy: { label: "entropy H", key: "h", lo: 1e-3, hi: 10, rgb: [148, 103, 189], unit: "nats" },
    mismatch: { label: "mismatch (log π learner - rollout)", key: "d", lo: 1e-4, hi: 1, rgb: [31, 119, 180],
      neg: [214, 39, 40], unit: "nats", signed: true, sides: ["learner < rollout", "learner > rollout"] },
    phi: { label: "Φ (entropy sensitivity)", key: "phi", lo: 1e-4, hi: 1, rgb: [140, 86, 75], neg: [23, 190, 207],
      unit: "nats", signed: true, sides: ["Φ < 0: reinforcing it raises the entropy", "Φ > 0: reinforcing it lowers the entropy"] },
  };
  const FIELD = { entropy: "entropy", mismatch: "learner", phi: "phi" };
  const quantiles = new Map(); // "view|mode" -> sorted |values| of the shown action tokens
  function viewKey() {
    return state.heldout !== null ? "heldout " + state.heldout : state.prompt !== null ? "prompt " + state.prompt : "step " + state.step;
  }
  function sortedValues(rows, mode) {
    const cacheKey = viewKey() + "|" + mode;
    if (!quantiles.has(cacheKey)) {
      const key = MODES[mode].key, values = [];
      for (const t of rows) {
        const list = t[key];
        if (!list) continue;
        for (let j = 0; j < t.m.length; j++) if (t.m[j] === "1" && isNum(list[j])) values.push(Math.abs(list[j]));
      }
      quantiles.set(cacheKey, Float64Array.from(values).sort());
    }
    return quantiles.get(cacheKey);
  }
  function bound(sorted, v, strict) { // the number of entries < v (strict) or <= v
    let lo = 0, hi = sorted.length;
    while (lo < hi) { const mid = (lo + hi) >> 1; if (strict ? sorted[mid] < v : sorted[mid] <= v) lo = mid + 1; else hi = mid; }
    return lo;
  }
  // where a value sits on the current scale, in [0, 1]: log (fixed decades) or quantile (of the shown view)
  function position(mode, value, rows) {
    const m = MODES[mode], v = Math.abs(value);
    if (state.scale === "quantile") {
      const sorted = sortedValues(rows, mode);
      if (!sorted.length) return 0;
      return (bound(sorted, v, true) + bound(sorted, v, false)) / 2 / sorted.length;
    }
    if (!(v > 0)) return 0;
    return Math.min(1, Math.max(0, (Math.log10(v) - Math.log10(m.lo)) / (Math.log10(m.hi) - Math.log10(m.lo))));
  }
  function rgba(mode, value, frac) {
    const m = MODES[mode], rgb = m.signed && value < 0 ? m.neg : m.rgb;
    return "rgba(" + rgb.join(", ") + ", " + (frac * 0.9).toFixed(3) + ")";
  }
  function shownRows() {
    if (state.heldout !== null) return heldoutRows(state.heldout).map((x) => x.t);
    if (state.prompt !== null) return promptRows().map((x) => x.t);
    return stepData(state.step) || [];
  }

  function scaleLegend() {
    const holder = el("div", { id: "scale-box" });
    const mode = state.mode;
    if (mode === "stare") {
      holder.append(el("div", { class: "legend muted" },
        el("span", { class: "t lplus" }, "L+ amplified"), el("span", { class: "t lminus" }, "L- attenuated"),
        el("span", { class: "t would" }, "selected, not reweighted (gate off / O1)"),
        el("span", { class: "obs" }, "observation (not trained)")));
      return holder;
    }
    const m = MODES[mode], rows = shownRows();
    const present = rows.some((t) => t[m.key]);
    if (!present) {
      const why = {
        entropy: "per-token entropy is not in these rollout files: the trainer saves it when the learner records it " +
          "(SavedRollout.learner_entropy); nothing is coloured",
        mismatch: "no trajectory shown here has the learner's log-probs (only trajectories the learner scored do): " +
          "the mismatch cannot be shown; nothing is coloured",
        phi: "per-token Φ is not in these rollout files: the trainer saves it when the learner records it " +
          "(SavedRollout.learner_phi); nothing is coloured",
        surprisal: "no token texts saved; nothing is coloured",
      }[mode];
      holder.append(el("div", { id: "field-note", class: "notices" }, why));
      return holder;
    }
    const signed = Boolean(m.signed);
    const W = signed ? 720 : 520, H = signed ? 64 : 52, left = 22, right = 44, barY = signed ? 28 : 16, barH = 12, cells = 96;
    const [svg, add] = svgOf("scale", W, H);
    svg.dataset.mode = mode; svg.dataset.scale = state.scale;
    const width = W - left - right;
    // unsigned: one bar, 0 -> 1; signed: the negative side mirrored on the left half, the positive on the right
    const x = signed ? (frac, sign) => left + width / 2 + sign * frac * (width / 2) : (frac) => left + frac * width;
    const sides = signed ? [-1, 1] : [1];
    for (const sign of sides) {
      for (let k = 0; k < cells; k++) {
        const a = x(k / cells, sign), b = x((k + 1) / cells, sign);
        add("rect", { class: "cell", x: Math.min(a, b), y: barY, width: Math.abs(b - a) + 0.5, height: barH, fill: rgba(mode, sign, (k + 0.5) / cells) });
      }
    }
    add("rect", { x: left, y: barY, width, height: barH, fill: "none", stroke: "#999" });
    if (signed) {
      add("line", { x1: x(0, 1), x2: x(0, 1), y1: barY - 2, y2: barY + barH + 2, stroke: "#333" });
      add("text", { class: "side", x: x(0, -1) - 4, y: barY - 14, "font-size": 10, "text-anchor": "end", fill: "rgb(" + m.neg.join(",") + ")" }, m.sides[0]);
      add("text", { class: "side", x: x(0, 1) + 4, y: barY - 14, "font-size": 10, "text-anchor": "start", fill: "rgb(" + m.rgb.join(",") + ")" }, m.sides[1]);
    }
    let marks;
    if (state.scale === "quantile") {
      const sorted = sortedValues(rows, mode);
      marks = [0, 0.25, 0.5, 0.75, 0.9, 0.99, 1].map((q) => ({
        frac: q, value: sorted.length ? sorted[Math.min(sorted.length - 1, Math.floor(q * (sorted.length - 1) + 0.5))] : 0,
        top: q === 0 ? "min" : q === 1 ? "max" : "p" + Math.round(q * 100),
        anchor: q === 1 ? "start" : q === 0.99 ? "end" : "middle", // p99 and max sit 1% apart: side by side
      }));
    } else {
      marks = [];
      for (let e = Math.log10(m.lo); e <= Math.log10(m.hi) + 1e-9; e++) {
        const value = Math.pow(10, e);
        marks.push({ frac: position(mode, value, rows), value, top: null });
      }
    }
    // a signed scale mirrors its marks: -hi ... ±lo (the centre, once) ... hi
    const drawn = [];
    for (const sign of sides) {
      for (const mark of marks) {
        if (signed && mark.frac === 0 && sign < 0) continue;
        const label = (signed && mark.frac === 0 ? "±" : sign < 0 ? "-" : "") + num(mark.value);
        drawn.push({ ...mark, sign, label, value: sign * mark.value });
      }
    }
    drawn.sort((a, b) => x(a.frac, a.sign) - x(b.frac, b.sign));
    for (const mark of drawn) {
      const anchor = signed ? "middle" : mark.anchor || "middle";
      const at = x(mark.frac, mark.sign), shift = anchor === "start" ? 2 : anchor === "end" ? -2 : 0;
      add("line", { x1: at, x2: at, y1: barY + barH, y2: barY + barH + 4, stroke: "#555" });
      add("text", { class: "tick", x: at + shift, y: barY + barH + 15, "font-size": 9, "text-anchor": anchor, fill: "#333", "data-value": mark.value }, mark.label);
      if (mark.top) add("text", { class: "quantile", x: at + shift, y: barY - 3, "font-size": 9, "text-anchor": anchor, fill: "#777" }, (signed && mark.sign < 0 ? "-" : "") + mark.top);
    }
    const cut = mode === "surprisal" && state.prompt === null && state.heldout === null ? (stepRow() || {}).cut || {} : {};
    for (const [sign, colour] of [["+", "#2ca02c"], ["-", "#d62728"]]) {
      if (cut[sign] === undefined) continue;
      const at = x(position(mode, cut[sign], rows));
      add("line", { class: "cut", x1: at, x2: at, y1: barY - 4, y2: barY + barH + 2, stroke: colour, "stroke-width": 2, "data-value": cut[sign] });
      add("text", { x: at + (sign === "+" ? -2 : 2), y: 10, "font-size": 9, fill: colour, "text-anchor": sign === "+" ? "end" : "start" },
        "L" + sign + " ≥ " + num(cut[sign]));
    }
    const caption = (state.scale === "quantile" ? "quantile scale (of the action tokens shown, by magnitude)" : "log scale") +
      ", " + m.label + " in " + m.unit + (signed ? "; each side darker with the magnitude" : "; darker = higher");
    holder.append(svg, el("div", { class: "muted caption" }, caption));
    return holder;
  }
  function stepRow() { return meta.overview.find((row) => row.step === state.step); }

  // ---- token statistics of a trajectory and a step ----
  const STATS = {
    d: { label: "|mismatch|", unit: "nats", abs: true, lo: 1e-4, hi: 10 },
    h: { label: "entropy", unit: "nats", lo: 1e-4, hi: 100 },
    s: { label: "surprisal", unit: "nats", lo: 1e-4, hi: 100 },
    phi: { label: "Φ", unit: "", signed: true },
  };
  const summaries = new WeakMap();
  function summary(t) { // a trajectory's largest |mismatch|, entropy and surprisal, L+/L- counts, Φ < 0 share, tool errors
    if (!summaries.has(t)) {
      const out = { d: null, h: null, s: null, plus: 0, minus: 0, phiNeg: null, tools: 0 };
      let phiN = 0, phiNeg = 0;
      for (let j = 0; j < t.m.length; j++) {
        if (t.m[j] !== "1") continue;
        for (const key of ["d", "h", "s"]) {
          const v = t[key] ? t[key][j] : null;
          if (isNum(v) && (out[key] === null || Math.abs(v) > out[key])) out[key] = Math.abs(v);
        }
        if (t.sel) { if (t.sel[j] === "+") out.plus++; else if (t.sel[j] === "-") out.minus++; }
        if (t.phi && isNum(t.phi[j])) { phiN++; if (t.phi[j] < 0) phiNeg++; }
      }
      if (phiN) out.phiNeg = phiNeg / phiN;
      for (const turn of t.turns || []) for (const status of turn.statuses || []) if (status !== "ok") out.tools++;
      summaries.set(t, out);
    }
    return summaries.get(t);
  }
  // the token filter: which action tokens (all, L+ or L-) and a condition on one statistic
  function tokenFilterOn() { return state.tscope !== "" || (state.tstat !== "" && state.tval !== "" && isNum(Number(state.tval))); }
  // the current filter as one test of token j of trajectory t (made once per filter: a step has 10^5 tokens)
  let compiled = { key: null, test: null };
  function tokenTest() {
    const key = filterKey();
    if (compiled.key !== key) {
      const scope = state.tscope, stat = state.tstat, bound = Number(state.tval);
      const on = stat !== "" && state.tval !== "" && isNum(bound), abs = on && STATS[stat].abs;
      const pass = { ">": (v) => v > bound, "≥": (v) => v >= bound, "<": (v) => v < bound, "≤": (v) => v <= bound }[state.top] || ((v) => v > bound);
      compiled = { key, test: (t, j) => {
        if (t.m[j] !== "1") return false;
        if (scope && !(t.sel && t.sel[j] === scope)) return false;
        if (!on) return true;
        const list = t[stat], raw = list ? list[j] : null;
        return isNum(raw) && pass(abs ? Math.abs(raw) : raw);
      } };
    }
    return compiled.test;
  }
  function tokenMatches(t, j) { return tokenTest()(t, j); }
  function filterKey() { return [state.tscope, state.tstat, state.top, state.tval].join("|"); }
  // the matching tokens of the current sources (one pass, kept for the latest filter) and their count per trajectory
  let hitCache = { key: null };
  function tokenHits() {
    const key = (state.tokens ? "all steps" : "step " + state.step) + "|" + filterKey();
    if (hitCache.key !== key) {
      const test = tokenTest(), hits = [], counts = new Map();
      for (const { step, rows } of tokenSources()) {
        for (const t of rows) {
          let n = 0;
          for (let j = 0; j < t.m.length; j++) if (test(t, j)) { hits.push([t, j, step]); n++; }
          counts.set(t, n);
        }
      }
      hitCache = { key, hits, counts };
    }
    return hitCache;
  }
  function matchCount(t) {
    const { counts } = tokenHits();
    if (counts.has(t)) return counts.get(t);
    const test = tokenTest(); // a trajectory of another view (not searched): counted on its own
    let n = 0;
    for (let j = 0; j < t.m.length; j++) if (test(t, j)) n++;
    return n;
  }

  // per-step histograms: log-spaced bins (4 a decade) of the action tokens' entropy, surprisal and |mismatch|
  function bins(lo, hi) {
    const edges = [0];
    for (let e = Math.log10(lo); e <= Math.log10(hi) + 1e-9; e += 0.25) edges.push(Math.pow(10, e));
    edges.push(Infinity);
    return edges;
  }
  const histograms = new Map(); // "sources|statistic" -> bins (a filter change redraws the charts, never recounts)
  function histogram(sources, key) {
    const cacheKey = sources.map((x) => x.step).join(",") + "|" + key;
    if (!histograms.has(cacheKey)) histograms.set(cacheKey, countBins(sources, key));
    return histograms.get(cacheKey);
  }
  function countBins(sources, key) {
    const stat = STATS[key], edges = bins(stat.lo, stat.hi);
    const pos = new Array(edges.length - 1).fill(0), neg = new Array(edges.length - 1).fill(0);
    let total = 0;
    for (const { rows } of sources) for (const t of rows) {
      const list = t[key];
      if (!list) continue;
      for (let j = 0; j < t.m.length; j++) {
        if (t.m[j] !== "1" || !isNum(list[j])) continue;
        const v = Math.abs(list[j]);
        let k = v < edges[1] ? 0 : Math.min(edges.length - 2, 1 + Math.floor((Math.log10(v) - Math.log10(stat.lo)) * 4 + 1e-9));
        while (k + 1 < edges.length - 1 && v >= edges[k + 1]) k++;
        while (k > 0 && v < edges[k]) k--;
        (list[j] < 0 ? neg : pos)[k]++;
        total++;
      }
    }
    return { edges, pos, neg, total };
  }
  function histogramChart(sources, key, cut) {
    const stat = STATS[key], hist = histogram(sources, key);
    const W = 370, H = 150, left = 36, right = 8, top = 18, bottom = 34;
    const box = el("div", { class: "hist-box", "data-stat": key });
    const title = el("div", { class: "hist-title" }, stat.label + " (" + stat.unit + ", log axis) · " + hist.total.toLocaleString("en") + " action tokens");
    if (!hist.total) {
      const where = sources.length === 1 ? "this step" : "these steps";
      const why = key === "d" ? "no learner log-probs in " + where + ": the mismatch is not known"
        : key === "h" ? "per-token entropy not saved in " + where : "no action tokens";
      box.append(title, el("div", { class: "muted hist-none" }, why));
      return box;
    }
    const [svg, add] = svgOf(null, W, H);
    svg.setAttribute("class", "hist");
    const n = hist.pos.length, width = (W - left - right) / n;
    const counts = hist.pos.map((p, k) => p + hist.neg[k]);
    const ymax = Math.log10(1 + Math.max(...counts));
    const y = (c) => H - bottom - (Math.log10(1 + c) / (ymax || 1)) * (H - top - bottom);
    for (let k = 0; k < n; k++) {
      const lo = hist.edges[k], hi = hist.edges[k + 1];
      const range = (k === 0 ? "< " + num(hi) : hi === Infinity ? "≥ " + num(lo) : num(lo) + " – " + num(hi)) + " " + stat.unit;
      const parts = [[hist.pos[k], key === "d" ? "rgb(31, 119, 180)" : key === "h" ? "rgb(148, 103, 189)" : "rgb(255, 127, 14)"]];
      if (key === "d") parts.push([hist.neg[k], "rgb(214, 39, 40)"]);
      let base = 0;
      for (const [count, colour] of parts) {
        if (!count) continue;
        add("rect", { x: left + k * width + 0.5, width: width - 1, y: y(base + count), height: y(base) - y(base + count), fill: colour });
        base += count;
      }
      // a transparent target over the whole column: click -> the token filter "statistic ≥ this bin's low edge"
      const hit = add("rect", { class: "bin", x: left + k * width, width, y: top, height: H - top - bottom, fill: "transparent",
        "data-lo": lo, "data-hi": hi === Infinity ? "inf" : hi, "data-count": counts[k], "data-neg": hist.neg[k] });
      add("title", {}, range + ": " + counts[k] + " tokens" + (key === "d" ? " (" + hist.neg[k] + " with learner < rollout)" : "") +
        (k > 0 ? "; click: tokens with " + stat.label + " ≥ " + num(lo) : ""), hit);
      if (k > 0) hit.addEventListener("click", () => setTokenFilter({ tscope: "", tstat: key, top: "≥", tval: String(Number(lo.toPrecision(6))) }));
    }
    add("line", { x1: left, x2: W - right, y1: H - bottom, y2: H - bottom, stroke: "#888" });
    for (let e = Math.log10(stat.lo); e <= Math.log10(stat.hi) + 1e-9; e++) {
      const k = 1 + Math.round((e - Math.log10(stat.lo)) * 4);
      add("text", { class: "tick", x: left + k * width, y: H - bottom + 12, "font-size": 9, "text-anchor": "middle", fill: "#555" }, num(Math.pow(10, e)));
    }
    add("text", { x: (left + W - right) / 2, y: H - 4, "font-size": 10, "text-anchor": "middle", fill: "#333" }, stat.label + (key === "d" ? " (blue: learner > rollout, red: <)" : ""));
    for (const c of [1, 10, 100, 1000, 10000, 100000].filter((c) => Math.log10(1 + c) <= ymax + 1e-9)) {
      add("text", { class: "ytick", x: left - 3, y: y(c) + 3, "font-size": 9, "text-anchor": "end", fill: "#777" }, c >= 1000 ? c / 1000 + "k" : String(c));
    }
    const xOf = (v) => { // where value v sits on the binned axis
      if (v < hist.edges[1]) return left + width / 2;
      return left + width * (1 + (Math.log10(v) - Math.log10(stat.lo)) * 4);
    };
    for (const [sign, colour] of [["+", "#2ca02c"], ["-", "#d62728"]]) {
      if (!cut || cut[sign] === undefined) continue;
      const at = Math.min(W - right, xOf(cut[sign]));
      add("line", { class: "cut", x1: at, x2: at, y1: top - 6, y2: H - bottom, stroke: colour, "stroke-width": 2, "data-value": cut[sign] });
      add("text", { x: at + (sign === "+" ? -2 : 2), y: top - 8, "font-size": 9, fill: colour, "text-anchor": sign === "+" ? "end" : "start" }, "L" + sign + " ≥ " + num(cut[sign]));
    }
    if (state.tstat === key && state.tval !== "" && isNum(Number(state.tval)) && Number(state.tval) > 0) {
      const at = Math.min(W - right, xOf(Math.abs(Number(state.tval))));
      add("line", { class: "threshold", x1: at, x2: at, y1: top, y2: H - bottom, stroke: "#111", "stroke-dasharray": "3 3" });
    }
    box.append(title, svg);
    return box;
  }

  // a change of the token filter redraws the charts and the results, never the controls (an edited value
  // commits on blur: the control must stay in place for the click that blurred it)
  function setTokenFilter(values) {
    Object.assign(state, values, { limit: PAGE, tlimit: TOKEN_PAGE });
    for (const [id, key] of [["t-scope", "tscope"], ["t-stat", "tstat"], ["t-op", "top"], ["t-val", "tval"]]) {
      const node = document.getElementById(id);
      if (node && node.value !== state[key]) node.value = state[key];
    }
    const clear = document.getElementById("t-clear");
    if (clear) clear.disabled = !tokenFilterOn();
    refreshTokens();
    if (state.step !== null && !state.tokens) list();
  }
  function refreshTokens() {
    const charts = document.getElementById("token-charts"), results = document.getElementById("token-results");
    if (charts) charts.replaceWith(tokenCharts());
    if (results) results.replaceWith(tokenTable());
  }
  // the tokens the finder searches: the open step's, or every step's (#tokens)
  function tokenSources() {
    if (state.tokens) return meta.overview.map((row) => ({ step: row.step, rows: stepData(row.step) || [] }));
    return [{ step: state.step, rows: stepData(state.step) || [] }];
  }
  const PRESETS = [
    ["mismatch > 0.1 nat", { tscope: "", tstat: "d", top: ">", tval: "0.1" }, "learner"],
    ["entropy > 1 nat", { tscope: "", tstat: "h", top: ">", tval: "1" }, "entropy"],
    ["L+ tokens", { tscope: "+", tstat: "", top: ">", tval: "" }, null],
    ["L- tokens", { tscope: "-", tstat: "", top: ">", tval: "" }, null],
    ["Φ < 0 among L+", { tscope: "+", tstat: "phi", top: "<", tval: "0" }, "phi"],
  ];
  function tokenCharts() {
    const sources = tokenSources();
    const cut = state.tokens ? null : (stepRow() || {}).cut || {}; // each step has its own cut-offs
    return el("div", { class: "hists", id: "token-charts" },
      histogramChart(sources, "h", null), histogramChart(sources, "s", cut), histogramChart(sources, "d", null));
  }
  function tokenPanel() {
    const select = (id, key, choices) => {
      const node = el("select", { id, onchange: (e) => setTokenFilter({ [key]: e.target.value }) });
      for (const [value, text] of choices) node.append(el("option", { value, selected: value === state[key] ? "selected" : null }, text));
      return node;
    };
    const presets = PRESETS.filter(([, , field]) => !field || meta.fields[field]).map(([text, values]) =>
      el("button", { type: "button", class: "preset", "data-preset": text, onclick: () => setTokenFilter(values) }, text));
    const controls = el("div", { class: "bar", id: "token-filter" },
      el("strong", {}, "find tokens"),
      el("label", {}, "among", select("t-scope", "tscope", [["", "all action tokens"], ["+", "L+ tokens"], ["-", "L- tokens"]])),
      el("label", {}, "where", select("t-stat", "tstat", [["", "(any)"], ["d", "|mismatch|"], ["h", "entropy"], ["s", "surprisal"], ["phi", "Φ"]])),
      select("t-op", "top", [[">", ">"], ["≥", "≥"], ["<", "<"], ["≤", "≤"]]),
      el("input", { id: "t-val", type: "number", step: "any", value: state.tval, placeholder: "value",
        onchange: (e) => setTokenFilter({ tval: e.target.value }) }),
      ...presets,
      el("button", { type: "button", id: "t-clear", disabled: !tokenFilterOn(), onclick: () => setTokenFilter({ tscope: "", tstat: "", tval: "" }) }, "clear"));
    return el("div", { id: "token-panel" }, tokenCharts(), controls, tokenTable());
  }
  function tokenTable() {
    if (!tokenFilterOn()) return el("div", { id: "token-results", class: "muted" }, "choose a threshold, a preset or a histogram bar to list tokens");
    const sources = tokenSources(), hits = tokenHits().hits.slice();
    const key = state.tstat || "s", desc = !state.tstat || state.top === ">" || state.top === "≥";
    const value = ([t, j]) => { const v = t[key] ? t[key][j] : null; return isNum(v) ? (STATS[key].abs ? Math.abs(v) : v) : null; };
    hits.sort((a, b) => {
      const va = value(a), vb = value(b);
      if (va === null || vb === null) return va === null ? (vb === null ? 0 : 1) : -1;
      return desc ? vb - va : va - vb;
    });
    const inTrajectories = new Set(hits.map(([t, , step]) => step + "/" + t.i)).size;
    const head = el("tr", {}, ...["step", "#", "at", "token (in context)", "status", "reward", "advantage", "surprisal", "entropy", "mismatch", "Φ", "weight"].map((h, k) => el("th", { class: k === 3 || k === 4 ? "l" : null }, h)));
    const body = el("tbody", {});
    for (const [t, j, step] of hits.slice(0, state.tlimit)) {
      const context = el("td", { class: "l ctx" });
      const before = [], after = [];
      for (let k = j - 1; k >= 0 && before.length < 4; k--) before.unshift(t.tok ? t.tok[k] : "");
      for (let k = j + 1; k < t.m.length && after.length < 4; k++) after.push(t.tok ? t.tok[k] : "");
      context.append(el("span", { class: "muted" }, before.join("")), el("span", { class: "hit" }, t.tok ? t.tok[j] : "#" + j), el("span", { class: "muted" }, after.join("")));
      const get = (k) => (t[k] ? fmt(t[k][j], 4) : "-");
      const target = link({ step, traj: t.i, tok: j });
      body.append(el("tr", { class: "tokrow", "data-step": step, "data-i": t.i, "data-j": j, onclick: (e) => { if (!e.target.closest("a")) location.hash = target; } },
        el("td", {}, step), el("td", {}, el("a", { href: target }, t.i)), el("td", {}, j), context,
        el("td", { class: "l" }, t.st), el("td", {}, fmt(t.r)), el("td", {}, fmt(t.a)),
        el("td", {}, get("s")), el("td", {}, get("h")), el("td", {}, get("d")), el("td", {}, get("phi")),
        el("td", {}, t.w ? fmt(t.w[j]) + (t.sel && t.sel[j] !== "0" ? " L" + t.sel[j] : "") : t.sel && t.sel[j] !== "0" ? "L" + t.sel[j] : "-")));
    }
    const more = hits.length > state.tlimit
      ? el("button", { id: "t-more", onclick: () => { state.tlimit += TOKEN_PAGE; refreshTokens(); } },
        "show " + Math.min(TOKEN_PAGE, hits.length - state.tlimit) + " more tokens") : null;
    return el("div", { id: "token-results" },
      el("div", { id: "t-count", class: "muted" }, hits.length.toLocaleString("en") + " tokens in " + inTrajectories + " trajectories" +
        (sources.length > 1 ? " of " + sources.length + " steps" : "") +
        (state.tstat ? ", " + (desc ? "largest" : "smallest") + " " + STATS[key].label + " first" : ", highest surprisal first") +
        (state.tokens ? "; a row opens its trajectory in its step" : " (the list below holds only the trajectories with one)")),
      el("div", { class: "scroll tall" }, el("table", { id: "tokens" }, el("thead", {}, head), body)), more);
  }

  // ---- one step ----
  const haystacks = new WeakMap();
  function haystack(t) {
    if (!haystacks.has(t)) {
      const parts = [t.task, t.g, promptText(t) || "", t.err || ""];
      if (t.tok) parts.push(t.tok.join(""));
      else for (const turn of t.turns) parts.push(turn.text || "", turn.obs || "");
      for (const value of Object.values(t.grade || {})) parts.push(typeof value === "string" ? value : JSON.stringify(value));
      haystacks.set(t, parts.join("\n").toLowerCase());
    }
    return haystacks.get(t);
  }
  function matches(t) {
    if (state.rmin !== "" && !(t.r >= Number(state.rmin))) return false;
    if (state.rmax !== "" && !(t.r <= Number(state.rmax))) return false;
    if (state.stop && t.sr !== state.stop) return false;
    if (state.group && t.g !== state.group) return false;
    if (state.status && t.st !== state.status) return false;
    if (state.tool === "with errors" && !summary(t).tools) return false;
    if (state.tool === "none" && summary(t).tools) return false;
    if (state.q && !haystack(t).includes(state.q.toLowerCase())) return false;
    if (tokenFilterOn() && !matchCount(t)) return false;
    return true;
  }
  const SORTS = {
    "": ["saved order", null], "r-desc": ["reward, high first", (t) => -t.r], "r-asc": ["reward, low first", (t) => t.r],
    "a-desc": ["advantage, high first", (t) => (t.a === null ? null : -t.a)], "a-asc": ["advantage, low first", (t) => t.a],
    "n-desc": ["length, long first", (t) => -t.n], "n-asc": ["length, short first", (t) => t.n],
    "d-desc": ["largest |mismatch| first", (t) => neg(summary(t).d)], "h-desc": ["largest entropy first", (t) => neg(summary(t).h)],
    "s-desc": ["largest surprisal first", (t) => neg(summary(t).s)],
    "plus-desc": ["most L+ tokens first", (t) => -summary(t).plus], "minus-desc": ["most L- tokens first", (t) => -summary(t).minus],
    "phi-desc": ["largest Φ < 0 share first", (t) => neg(summary(t).phiNeg)], "tools-desc": ["most tool errors first", (t) => -summary(t).tools],
    "match-desc": ["most matching tokens first", (t) => -matchCount(t)],
  };
  function neg(v) { return v === null || v === undefined ? null : -v; }
  function sorted(rows) {
    const key = SORTS[state.sort] && SORTS[state.sort][1];
    if (!key) return rows;
    return rows.map((t) => [key(t), t]).sort((a, b) => {
      if (a[0] === null || a[0] === undefined) return b[0] === null || b[0] === undefined ? a[1].i - b[1].i : 1;
      if (b[0] === null || b[0] === undefined) return -1;
      return a[0] - b[0] || a[1].i - b[1].i;
    }).map((pair) => pair[1]);
  }
  function options(id, label, values, current) {
    const select = el("select", { id, onchange: (e) => { state[id.slice(2)] = e.target.value; state.limit = PAGE; list(); } },
      el("option", { value: "" }, "any"));
    for (const value of values) select.append(el("option", { value, selected: value === current ? "selected" : null }, value));
    return el("label", {}, label, select);
  }
  function number(id, label) {
    return el("label", {}, label, el("input", { id, type: "number", step: "any", value: state[id.slice(2)],
      oninput: (e) => { state[id.slice(2)] = e.target.value; state.limit = PAGE; list(); } }));
  }
  function choice(id, label, choices, key, onchange) {
    const select = el("select", { id, onchange: (e) => { state[key] = e.target.value; onchange(); } });
    for (const [value, text] of choices) select.append(el("option", { value, selected: value === state[key] ? "selected" : null }, text));
    return el("label", {}, label, select);
  }
  function colouring(withStare) {
    const modes = Object.entries(MODES).filter(([value]) => withStare || value !== "stare").map(([value, m]) => [value,
      m.label + (FIELD[value] && !meta.fields[FIELD[value]] ? (value === "mismatch" ? " (no learner data)" : " (not saved)") : "")]);
    return [
      choice("f-mode", "colour by", modes, "mode", recolour),
      choice("f-scale", "scale", [["log", "log"], ["quantile", "quantile"]], "scale", recolour),
    ];
  }

  function cutoffText(cut) {
    const parts = [];
    for (const sign of ["+", "-"]) {
      if (cut[sign] === undefined) continue;
      const spread = cut[sign + "max"] !== undefined && cut[sign + "max"] !== cut[sign]
        ? " (each trajectory's own: " + cut[sign].toFixed(3) + " to " + cut[sign + "max"].toFixed(3) + ")" : "";
      parts.push("L" + sign + " " + cut[sign + "n"] + " tokens, cut-off surprisal ≥ " + cut[sign].toFixed(3) + spread);
    }
    return parts;
  }
  // which trajectories of a step carry the learner's per-token figures: said when some do and some do not
  function coverageNote(data) {
    const by = {};
    for (const t of data) { const c = by[t.st] || (by[t.st] = [0, 0]); c[0] += t.d ? 1 : 0; c[1]++; }
    const scored = data.filter((t) => t.d).length;
    if (!scored || scored === data.length) return null;
    const parts = Object.entries(by).map(([status, [n, all]]) => status + " " + n + "/" + all).join(", ");
    return el("div", { id: "coverage-note", class: "notices" },
      "Per-token learner figures (log-prob, entropy, mismatch, Φ) for " + scored + " of " + data.length + " trajectories (" + parts + "). " +
      "The others are shown with their rollout surprisal and are not coloured by entropy, mismatch or Φ: this run folder was " +
      "written before every sampled trajectory was scored (only the trained ones were), or the learner did not score them.");
  }
  function stepView() {
    const data = stepData(state.step);
    if (!data) return el("p", { id: "step-view" }, "no saved rollouts for step " + state.step);
    if (state.mode !== "stare" && !MODES[state.mode]) state.mode = "stare";
    const distinct = (f) => [...new Set(data.map(f))].sort();
    const parts = cutoffText((stepRow() || {}).cut || {});
    const cutoffs = el("div", { id: "cutoffs", class: "muted" }, parts.length
      ? "STARE selection (from the saved pre-update surprisal): " + parts.join("; ") +
        (parts.some((p) => p.includes("each trajectory")) ? " - L+/L- are taken per micro-batch (the default), each with its own cut-off" : "")
      : "STARE selection: no selected tokens saved for this step");
    return el("div", { id: "step-view" },
      el("h2", {}, "Step " + state.step + " - " + data.length + " trajectories"),
      cutoffs,
      coverageNote(data),
      tokenPanel(),
      el("div", { class: "bar" },
        el("label", {}, "search", el("input", { id: "f-q", type: "search", value: state.q, placeholder: "text, task, group, grade",
          oninput: (e) => { state.q = e.target.value; state.limit = PAGE; list(); } })),
        number("f-rmin", "reward ≥"), number("f-rmax", "reward ≤"),
        options("f-stop", "stop reason", distinct((t) => t.sr), state.stop),
        options("f-group", "group", distinct((t) => t.g), state.group),
        options("f-status", "status", distinct((t) => t.st), state.status),
        options("f-tool", "tool errors", ["with errors", "none"], state.tool),
        choice("f-sort", "sort", Object.entries(SORTS).map(([k, v]) => [k, v[0]]), "sort", () => { state.limit = PAGE; list(); }),
        ...colouring(true),
        el("span", { id: "f-count", class: "muted" })),
      scaleLegend(),
      el("div", { id: "list" }));
  }

  const COLUMNS = ["#", "group", "sample", "reward", "advantage", "stop reason", "status", "turns", "tokens", "version",
    "max |Δ|", "max H", "L+", "L-", "Φ<0", "tool errors"];
  function trajectoryRow(t, data, step) {
    const sum = summary(t);
    const row = el("tr", { class: "traj", "data-i": t.i, "data-step": step, onclick: (e) => { if (!e.target.closest("a")) toggle(row, t, data, step); } },
      el("td", { class: "l" }, t.i), el("td", { class: "l" }, t.g), el("td", { class: "l" }, t.si),
      el("td", {}, fmt(t.r)), el("td", {}, fmt(t.a)), el("td", { class: "l" }, t.sr), el("td", { class: "l" }, t.st),
      el("td", {}, t.nt), el("td", {}, t.n), el("td", {}, t.wv),
      el("td", { class: "stat" }, fmt(sum.d, 3)), el("td", { class: "stat" }, fmt(sum.h, 3)),
      el("td", { class: "stat" }, t.sel ? sum.plus : "-"), el("td", { class: "stat" }, t.sel ? sum.minus : "-"),
      el("td", { class: "stat" }, sum.phiNeg === null ? "-" : Math.round(sum.phiNeg * 100) + "%"),
      el("td", { class: "stat" + (sum.tools ? " warn" : "") }, sum.tools));
    if (tokenFilterOn() && state.prompt === null && state.heldout === null) row.append(el("td", { class: "stat match" }, matchCount(t)));
    return row;
  }
  function headRow(extra) {
    const names = [...(extra || []), ...COLUMNS];
    const shift = (extra || []).length;
    if (tokenFilterOn() && state.prompt === null && state.heldout === null) names.push("matching");
    return el("tr", {}, ...names.map((h, k) => el("th", { class: k < shift || [0, 1, 2, 5, 6].includes(k - shift) ? "l" : null }, h)));
  }
  function list() {
    const data = stepData(state.step);
    const holder = document.getElementById("list");
    if (!data || !holder) return;
    let shown = data.filter(matches);
    if (state.open !== null && !shown.some((t) => t.i === state.open) && data.some((t) => t.i === state.open)) {
      Object.assign(state, FILTERS); // a link to a trajectory the filters hide: show it
      render();
      return;
    }
    shown = sorted(shown);
    if (state.open !== null) {
      const at = shown.findIndex((t) => t.i === state.open);
      if (at >= state.limit) state.limit = Math.ceil((at + 1) / PAGE) * PAGE;
    }
    document.getElementById("f-count").textContent = shown.length + " of " + data.length + " shown";
    const body = el("tbody", {});
    for (const t of shown.slice(0, state.limit)) body.append(trajectoryRow(t, data, state.step));
    const more = shown.length > state.limit
      ? el("button", { id: "more", onclick: () => { state.limit += PAGE; list(); } }, "show " + Math.min(PAGE, shown.length - state.limit) + " more")
      : null;
    holder.replaceChildren(...[el("table", { id: "trajectories" }, el("thead", {}, headRow()), body), more].filter(Boolean));
    if (state.open !== null) {
      const row = body.querySelector("tr.traj[data-i='" + state.open + "']");
      state.open = null;
      if (row) {
        toggle(row, data.find((t) => t.i === Number(row.dataset.i)), data, state.step);
        const hit = state.tok === null ? null : row.nextElementSibling.querySelector("span.t[data-j='" + state.tok + "']");
        if (hit) { hit.classList.add("focus"); hit.scrollIntoView({ block: "center" }); } else row.scrollIntoView({ block: "start" });
      }
    }
  }

  function toggle(row, t, data, step) {
    const next = row.nextElementSibling;
    if (next && next.classList.contains("detail-row")) { next.remove(); row.classList.remove("open"); return; }
    row.classList.add("open");
    row.after(el("tr", { class: "detail-row" }, el("td", { colspan: row.children.length, class: "l" }, detail(t, data, step))));
  }

  // ---- one trajectory ----
  function grading(t) {
    const grade = t.grade || {};
    const names = { extracted: "extracted answer", answer: "reference answer", grade_reason: "grade reason",
      score_details: "score details", reward_violation: "reward violation" };
    const rows = Object.entries(names).filter(([key]) => grade[key] !== undefined && grade[key] !== null)
      .map(([key, name]) => el("tr", { "data-key": key }, el("th", { class: "l" }, name),
        el("td", { class: "l" }, typeof grade[key] === "string" ? grade[key] : JSON.stringify(grade[key]))));
    rows.unshift(el("tr", { "data-key": "correct" }, el("th", { class: "l" }, "correct"), el("td", { class: "l" + (t.c ? " right" : " wrong") }, t.c ? "yes" : "no")));
    if (rows.length === 1) rows.push(el("tr", {}, el("td", { colspan: 2, class: "l muted" }, "no grading details saved (extracted answer, grade reason)")));
    return el("table", { class: "grading" }, el("tbody", {}, ...rows));
  }
  function detail(t, data, step) {
    const group = data.filter((u) => u.g === t.g);
    const groupTable = el("table", { class: "group" },
      el("tr", {}, el("th", { class: "l" }, "group " + t.g), ...group.map((u) => el("th", { class: u.i === t.i ? "gate-on" : null }, "#" + u.si))),
      el("tr", {}, el("td", { class: "l" }, "reward"), ...group.map((u) => el("td", {}, fmt(u.r)))),
      el("tr", {}, el("td", { class: "l" }, "advantage"), ...group.map((u) => el("td", {}, fmt(u.a)))),
      el("tr", {}, el("td", { class: "l" }, "status"), ...group.map((u) => el("td", {}, u.st))));
    const facts = [
      "task " + t.task, "reward " + fmt(t.r), "advantage " + fmt(t.a), "stop " + t.sr, "status " + t.st,
      "weights v" + t.wv, t.gate === null ? null : "gate " + (t.gate ? "on" : "off"),
      t.ssrc === "learner" ? "surprisal from the learner" : "surprisal from the rollout (no learner data: " + t.st + ")",
    ].filter(Boolean).join(" · ");
    const cut = cutoffText(t.cut || {});
    const across = t.p !== undefined ? prompts().steps[t.p] || [] : [];
    const links = el("div", { class: "links" },
      el("a", { class: "permalink", href: link({ step, traj: t.i }) }, "link to this trajectory"),
      t.p !== undefined ? " · " : null,
      t.p !== undefined ? el("a", { class: "prompt-link", href: link({ prompt: t.p }) },
        across.length === 1 ? "this prompt across steps (drawn in 1 step only: why?)" : "this prompt across steps (" + across.length + " steps)") : null);
    const box = el("div", { class: "detail", "data-i": t.i },
      links,
      el("div", { class: "muted" }, facts),
      el("div", { class: "muted cut" }, cut.length ? "STARE selection in this trajectory: " + cut.join("; ") : null),
      t.err ? el("div", { class: "obs" }, "error: " + t.err) : null,
      groupTable,
      grading(t),
      el("details", {}, el("summary", {}, "prompt"), el("div", { class: "prompt" }, promptText(t) || "(not saved)")),
      fieldNote(t));
    if (t.tok) box.append(...tokenTurns(t));
    else box.append(...textTurns(t));
    return box;
  }
  function fieldNote(t) { // what the current colouring cannot show for this trajectory, said plainly
    const m = MODES[state.mode];
    if (!m.key || !t.tok || t[m.key]) return el("div", { class: "field-note" });
    const why = state.mode === "entropy" ? "per-token entropy is not saved for this trajectory"
      : state.mode === "phi" ? "per-token Φ is not saved for this trajectory"
      : "no learner log-probs for this trajectory (status " + t.st + "): its mismatch is not known";
    return el("div", { class: "field-note notices" }, why + "; its tokens are not coloured");
  }

  function turnHead(t, k) {
    const turn = t.turns[k];
    if (!turn) return el("div", { class: "turn-head" }, "turn " + (k + 1));
    const calls = turn.calls ? " · tool calls " + turn.calls + " (" + turn.statuses.join(", ") + ")" : "";
    return el("div", { class: "turn-head" }, "turn " + (k + 1) + " · finish " + turn.finish + calls);
  }

  function tokenTurns(t) {
    const out = [];
    let start = 0, turn = 0;
    const focus = state.tok;
    while (start < t.m.length) {
      const action = t.m[start] === "1";
      let end = start;
      while (end < t.m.length && (t.m[end] === "1") === action) end++;
      if (action) {
        const tokens = el("div", { class: "tokens" });
        // the cap; a linked token past it is drawn too (the run is drawn up to it)
        const drawn = Math.min(end, Math.max(start + CAP.tokens, focus !== null && focus < end ? focus + 1 : 0));
        for (let j = start; j < drawn; j++) tokens.append(tokenSpan(t, j));
        if (drawn < end) {
          tokens.append(capMarker(end - drawn, "tokens", end - start, () => {
            const rest = document.createDocumentFragment();
            for (let j = drawn; j < end; j++) rest.append(tokenSpan(t, j));
            return rest;
          }));
        }
        out.push(el("div", { class: "turn" }, turnHead(t, turn), tokens));
        turn++;
      } else {
        out.push(el("div", { class: "obs", "data-from": start },
          el("span", { class: "obs-head" }, "observation · " + (end - start) + " tokens · not trained"),
          cappedText(t.tok.slice(start, end).join(""))));
      }
      start = end;
    }
    return out;
  }

  function tokenSpan(t, j) { // one action token, coloured by the current mode
    const value = (key) => (t[key] && isNum(t[key][j]) ? t[key][j] : null);
    const span = el("span", { class: "t", "data-j": j, "data-s": value("s"), "data-h": value("h"),
      "data-d": value("d"), "data-phi": value("phi"), "data-w": t.w ? t.w[j] : null, "data-sel": t.sel ? t.sel[j] : null }, t.tok[j]);
    if (state.step !== null && state.prompt === null && state.heldout === null && tokenFilterOn() && tokenMatches(t, j)) span.classList.add("match");
    colour(span);
    return span;
  }

  function textTurns(t) {
    return t.turns.map((turn, k) => el("div", { class: "turn" }, turnHead(t, k),
      el("div", { class: "tokens" }, turn.text ? cappedText(turn.text) : null),
      turn.obs ? el("div", { class: "obs" }, el("span", { class: "obs-head" }, "observation"), cappedText(turn.obs)) : null));
  }

  function colour(span) {
    const s = span.dataset.s, w = span.dataset.w, sel = span.dataset.sel;
    span.classList.remove("lplus", "lminus", "would", "neg");
    span.style.background = "";
    const described = "surprisal " + (s === undefined ? "-" : s) + (span.dataset.h !== undefined ? " · entropy " + span.dataset.h : "") +
      (span.dataset.d !== undefined ? " · mismatch " + span.dataset.d : "") + (span.dataset.phi !== undefined ? " · Φ " + span.dataset.phi : "");
    if (state.mode !== "stare") {
      const raw = span.dataset[MODES[state.mode].key];
      if (raw !== undefined) {
        const value = Number(raw);
        span.style.background = rgba(state.mode, value, position(state.mode, value, shownRows()));
      }
      span.title = described + (w !== undefined ? " · weight " + w : "");
      return;
    }
    const weight = w === undefined ? 1 : Number(w);
    if (weight > 1) span.classList.add("lplus");
    else if (weight < 1) span.classList.add("lminus");
    else if (sel === "+") span.classList.add("would");
    else if (sel === "-") span.classList.add("would", "neg");
    span.title = "weight " + (w === undefined ? "-" : w) + " · " + described + (sel && sel !== "0" ? " · L" + sel : "");
  }
  function recolour() {
    const legend = document.getElementById("scale-box");
    if (legend) legend.replaceWith(scaleLegend());
    document.querySelectorAll("span.t[data-j]").forEach(colour); // the tokens, never the legend's swatches
    document.querySelectorAll(".detail .field-note").forEach((note) => {
      const box = note.closest(".detail"), t = findShown(box);
      if (t) note.replaceWith(fieldNote(t));
    });
  }
  function findShown(box) {
    if (box.dataset.block) return (block(box.dataset.block) || []).find((t) => t.i === Number(box.dataset.i));
    const detailRow = box.closest("tr.detail-row"), row = detailRow && detailRow.previousElementSibling;
    const step = row ? row.dataset.step : state.step;
    return (stepData(step) || []).find((t) => t.i === Number(box.dataset.i));
  }

  // ---- one prompt across steps ----
  function promptRows() {
    const table = prompts(), out = [];
    for (const step of table.steps[state.prompt] || []) {
      for (const t of stepData(step) || []) if (t.p === state.prompt) out.push({ step, t });
    }
    return out;
  }
  function promptView() {
    const table = prompts();
    if (state.prompt === null || !(state.prompt >= 0 && state.prompt < table.text.length)) {
      return el("p", { id: "prompt-view" }, "no prompt " + state.prompt + " in this page");
    }
    const rows = promptRows();
    const steps = table.steps[state.prompt];
    const byStep = steps.map((step) => {
      const mine = rows.filter((x) => x.step === step).map((x) => x.t);
      const mean = mine.reduce((sum, t) => sum + t.r, 0) / (mine.length || 1);
      return el("tr", { "data-step": step }, el("td", { class: "l" }, el("a", { href: link({ step }) }, step)),
        el("td", {}, mine.length), el("td", {}, fmt(mean)), el("td", {}, mine.filter((t) => t.c).length));
    });
    const body = el("tbody", {});
    for (const { step, t } of rows) {
      const row = trajectoryRow(t, stepData(step), step);
      row.prepend(el("td", { class: "l" }, el("a", { href: link({ step, traj: t.i }) }, step)));
      body.append(row);
    }
    const once = steps.length === 1 ? el("div", { id: "prompt-note", class: "notices" },
      "This prompt was drawn in one step only (" + steps[0] + " of the " + meta.overview.length + " steps on this page). The trainer " +
      "draws training prompt i with seed env.train_seed + i, so a prompt comes back only when the environment gives two seeds " +
      "the same problem (a dataset smaller than the prompts drawn so far, after an epoch); a generated environment such as " +
      "ArithmeticTIR-v0 gives almost every seed a new problem. To follow one problem through training, open the held-out tasks ",
      el("a", { href: "#heldout" }, "across training"), ".") : null;
    return el("div", { id: "prompt-view" },
      el("h2", {}, "Prompt " + state.prompt + " · task " + table.task[state.prompt] + " · " + rows.length + " trajectories in " + steps.length + " step(s)"),
      once,
      el("details", {}, el("summary", {}, "prompt"), el("div", { class: "prompt" }, table.text[state.prompt] || "(not saved)")),
      el("table", { id: "prompt-steps" }, el("thead", {}, el("tr", {}, el("th", { class: "l" }, "step"), el("th", {}, "trajectories"), el("th", {}, "mean reward"), el("th", {}, "correct"))), el("tbody", {}, ...byStep)),
      el("div", { class: "bar" }, ...colouring(true)),
      scaleLegend(),
      el("table", { id: "prompt-trajectories" }, el("thead", {}, headRow(["step"])), body));
  }

  // ---- held-out tasks across training: every evaluation point (base, SFT, during RL, end; of run A and B) ----
  function heldoutPoints() { return meta.heldout || []; }
  function runTitle(run) { const r = (meta.runs || []).find((x) => x.run === run); return r ? r.title : run; }
  function pointName(p) { return (meta.runs && meta.runs.length > 1 ? runTitle(p.run) + " · " : "") + p.label; }
  const taskIndex = new Map(); // block -> Map(task -> [rows])
  function byTask(point) {
    if (!taskIndex.has(point.block)) {
      const index = new Map();
      for (const t of block(point.block) || []) {
        if (!index.has(t.task)) index.set(t.task, []);
        index.get(t.task).push(t);
      }
      taskIndex.set(point.block, index);
    }
    return taskIndex.get(point.block);
  }
  function heldoutRows(task) {
    const out = [];
    for (const point of heldoutPoints()) for (const t of byTask(point).get(task) || []) out.push({ point, t });
    return out;
  }
  function heldoutTasks() { // every task, in the order of the first point that has it
    const seen = new Set(), out = [];
    for (const point of heldoutPoints()) for (const task of byTask(point).keys()) if (!seen.has(task)) { seen.add(task); out.push(task); }
    return out;
  }
  function correctShare(rows) { return rows.length ? rows.filter((t) => t.c).length / rows.length : null; }
  const HFILTERS = { "": "all tasks", changed: "graded differently at some point", gained: "wrong at the first point, right at the last",
    lost: "right at the first point, wrong at the last", never: "wrong at every point" };
  function heldoutOverview() {
    const points = heldoutPoints().filter((p) => p.samples);
    const notes = (meta.heldoutNotes || []).map((n) => el("div", { class: "notices heldout-note" }, n));
    const accuracy = el("table", { id: "heldout-points" },
      el("thead", {}, el("tr", {}, el("th", { class: "l" }, "evaluation point"), el("th", {}, "accuracy (logged)"), el("th", {}, "samples kept"))),
      el("tbody", {}, ...heldoutPoints().map((p) => el("tr", { "data-point": p.point, "data-run": p.run },
        el("td", { class: "l" }, pointName(p)), el("td", {}, fmt(p.accuracy)), el("td", {}, p.samples || "-")))));
    if (!points.length) {
      return el("div", { id: "heldout-view" }, el("h2", {}, "Held-out tasks across training"), ...notes,
        heldoutPoints().length ? accuracy : el("p", { class: "muted" }, "no held-out evaluations in this page"));
    }
    const tasks = heldoutTasks();
    const rows = [];
    for (const task of tasks) {
      const shares = points.map((p) => correctShare(byTask(p).get(task) || []));
      const known = shares.filter((s) => s !== null);
      const first = known[0], last = known[known.length - 1];
      const keep = state.hfilter === "" ? true : state.hfilter === "changed" ? new Set(known).size > 1
        : state.hfilter === "gained" ? first === 0 && last > 0 : state.hfilter === "lost" ? first > 0 && last === 0
        : known.every((s) => s === 0);
      if (!keep) continue;
      const sample = points.map((p) => (byTask(p).get(task) || [])[0]).find(Boolean);
      const problem = sample ? promptText(sample) || "" : "";
      if (state.hq && !(task + "\n" + problem).toLowerCase().includes(state.hq.toLowerCase())) continue;
      rows.push(el("tr", { class: "htask", "data-task": task, onclick: (e) => { if (!e.target.closest("a")) location.hash = link({ heldout: task }); } },
        el("td", { class: "l" }, el("a", { href: link({ heldout: task }) }, task)),
        ...shares.map((s, k) => el("td", { class: s === null ? "muted" : s > 0 ? "right" : "wrong", "data-point": points[k].point },
          s === null ? "-" : s === 1 ? "✓" : s === 0 ? "✗" : Math.round(s * 100) + "%"))));
    }
    const head = el("tr", {}, el("th", { class: "l" }, "task"), ...points.map((p) => el("th", {}, pointName(p))));
    const filter = el("div", { class: "bar" },
      choice("h-filter", "show", Object.entries(HFILTERS), "hfilter", () => render()),
      el("label", {}, "search", el("input", { id: "h-q", type: "search", value: state.hq, placeholder: "task id or problem text",
        onchange: (e) => { state.hq = e.target.value; render(); } })),
      el("span", { id: "h-count", class: "muted" }, rows.length + " of " + tasks.length + " tasks"));
    return el("div", { id: "heldout-view" },
      el("h2", {}, "Held-out tasks across training"),
      el("div", { class: "muted" }, "Each evaluation point's samples of the same held-out tasks (never training problems). Open a task to see its samples at every point side by side."),
      ...notes, accuracy, filter,
      el("table", { id: "heldout-tasks" }, el("thead", {}, head), el("tbody", {}, ...rows)));
  }
  function heldoutTask() {
    const task = state.heldout, rows = heldoutRows(task);
    if (state.mode === "stare") state.mode = "surprisal"; // held-out samples are never reweighted
    const tasks = heldoutTasks(), at = tasks.indexOf(task);
    const nav = el("div", { class: "links" }, el("a", { href: "#heldout", id: "h-back" }, "all held-out tasks"),
      at > 0 ? el("a", { href: link({ heldout: tasks[at - 1] }), id: "h-prev" }, " · previous task") : null,
      at >= 0 && at + 1 < tasks.length ? el("a", { href: link({ heldout: tasks[at + 1] }), id: "h-next" }, " · next task") : null);
    if (!rows.length) return el("div", { id: "heldout-view" }, nav, el("p", {}, "no held-out samples of task " + task + " in this page"));
    const first = rows[0].t;
    const columns = heldoutPoints().filter((p) => p.samples).map((point) => {
      const mine = rows.filter((x) => x.point === point).map((x) => x.t);
      const column = el("div", { class: "hcol", "data-point": point.point, "data-run": point.run },
        el("div", { class: "hcol-head" }, el("strong", {}, pointName(point)),
          el("div", { class: "muted" }, "accuracy " + fmt(point.accuracy) + " over its " + byTask(point).size + " task(s)")));
      if (!mine.length) column.append(el("div", { class: "muted" }, "not evaluated on this task (fewer tasks at this point)"));
      for (const t of mine) {
        const box = el("div", { class: "detail hsample", "data-i": t.i, "data-block": point.block },
          el("div", { class: "muted" }, "sample " + t.si + " · reward " + fmt(t.r) + " · stop " + t.sr + " · " + t.nt + " turn(s) · " + t.n + " tokens" + (t.err ? " · error: " + t.err : "")),
          grading(t), fieldNote(t));
        if (t.tok) box.append(...tokenTurns(t)); else box.append(...textTurns(t));
        column.append(box);
      }
      return column;
    });
    return el("div", { id: "heldout-view" },
      nav,
      el("h2", {}, "Held-out task " + task + " across training"),
      el("details", { open: "open" }, el("summary", {}, "prompt"), el("div", { class: "prompt" }, promptText(first) || "(not saved)")),
      el("div", { class: "bar" }, ...colouring(false)),
      scaleLegend(),
      el("div", { class: "hcols" }, ...columns));
  }

  // ---- tokens of every step (#tokens) ----
  function tokensView() {
    return el("div", { id: "tokens-view" },
      el("h2", {}, "Tokens of all " + meta.overview.length + " steps"),
      el("div", { class: "muted" }, "The action tokens of every step on this page, by their statistics (each step's own L+/L- cut-offs are drawn in its step view)."),
      tokenPanel());
  }

  // ---- page ----
  // what the source had that could not be read (a damaged step file, a malformed line): named, never hidden
  function notices() {
    const list = meta.notices || [];
    if (!list.length) return null;
    return el("div", { id: "notices", class: "notices" },
      el("strong", {}, list.length + " thing(s) in the source could not be read and are not shown:"),
      el("ul", {}, ...list.map((text) => el("li", {}, text))));
  }
  function nav() {
    const points = heldoutPoints();
    const against = meta.runs && meta.runs.length > 1
      ? " · against " + meta.runs[1].title + " (its entropy curve and held-out samples; its steps: stare-agents show on its folder)" : "";
    return el("div", { class: "muted", id: "nav" }, "stare-agents rollouts · " + meta.overview.length + " step(s) · ",
      el("a", { href: "#", id: "nav-steps" }, "steps"), " · ",
      el("a", { href: "#tokens", id: "nav-tokens" }, "find tokens in all steps"), " · ",
      el("a", { href: "#heldout", id: "nav-heldout" }, "held-out tasks across training (" + points.filter((p) => p.samples).length + " point(s) with samples)"),
      against);
  }
  function render() {
    const children = [el("h1", {}, meta.title), nav(), notices(), overview()];
    if (state.heldout !== null) children.push(state.heldout === "" ? heldoutOverview() : heldoutTask());
    else if (state.tokens) children.push(tokensView());
    else if (state.prompt !== null) children.push(promptView());
    else if (state.step !== null) children.push(stepView());
    else children.push(el("p", { class: "muted", id: "hint" }, "open a step above to list its trajectories"));
    app.replaceChildren(...children.filter((c) => c !== null));
    if (state.prompt === null && state.heldout === null && !state.tokens && state.step !== null) list();
  }
  readHash();
  if (state.step === null && state.prompt === null && state.heldout === null && !state.tokens && meta.overview.length === 1) state.step = meta.overview[0].step;
  render();
})();
