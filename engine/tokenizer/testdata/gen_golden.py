#!/usr/bin/env python3
"""Generates golden.json: pre-tokenizer words and token ids for random tricky
strings, from an implementation independent of the Go package:

- pre-tokenization: the Hugging Face regexes run by the Python `regex` module
  (gpt-2: the GPT-2 pattern; qwen2, qwen35: llama.cpp's spelling of the Qwen2
  and Qwen3.5 patterns, whose contractions are ASCII [sS]-style rather than
  (?i:...); qwen35 differs from qwen2 only by \p{M} in the letter and
  punctuation classes, src/llama-vocab.cpp LLAMA_VOCAB_PRE_TYPE_QWEN35);
- BPE: OpenAI GPT-2 encoder.py's merge loop (lowest rank first, all
  occurrences per pass) over the merges of the fixture GGUF, read by a small
  GGUF metadata parser below;
- special tokens: "<|endoftext|>" split out when parse_special is true.

Run: python3 gen_golden.py ../../../../shared/fixtures/tiny-qwen3moe-Q4_K_M.gguf > golden.json
(needs `pip install regex`; deterministic: random.seed(7)).
"""
import json, random, struct, sys
import regex

PATS = {
    "gpt-2": regex.compile(r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""),
    "qwen2": regex.compile(r"""(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""),
}
QWEN35 = regex.compile(r"""(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+""")

def read_kv(path):
    b = open(path, "rb").read()
    off = 0
    def u32():
        nonlocal off; v = struct.unpack_from("<I", b, off)[0]; off += 4; return v
    def u64():
        nonlocal off; v = struct.unpack_from("<Q", b, off)[0]; off += 8; return v
    def s():
        nonlocal off; n = u64(); v = b[off:off+n].decode("utf-8"); off += n; return v
    sizes = {0:1,1:1,2:2,3:2,4:4,5:4,6:4,7:1,10:8,11:8,12:8}
    fmts = {0:"<B",1:"<b",2:"<H",3:"<h",4:"<I",5:"<i",6:"<f",7:"<?",10:"<Q",11:"<q",12:"<d"}
    def val(t):
        nonlocal off
        if t == 8: return s()
        if t == 9:
            et = u32(); n = u64(); return [val(et) for _ in range(n)]
        v = struct.unpack_from(fmts[t], b, off)[0]; off += sizes[t]; return v
    assert b[:4] == b"GGUF"; off = 4
    u32(); u64(); nkv = u64()
    kv = {}
    for _ in range(nkv):
        k = s(); kv[k] = val(u32())
    return kv

def bytes_to_unicode():
    bs = list(range(ord("!"), ord("~")+1)) + list(range(ord("¡"), ord("¬")+1)) + list(range(ord("®"), ord("ÿ")+1))
    cs = bs[:]; n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b); cs.append(256+n); n += 1
    return dict(zip(bs, map(chr, cs)))

def get_pairs(w):
    return set(zip(w, w[1:]))

def bpe(tok, ranks):
    word = tuple(tok)
    pairs = get_pairs(word)
    while pairs:
        big = min(pairs, key=lambda p: ranks.get(p, float("inf")))
        if big not in ranks: break
        a, c = big; nw = []; i = 0
        while i < len(word):
            try:
                j = word.index(a, i)
            except ValueError:
                nw.extend(word[i:]); break
            nw.extend(word[i:j]); i = j
            if word[i] == a and i < len(word)-1 and word[i+1] == c:
                nw.append(a+c); i += 2
            else:
                nw.append(word[i]); i += 1
        word = tuple(nw)
        pairs = get_pairs(word)
    return word

ALPHA = (list("abcstdmlrveSTDMLRVExyz") * 3 + list("éñüßЖд東京αǅʰا") +
         list("0129") * 2 + list("٣²Ⅻ½") +
         [" "] * 12 + list("\t\n\r\n\u00a0\u3000\u2028\u0085\u2003\x0b\x0c") +
         list("''',.!?-_()#\"<|>—…$+@") + ["🙂", "👍", "🏽", "❤", "\u0301", "\u200d", "\ufe0f"] +
         ["<|endoftext|>", "'s", "'RE", "'ll", "  ", "\n\n", " \n "])

# Combining marks (Mn, Mc, Me) and letters of scripts that use them, for the
# qwen35 cases appended after the original ones (long-stable code points, so
# the Unicode versions of Python, Go and llama.cpp agree on them).
MARKS = (["\u0301", "\u0302", "\u0323", "\u094d", "\u0947", "\u093f", "\u0902", "\u0e31", "\u0e48",
          "\u05b8", "\u05c1", "\u302e", "\u20dd", "\u20e3", "\ufe0f"] * 3 +
         list("नमसतहदสวดทשלוםe") + ["\u1112\u1161\u11ab"])

def case(pre, pat, text, ps, tid, ranks, b2u):
    parts = text.split("<|endoftext|>") if ps else [text]
    words, ids = [], []
    for k, part in enumerate(parts):
        if k > 0:
            ids.append(tid["<|endoftext|>"])
        for w in pat.findall(part):
            words.append(w)
            ids.extend(tid[t] for t in bpe("".join(b2u[x] for x in w.encode("utf-8")), ranks))
    return {"pre": pre, "parse_special": ps, "text": text, "words": words, "ids": ids}

def main():
    kv = read_kv(sys.argv[1])
    toks = kv["tokenizer.ggml.tokens"]
    tid = {t: i for i, t in enumerate(toks)}
    ranks = {}
    for i, m in enumerate(kv["tokenizer.ggml.merges"]):
        a, c = m.split(" ", 1)
        ranks.setdefault((a, c), i)
    b2u = bytes_to_unicode()
    random.seed(7)
    out = []
    for n in range(300):
        text = "".join(random.choice(ALPHA) for _ in range(random.randint(1, 24)))
        for pre, pat in PATS.items():
            ps = n % 2 == 0
            parts = text.split("<|endoftext|>") if ps else [text]
            words, ids = [], []
            for k, part in enumerate(parts):
                if k > 0:
                    ids.append(tid["<|endoftext|>"])
                for w in pat.findall(part):
                    words.append(w)
                    ids.extend(tid[t] for t in bpe("".join(b2u[x] for x in w.encode("utf-8")), ranks))
            out.append({"pre": pre, "parse_special": ps, "text": text, "words": words, "ids": ids})
    # qwen35: the same 300 texts, then 200 with combining marks under all
    # three patterns.
    random.seed(7)
    for n in range(300):
        text = "".join(random.choice(ALPHA) for _ in range(random.randint(1, 24)))
        out.append(case("qwen35", QWEN35, text, n % 2 == 0, tid, ranks, b2u))
    random.seed(35)
    pats = dict(PATS, qwen35=QWEN35)
    for n in range(200):
        text = "".join(random.choice(ALPHA + MARKS) for _ in range(random.randint(1, 24)))
        for pre, pat in pats.items():
            out.append(case(pre, pat, text, n % 2 == 0, tid, ranks, b2u))
    sys.stdout.write("[\n" + ",\n".join(json.dumps(o, ensure_ascii=True) for o in out) + "\n]\n")

main()
