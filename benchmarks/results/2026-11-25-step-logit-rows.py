import sys, time, numpy as np, bitnet_app
isa = sys.argv[1] if len(sys.argv) > 1 else None
m = bitnet_app.load_model("demo", threads=2, isa=isa)
e = m.engine
ids = np.random.default_rng(0).integers(10, e.vocab_size, size=200)
e.forward(ids[:128], start=0, commit=True)
blk = np.ascontiguousarray(ids[128:160], dtype=np.int32)
def best(f, n=300, rep=5):
    b = 1e9
    for _ in range(rep):
        t = time.perf_counter()
        for _ in range(n): f()
        b = min(b, (time.perf_counter() - t) / n)
    return b * 1e3
cases = {"32 rows, all logits": list(range(32)), "32 rows, 7 logits": [8, 9, 11, 12, 13, 14, 15],
         "32 rows, 1 logit": [31], "32 rows, 8 logits (tail split)": list(range(16, 24))}
for name, rows in cases.items():
    print(f"{name:34s} {best(lambda: e.forward(blk, start=128, commit=False, attention='block', block_size=32, rows=rows)):.3f} ms")
one = np.ascontiguousarray(ids[128:129], dtype=np.int32)
print(f"{'1 row':34s} {best(lambda: e.forward(one, start=128, commit=False)):.3f} ms")
