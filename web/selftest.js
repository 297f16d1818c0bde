// The browser check (tests/test_bundle_in_chromium.py): for every model of the bundle, the token ids and
// outputs of the golden inputs (manifest) and of the fuzz texts (fetched from `fuzzUrl`), POSTed back to
// the test's server as JSON: {models: {name: {golden: [...], fuzz: [...]}}, ms_per_text, error}.
import { Bundle } from "./bundle.js";

export async function selftest(base, fuzzUrl) {
  const report = { models: {}, error: null };
  try {
    const fuzz = await (await fetch(fuzzUrl)).json();
    if (!base.endsWith("/")) base += "/";
    const manifest = await (await fetch(base + "manifest.json")).json();
    for (const name of Object.keys(manifest.models)) {
      const b = await Bundle.open(base, name);
      const golden = [];
      for (const g of b.entry.golden) {
        if (Array.isArray(g.input)) continue;  // QA pairs: the page does not ask questions
        const o = await b.run([g.input]);
        golden.push({ input_ids: o.ids[0], outputs: Object.fromEntries(b.entry.outputs.map((n) => [n, o[n][0]])) });
      }
      const rows = [];
      const t0 = performance.now();
      for (const text of fuzz) {
        try {
          const o = await b.run([text]);
          rows.push({ input_ids: o.ids[0], outputs: Object.fromEntries(b.entry.outputs.map((n) => [n, o[n][0]])) });
        } catch (err) { rows.push({ error: String(err.message || err) }); }
      }
      report.models[name] = { golden, fuzz: rows, ms_per_text: (performance.now() - t0) / fuzz.length,
                              load_ms: b.loadMs };
    }
  } catch (err) { report.error = String(err.stack || err); }
  await fetch("/result", { method: "POST", body: JSON.stringify(report) });
  document.title = "selftest done";
}
