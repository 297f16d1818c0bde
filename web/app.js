// The page: open a bundle, then embed (semantic search over SENTENCES), classify, tag or answer what is typed.
// ?bundle=URL opens one at load; ?selftest=URL runs the golden + fuzz check of selftest.js instead.
import { Bundle, configure } from "./bundle.js";
import { SENTENCES } from "./sentences.js";

configure(new URL("./node_modules/onnxruntime-web/dist/", location.href).href);
const $ = (id) => document.getElementById(id);
const params = new URLSearchParams(location.search);
let bundle = null, index = null;

// The wall-clock time of the awaited work f(): performance.now() around it. {value, ms}.
async function timed(f) {
  const t0 = performance.now();
  const value = await f();
  return { value, ms: performance.now() - t0 };
}

// The smallest step this page's clock takes (performance.now() is coarsened, to 0.1 ms where the page is not
// cross-origin isolated), or 0 when it does not move while code runs: virtual time (headless Chromium's
// --virtual-time-budget) freezes it, so work of any length reads 0 there.
function clockStep() {
  const a = performance.now();
  for (let i = 0; i < 2e6; i++) { const b = performance.now(); if (b !== a) return b - a; }
  return 0;
}

// A measured time as text: never "0.0 ms" for work that took time. Above the clock's step, with enough
// digits (2 significant below 10 ms); a reading of 0 is "< step" when the clock moves, else said to be unknown.
function fmtMs(ms) {
  if (ms > 0) return `${ms >= 100 ? ms.toFixed(0) : ms >= 10 ? ms.toFixed(1) : ms.toPrecision(2)} ms`;
  const step = clockStep();
  return step > 0 ? `< ${+step.toPrecision(2)} ms` : "an unknown time (the page's clock is frozen: virtual time)";
}

function show(which) {
  $("embedBox").hidden = !bundle || bundle.kind !== "embedding";
  $("classifyBox").hidden = !bundle || !["classification", "multi_label", "regression"].includes(bundle.kind);
  $("tagBox").hidden = !bundle || bundle.kind !== "token_classification";
  $("qaBox").hidden = !bundle || bundle.kind !== "question_answering";
}

async function open(url) {
  $("status").textContent = "loading…"; $("status").className = "";
  try {
    bundle = await Bundle.open(url, params.get("model"));
    const e = bundle.entry;
    $("info").textContent = `${bundle.name}: ${e.kind}, ${e.precision}, max ${e.max_length} tokens` +
      (e.dim ? `, ${e.dim}-d vectors` : "") + ` — loaded in ${fmtMs(bundle.loadMs)}`;
    $("status").textContent = "ready";
    index = null;
    show();
  } catch (err) { $("status").textContent = String(err.message || err); $("status").className = "err"; }
}

async function search() {
  if (!index) {
    $("status").textContent = `embedding ${SENTENCES.length} sentences…`;
    index = [];
    for (let i = 0; i < SENTENCES.length; i += 32) index.push(...await bundle.embed(SENTENCES.slice(i, i + 32)));
    $("status").textContent = "ready";
  }
  // what the line under the hits claims: the query's text to its vector (tokenize, session.run with the
  // pooling inside the graph, the output read back), awaited, wall clock
  const { value: [q], ms } = await timed(() => bundle.embed([$("query").value]));
  const norm = (v) => Math.sqrt(v.reduce((a, x) => a + x * x, 0)) || 1;
  const nq = norm(q);
  const hits = index.map((v, i) => [v.reduce((a, x, j) => a + x * q[j], 0) / (norm(v) * nq), i])
    .sort((a, b) => b[0] - a[0]).slice(0, 5);
  $("hits").innerHTML = hits.map(([s, i]) => `<tr><td>${s.toFixed(3)}</td><td>${SENTENCES[i]}</td></tr>`).join("") +
    `<tr><td colspan=2><small id="queryTime">query embedded in ${fmtMs(ms)} (tokenizer, model and pooling; ` +
    `wall clock)</small></td></tr>`;
}

async function classify() {
  const [r] = await bundle.classify([$("clsText").value]);
  const rows = r.scores ? Object.entries(r.scores) : [["score", r.score]];
  $("clsOut").innerHTML = rows.map(([k, p]) => `<tr><td>${k}${(r.label === k || (r.labels || []).includes(k)) ? " ✓" : ""}` +
    `</td><td><span class="bar" style="width:${Math.max(1, 300 * Math.min(1, Math.abs(p)))}px"></span> ${p.toFixed(3)}</td></tr>`).join("");
}

async function tag() {
  const [toks] = await bundle.tag([$("tagText").value]);
  $("tagOut").innerHTML = toks.map((t) => `<span class="tok ${t.tag !== "O" ? "ent" : ""}" title="${t.score.toFixed(3)}">` +
    `${t.token}<small> ${t.tag}</small></span>`).join("");
}

async function answer() {
  const { value: a, ms } = await timed(() => bundle.qa($("qaQuestion").value, $("qaContext").value));
  const esc = (x) => x.replace(/[&<>"]/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;" })[c]);
  $("qaOut").innerHTML = a.start < 0 ? "<small>no context token is left to answer from</small>"
    : `<b>${esc(a.answer)}</b> <small>tokens ${a.start}–${a.end}, score ${a.score.toFixed(3)}, ` +
      `${fmtMs(ms)}</small>`;
}

const guard = (f) => async () => { try { await f(); } catch (err) { $("status").textContent = String(err.message || err); $("status").className = "err"; } };
$("open").onclick = guard(() => open($("bundleUrl").value));
$("search").onclick = guard(search);
$("classify").onclick = guard(classify);
$("tag").onclick = guard(tag);
$("qa").onclick = guard(answer);
show();

if (params.get("selftest")) {
  const { selftest } = await import("./selftest.js");
  await selftest(params.get("bundle") || "bundle/", params.get("selftest"));
} else if (params.get("bundle")) {
  $("bundleUrl").value = params.get("bundle");
  await open(params.get("bundle"));
  if (params.get("demo") && bundle && bundle.kind === "embedding") await guard(search)();
}
