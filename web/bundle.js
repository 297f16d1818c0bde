// A bertforge bundle in the browser: onnxruntime-web (single-threaded WASM, no COOP/COEP needed) and the
// tokenizer.json of the bundle read by @huggingface/tokenizers. The graph holds pooling, normalisation,
// softmax/sigmoid, thresholds and the NER argmax, so this file only tokenizes, pads and runs.
import * as ort from "onnxruntime-web";
import { Tokenizer } from "@huggingface/tokenizers";

export function configure(wasmBase) {
  ort.env.wasm.numThreads = 1;
  ort.env.wasm.proxy = false;
  ort.env.wasm.wasmPaths = wasmBase;
}

async function getJSON(url) {
  const r = await fetch(url);
  if (!r.ok) throw new Error(`${url}: HTTP ${r.status}`);
  return r.json();
}

// Whether a tokenizer.json normalizer lowercases (BertNormalizer lowercase, Lowercase, or inside a Sequence).
function lowercases(n) {
  if (!n) return false;
  if (n.type === "Sequence") return (n.normalizers || []).some(lowercases);
  return n.type === "Lowercase" || (n.type === "BertNormalizer" && n.lowercase !== false);
}

export class Bundle {
  static async open(base, name = null) {
    if (!base.endsWith("/")) base += "/";
    const manifest = await getJSON(base + "manifest.json");
    const names = Object.keys(manifest.models);
    name = name ?? names[0];
    const entry = manifest.models[name];
    if (!entry) throw new Error(`bundle has no model ${name}; it holds ${names.join(", ")}`);
    const tokJson = await getJSON(base + entry.tokenizer);
    const tok = new Tokenizer(tokJson, {});
    const t0 = performance.now();
    const session = await ort.InferenceSession.create(base + entry.graph,
      { executionProviders: ["wasm"], graphOptimizationLevel: "all" });
    const b = new Bundle();
    Object.assign(b, { base, manifest, name, entry, tok, session, kind: entry.kind,
                       labels: entry.labels, maxLength: entry.max_length, loadMs: performance.now() - t0,
                       lowercase: lowercases(tokJson.normalizer) });
    return b;
  }

  // Token ids of one text, truncated as the manifest says: the content tokens are cut on the right so that
  // the special tokens the post-processor adds still fit in max_length (what tokenizers' truncation does).
  encode(text) {
    text = this.lower(text);
    const full = this.tok.encode(text).ids;
    if (full.length <= this.maxLength) return full;
    const content = this.tok.encode(text, { add_special_tokens: false }).ids;
    let at = 0;
    while (at + content.length <= full.length && full[at] !== content[0]) at++;
    const prefix = full.slice(0, at), suffix = full.slice(at + content.length);
    return prefix.concat(content.slice(0, this.maxLength - prefix.length - suffix.length), suffix);
  }

  // The Rust normalizer lowercases one code point at a time; String.toLowerCase applies context rules
  // (a word-final Σ becomes ς, not σ). Lowercasing per code point first makes both give the same ids.
  lower(text) { return this.lowercase ? Array.from(text, (c) => c.toLowerCase()).join("") : text; }

  // A (question, context) pair as tokenizers' "longest_first" truncation to max_length leaves it:
  // {ids, typeIds, context: [first, last + 1) token positions of the context}. The special tokens the
  // post-processor puts around and between the two texts are kept; of the content, the shorter text keeps
  // min(its length, half the room) and the longer one the rest (what the Rust tokenizer does).
  encodePair(question, context) {
    const q = this.lower(question), c = this.lower(context);
    const full = this.tok.encode(q, { text_pair: c, return_token_type_ids: true });
    const qa = this.tok.encode(q, { add_special_tokens: false }).ids;
    const ca = this.tok.encode(c, { add_special_tokens: false }).ids;
    const ids = full.ids, types = full.token_type_ids ?? ids.map(() => 0);
    let p = 0;  // where the question starts (after the leading special tokens; an empty one: anywhere before m)
    while (qa.length && p + qa.length <= ids.length && ids[p] !== qa[0]) p++;
    let m = p + qa.length;  // where the context starts (after the special tokens between the texts)
    while (ca.length && m + ca.length <= ids.length && ids[m] !== ca[0]) m++;
    const room = this.maxLength - (ids.length - qa.length - ca.length);
    let n1 = qa.length, n2 = ca.length;
    if (n1 + n2 > room) {
      const swap = n1 > n2;
      let short = Math.min(n1, n2), long = Math.max(n1, n2);
      long = short > room ? short : Math.max(short, room - short);
      if (short + long > room) { short = Math.floor(room / 2); long = short + (room % 2); }
      [n1, n2] = swap ? [long, short] : [short, long];
    }
    const pick = (a, from, n) => a.slice(from, from + n);
    const cut = (a) => a.slice(0, p).concat(pick(a, p, n1), a.slice(p + qa.length, m), pick(a, m, n2),
                                            a.slice(m + ca.length));
    const start = p + n1 + (m - p - qa.length);
    return { ids: cut(ids), typeIds: cut(types), context: [start, start + n2] };
  }

  // rows: token ids per item, or {ids, typeIds} (pairs)
  feeds(rows) {
    const idsList = rows.map((r) => r.ids ?? r);
    const b = idsList.length, t = Math.max(...idsList.map((x) => x.length));
    const ids = new BigInt64Array(b * t), am = new BigInt64Array(b * t), tt = new BigInt64Array(b * t);
    idsList.forEach((row, i) => row.forEach((id, j) => { ids[i * t + j] = BigInt(id); am[i * t + j] = 1n; }));
    rows.forEach((r, i) => (r.typeIds ?? []).forEach((y, j) => { tt[i * t + j] = BigInt(y); }));
    const all = { input_ids: ids, attention_mask: am, token_type_ids: tt };
    const out = {};
    for (const n of this.entry.inputs) out[n] = new ort.Tensor("int64", all[n], [b, t]);
    return out;
  }

  // Every output for each text (or [question, context] pair), as plain arrays per item (token-level outputs
  // cut to the item's length).
  async run(texts) {
    const rows = texts.map((s) => {
      if (Array.isArray(s)) return this.encodePair(s[0], s[1]);
      const ids = this.encode(s);
      if (!ids.length) throw new Error("a text gives no token; give a non-empty text");
      return ids;
    });
    const idsList = rows.map((r) => r.ids ?? r);
    const res = await this.session.run(this.feeds(rows));
    const out = { ids: idsList, context: rows.map((r) => r.context ?? null) };
    for (const name of this.entry.outputs) {
      const r = res[name], dims = r.dims, data = Array.from(r.data, (x) => typeof x === "bigint" ? Number(x) : x);
      const per = dims.slice(1).reduce((a, c) => a * c, 1);
      out[name] = idsList.map((ids, i) => {
        const row = data.slice(i * per, (i + 1) * per);
        if (dims.length === 1) return row[0];  // (B,): one value per text (the label)
        if (dims.length === 3) {  // (B, T, C): cut to the text's tokens, one array per token
          const c = dims[2];
          return Array.from({ length: ids.length }, (_, j) => row.slice(j * c, (j + 1) * c));
        }
        if (["tag_ids", "tag_scores", "start_logits", "end_logits"].includes(name)) return row.slice(0, ids.length);
        return row;
      });
    }
    return out;
  }

  need(...kinds) {
    if (!kinds.includes(this.kind)) throw new Error(`this bundle's model is a ${this.kind} model`);
  }

  async embed(texts) { this.need("embedding"); return (await this.run(texts)).sentence_embedding; }

  async classify(texts) {
    this.need("classification", "multi_label", "regression");
    const o = await this.run(texts);
    const names = this.labels ?? o.scores[0].map((_, j) => String(j));
    return o.scores.map((s, i) => {
      if (this.kind === "regression") return { score: s[0] };
      const scores = Object.fromEntries(s.map((p, j) => [names[j], p]));
      if (this.kind === "multi_label") return { labels: names.filter((_, j) => o.predicted[i][j]), scores };
      return { label: names[o.label[i]], score: s[o.label[i]], scores };
    });
  }

  // The best answer span of `context` (what bertforge_lite's Bundle.qa picks): the context tokens [start, end]
  // with end ≥ start, at most maxAnswerTokens long, of the highest start + end logit. The answer is those
  // tokens decoded (this tokenizer build gives no character offsets: an uncased model's answer is lowercase).
  async qa(question, context, maxAnswerTokens = 30) {
    this.need("question_answering");
    const o = await this.run([[question, context]]);
    const s = o.start_logits[0], e = o.end_logits[0], [c0, c1] = o.context[0];
    let best = { score: -Infinity, start: -1, end: -1 };
    for (let a = c0; a < c1; a++) {
      for (let j = a; j < Math.min(c1, a + maxAnswerTokens); j++) {
        if (s[a] + e[j] > best.score) best = { score: s[a] + e[j], start: a, end: j };
      }
    }
    const answer = best.start < 0 ? "" : this.tok.decode(o.ids[0].slice(best.start, best.end + 1),
                                                          { skip_special_tokens: true });
    return { answer, ...best, ids: o.ids[0] };
  }

  // Per text: [{token, tag, score}] for every token that is not special.
  async tag(texts) {
    this.need("token_classification");
    const o = await this.run(texts);
    return o.ids.map((ids, i) => ids.map((id, j) => ({ token: this.tok.id_to_token(id),
      tag: this.labels ? this.labels[o.tag_ids[i][j]] : String(o.tag_ids[i][j]), score: o.tag_scores[i][j] }))
      .filter((x) => !/^\[(CLS|SEP|PAD)\]$|^<\/?s>$/.test(x.token)));
  }
}
