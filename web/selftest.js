// The browser check (tests/test_bundle_in_chromium.py): for every model of the bundle, the token ids and
// outputs of the golden inputs (manifest) and of the fuzz texts (fetched from `fuzzUrl`), POSTed back to
// the test's server as JSON: {models: {name: {golden: [...], fuzz: [...]}}, ms_per_text, error}.
// A QA model reads (question, context) pairs: its golden pairs, and QA_FUZZ fuzz pairs (text i, text i + 1);
// each row adds the answer span the page picks ({start, end, score}: token positions).
import { Bundle } from "./bundle.js";

export const QA_FUZZ = 300;

async function row(b, item) {
  const o = await b.run([item]);
  const r = { input_ids: o.ids[0], outputs: Object.fromEntries(b.entry.outputs.map((n) => [n, o[n][0]])) };
  if (b.kind === "question_answering") {
    const a = await b.qa(item[0], item[1]);
    r.span = { start: a.start, end: a.end, score: a.score, answer: a.answer };
  }
  return r;
}

export async function selftest(base, fuzzUrl) {
  const report = { models: {}, error: null };
  try {
    const fuzz = await (await fetch(fuzzUrl)).json();
    if (!base.endsWith("/")) base += "/";
    const manifest = await (await fetch(base + "manifest.json")).json();
    for (const name of Object.keys(manifest.models)) {
      const b = await Bundle.open(base, name);
      const golden = [];
      for (const g of b.entry.golden) golden.push(await row(b, g.input));
      const items = b.kind === "question_answering"
        ? fuzz.slice(0, QA_FUZZ).map((t, i) => [t, fuzz[(i + 1) % fuzz.length]]) : fuzz;
      const rows = [];
      const t0 = performance.now();
      for (const item of items) {
        try { rows.push(await row(b, item)); } catch (err) { rows.push({ error: String(err.message || err) }); }
      }
      report.models[name] = { golden, fuzz: rows, ms_per_text: (performance.now() - t0) / items.length,
                              load_ms: b.loadMs };
    }
  } catch (err) { report.error = String(err.stack || err); }
  await fetch("/result", { method: "POST", body: JSON.stringify(report) });
  document.title = "selftest done";
}
