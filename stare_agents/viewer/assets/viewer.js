"use strict";
// The stare-agents rollout viewer. Data sits in <script type="application/json"> blocks: "meta" (overview)
// and one "step-NAME" per step, parsed when the step is opened. Text is only ever inserted as text nodes.
(function () {
  const app = document.getElementById("app");
  const meta = JSON.parse(document.getElementById("meta").textContent);
  const cache = new Map();
  const PAGE = 100; // trajectories listed at a time
  const state = { step: null, mode: "stare", rmin: "", rmax: "", stop: "", group: "", status: "", limit: PAGE };

  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [key, value] of Object.entries(attrs || {})) {
      if (value === null || value === undefined || value === false) continue;
      if (key === "class") node.className = value;
      else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
      else node.setAttribute(key, String(value));
    }
    for (const child of children) {
      if (child === null || child === undefined) continue;
      node.append(child instanceof Node ? child : document.createTextNode(visible(String(child))));
    }
    return node;
  }
  // control characters shown as their Unicode control pictures (U+2400...), so that they are seen
  function visible(text) {
    return text.replace(/[\u0000-\u0008\u000b-\u001f\u007f]/g, (c) =>
      c === "\u007f" ? "\u2421" : String.fromCharCode(0x2400 + c.charCodeAt(0)));
  }
  function fmt(x, digits) {
    if (x === null || x === undefined) return "-";
    if (typeof x === "number") return Number.isInteger(x) ? String(x) : x.toFixed(digits === undefined ? 3 : digits);
    return String(x);
  }
  function safeId(name) { return String(name).replace(/[^A-Za-z0-9_-]/g, "_"); }
  function stepData(name) {
    if (!cache.has(name)) {
      const block = document.getElementById("step-" + safeId(name));
      cache.set(name, block ? JSON.parse(block.textContent) : null);
    }
    return cache.get(name);
  }

  // ---- routing: #step=NAME ----
  function readHash() {
    const params = new URLSearchParams(location.hash.slice(1));
    const step = params.get("step");
    if (step !== state.step) {
      Object.assign(state, { step, rmin: "", rmax: "", stop: "", group: "", status: "", limit: PAGE });
    }
  }
  window.addEventListener("hashchange", () => { readHash(); render(); });

  // ---- overview ----
  function curve() {
    const points = meta.curve.filter((p) => typeof p.entropy === "number");
    if (!points.length) return null;
    const W = 640, H = 150, pad = 30;
    const steps = points.map((p) => p.step);
    const values = points.map((p) => p.entropy).concat(meta.target === null ? [] : [meta.target]);
    const x0 = Math.min(...steps), x1 = Math.max(...steps, x0 + 1);
    const y0 = Math.min(0, ...values), y1 = Math.max(...values) * 1.1 || 1;
    const x = (s) => pad + ((s - x0) / (x1 - x0)) * (W - 2 * pad);
    const y = (v) => H - pad + 10 - ((v - y0) / (y1 - y0)) * (H - 2 * pad);
    const ns = "http://www.w3.org/2000/svg";
    const svg = document.createElementNS(ns, "svg");
    svg.setAttribute("width", W); svg.setAttribute("height", H); svg.setAttribute("id", "entropy-curve");
    const add = (tag, attrs, text) => {
      const node = document.createElementNS(ns, tag);
      for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
      if (text !== undefined) node.textContent = text;
      svg.append(node);
    };
    if (meta.target !== null) {
      add("line", { x1: pad, x2: W - pad, y1: y(meta.target), y2: y(meta.target), stroke: "#2ca02c", "stroke-dasharray": "5 4" });
      add("text", { x: W - pad - 110, y: y(meta.target) - 4, fill: "#2ca02c", "font-size": 11 }, "target " + fmt(meta.target));
    }
    add("polyline", { points: points.map((p) => x(p.step) + "," + y(p.entropy)).join(" "), fill: "none", stroke: "#0b5cad", "stroke-width": 2 });
    for (const p of points) add("circle", { cx: x(p.step), cy: y(p.entropy), r: 3, fill: "#0b5cad" });
    add("text", { x: pad, y: 14, "font-size": 11, fill: "#555" }, "learner entropy (action tokens) per RL step");
    return svg;
  }

  function overview() {
    const head = el("tr", {}, el("th", { class: "l" }, "step"), el("th", {}, "saved"));
    for (const title of Object.values(meta.columns)) head.append(el("th", {}, title));
    head.append(el("th", { class: "l" }, "statuses"));
    const rows = meta.overview.map((row) => {
      const tr = el("tr", { "data-step": row.step, class: row.step === state.step ? "open" : null },
        el("td", { class: "l" }, el("a", { href: "#step=" + encodeURIComponent(row.step), class: "step-link" }, row.step)),
        el("td", {}, row.saved));
      for (const key of Object.keys(meta.columns)) {
        const value = row[key];
        if (key === "stare/gate_on" && value !== null && value !== undefined) {
          tr.append(el("td", { class: value ? "gate-on" : "gate-off" }, value ? "on" : "off"));
        } else tr.append(el("td", {}, fmt(value)));
      }
      tr.append(el("td", { class: "l muted" }, Object.entries(row.statuses).map(([k, v]) => k + " " + v).join(", ")));
      return tr;
    });
    return el("div", {},
      el("h2", {}, "Steps"),
      curve(),
      el("table", { id: "overview" }, el("thead", {}, head), el("tbody", {}, ...rows)));
  }

  // ---- one step ----
  function matches(t) {
    if (state.rmin !== "" && !(t.r >= Number(state.rmin))) return false;
    if (state.rmax !== "" && !(t.r <= Number(state.rmax))) return false;
    if (state.stop && t.sr !== state.stop) return false;
    if (state.group && t.g !== state.group) return false;
    if (state.status && t.st !== state.status) return false;
    return true;
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

  function stepView() {
    const data = stepData(state.step);
    if (!data) return el("p", { id: "step-view" }, "no saved rollouts for step " + state.step);
    const distinct = (f) => [...new Set(data.map(f))].sort();
    const mode = el("select", { id: "f-mode", onchange: (e) => { state.mode = e.target.value; recolour(); } },
      el("option", { value: "stare", selected: state.mode === "stare" ? "selected" : null }, "STARE weight"),
      el("option", { value: "surprisal", selected: state.mode === "surprisal" ? "selected" : null }, "surprisal"));
    return el("div", { id: "step-view" },
      el("h2", {}, "Step " + state.step + " - " + data.length + " trajectories"),
      el("div", { class: "bar" },
        number("f-rmin", "reward ≥"), number("f-rmax", "reward ≤"),
        options("f-stop", "stop reason", distinct((t) => t.sr), state.stop),
        options("f-group", "group", distinct((t) => t.g), state.group),
        options("f-status", "status", distinct((t) => t.st), state.status),
        el("label", {}, "colour by", mode),
        el("span", { id: "f-count", class: "muted" })),
      el("div", { class: "legend muted" },
        el("span", { class: "t lplus" }, "L+ amplified"), el("span", { class: "t lminus" }, "L- attenuated"),
        el("span", { class: "t would" }, "selected, not reweighted (gate off / O1)"),
        el("span", { class: "obs" }, "observation (not trained)"),
        "surprisal mode: darker = more surprising (-log π)"),
      el("div", { id: "list" }));
  }

  function list() {
    const data = stepData(state.step);
    const holder = document.getElementById("list");
    if (!data || !holder) return;
    const shown = data.filter(matches);
    document.getElementById("f-count").textContent = shown.length + " of " + data.length + " shown";
    const head = el("tr", {}, ...["#", "group", "sample", "reward", "advantage", "stop reason", "status", "turns", "tokens", "version"]
      .map((h, k) => el("th", { class: k < 3 || k === 5 || k === 6 ? "l" : null }, h)));
    const body = el("tbody", {});
    for (const t of shown.slice(0, state.limit)) {
      const row = el("tr", { class: "traj", "data-i": t.i, onclick: () => toggle(row, t, data) },
        el("td", { class: "l" }, t.i), el("td", { class: "l" }, t.g), el("td", { class: "l" }, t.si),
        el("td", {}, fmt(t.r)), el("td", {}, fmt(t.a)), el("td", { class: "l" }, t.sr), el("td", { class: "l" }, t.st),
        el("td", {}, t.nt), el("td", {}, t.m.length), el("td", {}, t.wv));
      body.append(row);
    }
    const more = shown.length > state.limit
      ? el("button", { id: "more", onclick: () => { state.limit += PAGE; list(); } }, "show " + Math.min(PAGE, shown.length - state.limit) + " more")
      : null;
    holder.replaceChildren(el("table", { id: "trajectories" }, el("thead", {}, head), body), more);
  }

  function toggle(row, t, data) {
    const next = row.nextElementSibling;
    if (next && next.classList.contains("detail-row")) { next.remove(); row.classList.remove("open"); return; }
    row.classList.add("open");
    row.after(el("tr", { class: "detail-row" }, el("td", { colspan: 10, class: "l" }, detail(t, data))));
  }

  // ---- one trajectory ----
  function detail(t, data) {
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
    const box = el("div", { class: "detail", "data-i": t.i },
      el("div", { class: "muted" }, facts),
      t.err ? el("div", { class: "obs" }, "error: " + t.err) : null,
      groupTable,
      el("details", {}, el("summary", {}, "prompt"), el("div", { class: "prompt" }, t.prompt || "(not saved)")));
    if (t.tok) box.append(...tokenTurns(t));
    else box.append(...textTurns(t));
    return box;
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
        for (let j = start; j < end; j++) {
          const span = el("span", { class: "t", "data-j": j, "data-s": t.s[j],
            "data-w": t.w ? t.w[j] : null, "data-sel": t.sel ? t.sel[j] : null }, t.tok[j]);
          colour(span);
          tokens.append(span);
        }
        out.push(el("div", { class: "turn" }, turnHead(t, turn), tokens));
        turn++;
      } else {
        out.push(el("div", { class: "obs", "data-from": start },
          el("span", { class: "obs-head" }, "observation · " + (end - start) + " tokens · not trained"),
          t.tok.slice(start, end).join("")));
      }
      start = end;
    }
    return out;
  }

  function textTurns(t) {
    return t.turns.map((turn, k) => el("div", { class: "turn" }, turnHead(t, k),
      el("div", { class: "tokens" }, turn.text),
      turn.obs ? el("div", { class: "obs" }, el("span", { class: "obs-head" }, "observation"), turn.obs) : null));
  }

  function colour(span) {
    const s = Number(span.dataset.s), w = span.dataset.w, sel = span.dataset.sel;
    span.classList.remove("lplus", "lminus", "would", "neg");
    span.style.background = "";
    if (state.mode === "surprisal") {
      span.style.background = "rgba(255, 127, 14, " + (Math.min(s / 8, 1) * 0.9).toFixed(3) + ")";
      span.title = "surprisal " + s;
      return;
    }
    const weight = w === undefined ? 1 : Number(w);
    if (weight > 1) span.classList.add("lplus");
    else if (weight < 1) span.classList.add("lminus");
    else if (sel === "+") span.classList.add("would");
    else if (sel === "-") span.classList.add("would", "neg");
    span.title = "weight " + (w === undefined ? "-" : w) + " · surprisal " + s + (sel && sel !== "0" ? " · L" + sel : "");
  }
  function recolour() { document.querySelectorAll("span.t").forEach(colour); }

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
    const children = [el("h1", {}, meta.title), el("div", { class: "muted" }, "stare-agents rollouts · " + meta.overview.length + " step(s)"), notices(), overview()].filter((c) => c !== null);
    if (state.step !== null) children.push(stepView());
    else children.push(el("p", { class: "muted", id: "hint" }, "open a step above to list its trajectories"));
    app.replaceChildren(...children);
    if (state.step !== null) list();
  }
  readHash();
  if (state.step === null && meta.overview.length === 1) state.step = meta.overview[0].step;
  render();
})();
