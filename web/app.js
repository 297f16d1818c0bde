// The page: open a bundle, then embed (semantic search over SENTENCES), classify, tag or answer what is typed.
// ?bundle=URL opens one at load; ?selftest=URL runs the golden + fuzz check of selftest.js instead.
import { Bundle, configure } from "./bundle.js";
import { SENTENCES } from "./sentences.js";

configure(new URL("./node_modules/onnxruntime-web/dist/", location.href).href);
const $ = (id) => document.getElementById(id);
const params = new URLSearchParams(location.search);
let bundle = null, index = null;

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
      (e.dim ? `, ${e.dim}-d vectors` : "") + ` — loaded in ${bundle.loadMs.toFixed(0)} ms`;
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
  const t0 = performance.now();
  const [q] = await bundle.embed([$("query").value]);
  const ms = performance.now() - t0;
  const norm = (v) => Math.sqrt(v.reduce((a, x) => a + x * x, 0)) || 1;
  const nq = norm(q);
  const hits = index.map((v, i) => [v.reduce((a, x, j) => a + x * q[j], 0) / (norm(v) * nq), i])
    .sort((a, b) => b[0] - a[0]).slice(0, 5);
  $("hits").innerHTML = hits.map(([s, i]) => `<tr><td>${s.toFixed(3)}</td><td>${SENTENCES[i]}</td></tr>`).join("") +
    `<tr><td colspan=2><small>query embedded in ${ms.toFixed(1)} ms</small></td></tr>`;
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
  const t0 = performance.now();
  const a = await bundle.qa($("qaQuestion").value, $("qaContext").value);
  const esc = (x) => x.replace(/[&<>"]/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;" })[c]);
  $("qaOut").innerHTML = a.start < 0 ? "<small>no context token is left to answer from</small>"
    : `<b>${esc(a.answer)}</b> <small>tokens ${a.start}–${a.end}, score ${a.score.toFixed(3)}, ` +
      `${(performance.now() - t0).toFixed(1)} ms</small>`;
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
