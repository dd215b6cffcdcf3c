"use strict";
// The stare-agents rollout viewer. Data sits in <script type="application/json"> blocks: "meta" (overview),
// "prompts" (each distinct prompt once) and one "step-NAME" per step, each parsed when first needed. Text is
// only ever inserted as text nodes, with control, bidi and zero-width characters shown as marked glyphs.
(function () {
  const app = document.getElementById("app");
  const meta = JSON.parse(document.getElementById("meta").textContent);
  const cache = new Map();
  const PAGE = 100; // trajectories listed at a time
  const FILTERS = { rmin: "", rmax: "", stop: "", group: "", status: "", q: "", sort: "" };
  const state = { step: null, prompt: null, open: null, mode: "stare", scale: "log", limit: PAGE, ...FILTERS };

  // ---- text: every string goes in as text, its invisible characters made visible ----
  // C0 controls (but tab and newline) and DEL: their Unicode control pictures (U+2400...). Bidi controls and
  // zero-width characters: a marked glyph naming the code point, so that text never renders reordered or hidden.
  const HIDDEN = /[\u0000-\u0008\u000b-\u001f\u007f\u200b-\u200f\u202a-\u202e\u2060\u2066-\u2069\ufeff]/g;
  const NAMES = {
    0x200b: "zero-width space", 0x200c: "zero-width non-joiner", 0x200d: "zero-width joiner",
    0x200e: "left-to-right mark", 0x200f: "right-to-left mark", 0x202a: "left-to-right embedding",
    0x202b: "right-to-left embedding", 0x202c: "pop directional formatting", 0x202d: "left-to-right override",
    0x202e: "right-to-left override", 0x2060: "word joiner", 0x2066: "left-to-right isolate",
    0x2067: "right-to-left isolate", 0x2068: "first strong isolate", 0x2069: "pop directional isolate",
    0xfeff: "zero-width no-break space (BOM)",
  };
  function hex(code) { return code.toString(16).toUpperCase().padStart(4, "0"); }
  function glyph(c) {
    const code = c.charCodeAt(0);
    if (code < 0x20 || code === 0x7f) return String.fromCharCode(code === 0x7f ? 0x2421 : 0x2400 + code);
    const span = document.createElement("span");
    span.className = "ctl";
    span.title = "U+" + hex(code) + " " + NAMES[code] + " (shown, not applied)";
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
      last = at + 1;
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

  // ---- routing: #step=NAME[&traj=I], #prompt=P ----
  function readHash() {
    const params = new URLSearchParams(location.hash.slice(1));
    const step = params.get("step"), prompt = params.get("prompt"), traj = params.get("traj");
    if (step !== state.step) Object.assign(state, FILTERS, { limit: PAGE });
    state.step = step;
    state.prompt = prompt === null ? null : Number(prompt);
    state.open = traj === null ? null : Number(traj);
  }
  window.addEventListener("hashchange", () => { readHash(); render(); });

  // ---- the entropy curve: axes, ticks, the target band; trained batch and all sampled ----
  function ticks(lo, hi, count) {
    const span = hi - lo || 1, raw = span / count, power = Math.pow(10, Math.floor(Math.log10(raw)));
    const step = [1, 2, 5, 10].map((m) => m * power).find((s) => span / s <= count) || 10 * power;
    const out = [];
    for (let v = Math.ceil(lo / step) * step; v <= hi + step * 1e-9; v += step) out.push(Number(v.toPrecision(12)));
    return out;
  }
  function curve() {
    const trained = meta.curve.filter((p) => typeof p.entropy === "number");
    const all = meta.curve.filter((p) => typeof p.all === "number");
    if (!trained.length && !all.length) return null;
    const W = 680, H = 230, left = 56, right = 16, top = 26, bottom = 40;
    const target = meta.target, band = meta.band || 0.3;
    const steps = trained.concat(all).map((p) => p.step);
    const values = trained.map((p) => p.entropy).concat(all.map((p) => p.all));
    if (target !== null) values.push(target * (1 + band));
    const x0 = Math.min(...steps), x1 = Math.max(...steps, x0 + 1);
    const y0 = 0, y1 = Math.max(...values, 1e-6) * 1.08;
    const x = (s) => left + ((s - x0) / (x1 - x0)) * (W - left - right);
    const y = (v) => H - bottom - ((v - y0) / (y1 - y0)) * (H - top - bottom);
    const ns = "http://www.w3.org/2000/svg";
    const svg = document.createElementNS(ns, "svg");
    svg.setAttribute("width", W); svg.setAttribute("height", H); svg.setAttribute("id", "entropy-curve");
    const add = (tag, attrs, text, parent) => {
      const node = document.createElementNS(ns, tag);
      for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
      if (text !== undefined) node.textContent = text;
      (parent || svg).append(node);
      return node;
    };
    if (target !== null) {
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
    const xTicks = ticks(x0, x1, 8).filter((s) => Number.isInteger(s));
    for (const s of xTicks) {
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
    const series = [
      ["all", all, (p) => p.all, "#d46a00", "all sampled trajectories"],
      ["trained", trained, (p) => p.entropy, "#0b5cad", "trained batch (the gate's input)"],
    ];
    let legendX = left;
    for (const [name, points, value, colour, label] of series) {
      const text = points.length ? label : label + ": not logged";
      if (points.length) {
        add("polyline", { class: name, points: points.map((p) => x(p.step) + "," + y(value(p))).join(" "), fill: "none", stroke: colour, "stroke-width": 2 });
        for (const p of points) add("circle", { class: name, cx: x(p.step), cy: y(value(p)), r: 3, fill: colour, "data-step": p.step, "data-value": value(p) });
      }
      add("line", { x1: legendX, x2: legendX + 16, y1: 12, y2: 12, stroke: points.length ? colour : "#bbb", "stroke-width": 2 });
      const legend = add("text", { class: "legend " + name, x: legendX + 20, y: 16, "font-size": 11, fill: points.length ? "#333" : "#999" }, text);
      legendX += 30 + text.length * 5.6;
      legend.dataset.series = name;
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
      el("table", { id: "overview" }, el("thead", {}, head), el("tbody", {}, ...rows)));
  }

  // ---- per-token colourings and their scales ----
  const MODES = {
    stare: { label: "STARE weight" },
    surprisal: { label: "surprisal -log π", key: "s", lo: 1e-3, hi: 10, rgb: [255, 127, 14], unit: "nats" },
    entropy: { label: "entropy H", key: "h", lo: 1e-3, hi: 10, rgb: [148, 103, 189], unit: "nats" },
    mismatch: { label: "mismatch (log π learner - rollout)", key: "d", lo: 1e-4, hi: 1, rgb: [31, 119, 180],
      neg: [214, 39, 40], unit: "nats", signed: true },
  };
  const quantiles = new Map(); // "step|mode" -> sorted |values| of the step's action tokens
  function sortedValues(rows, mode) {
    const cacheKey = (state.prompt !== null ? "prompt " + state.prompt : "step " + state.step) + "|" + mode;
    if (!quantiles.has(cacheKey)) {
      const key = MODES[mode].key, values = [];
      for (const t of rows) {
        const list = t[key];
        if (!list) continue;
        for (let j = 0; j < t.m.length; j++) if (t.m[j] === "1") values.push(Math.abs(list[j]));
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
  // where a value sits on the current scale, in [0, 1]: log (fixed decades) or quantile (of the shown step)
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
      const why = mode === "entropy"
        ? "per-token entropy is not in these rollout files: the trainer saves it when the learner records it " +
          "(SavedRollout.learner_entropy); nothing is coloured"
        : "no trajectory shown here has the learner's log-probs (only trained trajectories of an RL run do): " +
          "the mismatch cannot be shown; nothing is coloured";
      holder.append(el("div", { id: "field-note", class: "notices" }, why));
      return holder;
    }
    const W = 520, H = 52, left = 22, right = 44, barY = 16, barH = 12, cells = 96;
    const ns = "http://www.w3.org/2000/svg";
    const svg = document.createElementNS(ns, "svg");
    svg.setAttribute("id", "scale"); svg.setAttribute("width", W); svg.setAttribute("height", H);
    svg.dataset.mode = mode; svg.dataset.scale = state.scale;
    const add = (tag, attrs, text) => {
      const node = document.createElementNS(ns, tag);
      for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
      if (text !== undefined) node.textContent = text;
      svg.append(node);
      return node;
    };
    const width = W - left - right, x = (frac) => left + frac * width;
    for (let k = 0; k < cells; k++) {
      add("rect", { x: x(k / cells), y: barY, width: width / cells + 0.5, height: barH, fill: rgba(mode, 1, (k + 0.5) / cells) });
    }
    add("rect", { x: left, y: barY, width, height: barH, fill: "none", stroke: "#999" });
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
    for (const mark of marks) {
      const anchor = mark.anchor || "middle", shift = anchor === "start" ? 2 : anchor === "end" ? -2 : 0;
      add("line", { x1: x(mark.frac), x2: x(mark.frac), y1: barY + barH, y2: barY + barH + 4, stroke: "#555" });
      add("text", { class: "tick", x: x(mark.frac) + shift, y: barY + barH + 15, "font-size": 10, "text-anchor": anchor, fill: "#333", "data-value": mark.value }, num(mark.value));
      if (mark.top) add("text", { class: "quantile", x: x(mark.frac) + shift, y: barY - 3, "font-size": 9, "text-anchor": anchor, fill: "#777" }, mark.top);
    }
    const cut = mode === "surprisal" && state.prompt === null ? (stepRow() || {}).cut || {} : {};
    for (const [sign, colour] of [["+", "#2ca02c"], ["-", "#d62728"]]) {
      if (cut[sign] === undefined) continue;
      const at = x(position(mode, cut[sign], rows));
      add("line", { class: "cut", x1: at, x2: at, y1: barY - 4, y2: barY + barH + 2, stroke: colour, "stroke-width": 2, "data-value": cut[sign] });
      add("text", { x: at + (sign === "+" ? -2 : 2), y: 10, "font-size": 9, fill: colour, "text-anchor": sign === "+" ? "end" : "start" },
        "L" + sign + " ≥ " + num(cut[sign]));
    }
    const caption = (state.scale === "quantile" ? "quantile scale (of the action tokens shown)" : "log scale") +
      ", " + m.label + " in " + m.unit + (m.signed ? "; blue: the learner gives the token more probability than the sampler, red: less" : "; darker = higher");
    holder.append(svg, el("div", { class: "muted caption" }, caption));
    return holder;
  }
  function stepRow() { return meta.overview.find((row) => row.step === state.step); }

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
    if (state.q && !haystack(t).includes(state.q.toLowerCase())) return false;
    return true;
  }
  const SORTS = {
    "": ["saved order", null], "r-desc": ["reward, high first", (t) => -t.r], "r-asc": ["reward, low first", (t) => t.r],
    "a-desc": ["advantage, high first", (t) => (t.a === null ? null : -t.a)], "a-asc": ["advantage, low first", (t) => t.a],
    "n-desc": ["length, long first", (t) => -t.n], "n-asc": ["length, short first", (t) => t.n],
  };
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
  function colouring() {
    const modes = Object.entries(MODES).map(([value, m]) => [value,
      m.label + (value === "entropy" && !meta.fields.entropy ? " (not saved)" : value === "mismatch" && !meta.fields.learner ? " (no learner data)" : "")]);
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
  function stepView() {
    const data = stepData(state.step);
    if (!data) return el("p", { id: "step-view" }, "no saved rollouts for step " + state.step);
    const distinct = (f) => [...new Set(data.map(f))].sort();
    const parts = cutoffText((stepRow() || {}).cut || {});
    const cutoffs = el("div", { id: "cutoffs", class: "muted" }, parts.length
      ? "STARE selection (from the saved pre-update surprisal): " + parts.join("; ") +
        (parts.some((p) => p.includes("each trajectory")) ? " - L+/L- are taken per micro-batch (the default), each with its own cut-off" : "")
      : "STARE selection: no selected tokens saved for this step");
    return el("div", { id: "step-view" },
      el("h2", {}, "Step " + state.step + " - " + data.length + " trajectories"),
      cutoffs,
      el("div", { class: "bar" },
        el("label", {}, "search", el("input", { id: "f-q", type: "search", value: state.q, placeholder: "text, task, group, grade",
          oninput: (e) => { state.q = e.target.value; state.limit = PAGE; list(); } })),
        number("f-rmin", "reward ≥"), number("f-rmax", "reward ≤"),
        options("f-stop", "stop reason", distinct((t) => t.sr), state.stop),
        options("f-group", "group", distinct((t) => t.g), state.group),
        options("f-status", "status", distinct((t) => t.st), state.status),
        choice("f-sort", "sort", Object.entries(SORTS).map(([k, v]) => [k, v[0]]), "sort", () => { state.limit = PAGE; list(); }),
        ...colouring(),
        el("span", { id: "f-count", class: "muted" })),
      scaleLegend(),
      el("div", { id: "list" }));
  }

  const COLUMNS = ["#", "group", "sample", "reward", "advantage", "stop reason", "status", "turns", "tokens", "version"];
  function trajectoryRow(t, data, step) {
    const row = el("tr", { class: "traj", "data-i": t.i, "data-step": step, onclick: (e) => { if (!e.target.closest("a")) toggle(row, t, data, step); } },
      el("td", { class: "l" }, t.i), el("td", { class: "l" }, t.g), el("td", { class: "l" }, t.si),
      el("td", {}, fmt(t.r)), el("td", {}, fmt(t.a)), el("td", { class: "l" }, t.sr), el("td", { class: "l" }, t.st),
      el("td", {}, t.nt), el("td", {}, t.n), el("td", {}, t.wv));
    return row;
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
    const head = el("tr", {}, ...COLUMNS.map((h, k) => el("th", { class: k < 3 || k === 5 || k === 6 ? "l" : null }, h)));
    const body = el("tbody", {});
    for (const t of shown.slice(0, state.limit)) body.append(trajectoryRow(t, data, state.step));
    const more = shown.length > state.limit
      ? el("button", { id: "more", onclick: () => { state.limit += PAGE; list(); } }, "show " + Math.min(PAGE, shown.length - state.limit) + " more")
      : null;
    holder.replaceChildren(...[el("table", { id: "trajectories" }, el("thead", {}, head), body), more].filter(Boolean));
    if (state.open !== null) {
      const row = body.querySelector("tr.traj[data-i='" + state.open + "']");
      state.open = null;
      if (row) {
        toggle(row, data.find((t) => t.i === Number(row.dataset.i)), data, state.step);
        row.scrollIntoView({ block: "start" });
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
    rows.unshift(el("tr", { "data-key": "correct" }, el("th", { class: "l" }, "correct"), el("td", { class: "l" }, t.c ? "yes" : "no")));
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
      t.w ? "surprisal from the " + t.ssrc : "surprisal from the rollout (no learner data: " + t.st + ")",
    ].filter(Boolean).join(" · ");
    const cut = cutoffText(t.cut || {});
    const across = t.p !== undefined ? prompts().steps[t.p] || [] : [];
    const links = el("div", { class: "links" },
      el("a", { class: "permalink", href: link({ step, traj: t.i }) }, "link to this trajectory"),
      t.p !== undefined ? " · " : null,
      t.p !== undefined ? el("a", { class: "prompt-link", href: link({ prompt: t.p }) }, "this prompt across steps (" + across.length + " step" + (across.length === 1 ? "" : "s") + ")") : null);
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
    while (start < t.m.length) {
      const action = t.m[start] === "1";
      let end = start;
      while (end < t.m.length && (t.m[end] === "1") === action) end++;
      if (action) {
        const tokens = el("div", { class: "tokens" });
        const drawn = Math.min(end, start + CAP.tokens);
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
    const span = el("span", { class: "t", "data-j": j, "data-s": t.s[j], "data-h": t.h ? t.h[j] : null,
      "data-d": t.d ? t.d[j] : null, "data-w": t.w ? t.w[j] : null, "data-sel": t.sel ? t.sel[j] : null }, t.tok[j]);
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
    const described = "surprisal " + s + (span.dataset.h !== undefined ? " · entropy " + span.dataset.h : "") +
      (span.dataset.d !== undefined ? " · mismatch " + span.dataset.d : "");
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
    document.querySelectorAll("span.t").forEach(colour);
    document.querySelectorAll(".detail .field-note").forEach((note) => {
      const box = note.closest(".detail"), t = findShown(Number(box.dataset.i), box.closest("tr.detail-row"));
      if (t) note.replaceWith(fieldNote(t));
    });
  }
  function findShown(i, detailRow) {
    const row = detailRow && detailRow.previousElementSibling;
    const step = row ? row.dataset.step : state.step;
    return (stepData(step) || []).find((t) => t.i === i);
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
    const head = el("tr", {}, el("th", { class: "l" }, "step"), ...COLUMNS.map((h, k) => el("th", { class: k < 3 || k === 5 || k === 6 ? "l" : null }, h)));
    const body = el("tbody", {});
    for (const { step, t } of rows) {
      const row = trajectoryRow(t, stepData(step), step);
      row.prepend(el("td", { class: "l" }, el("a", { href: link({ step, traj: t.i }) }, step)));
      body.append(row);
    }
    return el("div", { id: "prompt-view" },
      el("h2", {}, "Prompt " + state.prompt + " · task " + table.task[state.prompt] + " · " + rows.length + " trajectories in " + steps.length + " step(s)"),
      el("details", {}, el("summary", {}, "prompt"), el("div", { class: "prompt" }, table.text[state.prompt] || "(not saved)")),
      el("table", { id: "prompt-steps" }, el("thead", {}, el("tr", {}, el("th", { class: "l" }, "step"), el("th", {}, "trajectories"), el("th", {}, "mean reward"), el("th", {}, "correct"))), el("tbody", {}, ...byStep)),
      el("div", { class: "bar" }, ...colouring()),
      scaleLegend(),
      el("table", { id: "prompt-trajectories" }, el("thead", {}, head), body));
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
  function render() {
    const children = [el("h1", {}, meta.title), el("div", { class: "muted" }, "stare-agents rollouts · " + meta.overview.length + " step(s)"), notices(), overview()];
    if (state.prompt !== null) children.push(promptView());
    else if (state.step !== null) children.push(stepView());
    else children.push(el("p", { class: "muted", id: "hint" }, "open a step above to list its trajectories"));
    app.replaceChildren(...children.filter((c) => c !== null));
    if (state.prompt === null && state.step !== null) list();
  }
  readHash();
  if (state.step === null && state.prompt === null && meta.overview.length === 1) state.step = meta.overview[0].step;
  render();
})();
