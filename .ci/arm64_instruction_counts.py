"""Instructions per 64 weights of the NEON paths' inner loops, counted from the cross-compiled objects
(aarch64-linux-gnu-objdump), for BENCHMARKS.md: the decode loop (one token) and the batched product, of the ternary
2-bit tiles and of the int8 head. An inner loop is found as the backward branch whose body holds the path's multiply
instructions (smull/smlal on neon, sdot, smmla) and no inner loop: the smallest such body for one token, the one with
the most multiplies for a batch (a block of 4 tokens; on neon, whose batch loop is generic, the block's inner loop);
its weights are what those multiplies cover, per token.
    python .ci/arm64_instruction_counts.py [build/temp.linux-aarch64-cpython-311/_kernels]"""
import re
import subprocess
import sys

OBJ = sys.argv[1] if len(sys.argv) > 1 else "build/temp.linux-aarch64-cpython-311/_kernels"
# products of weights by one token that one instruction makes
PRODUCTS = {"smull": 8, "smull2": 8, "smlal": 8, "smlal2": 8, "sdot": 16, "smmla": 32}


def loops(obj: str, func: str):
    """(instructions, {multiply op: count}) of each loop (a backward branch's body) of `func` in `obj`."""
    out = subprocess.run(["aarch64-linux-gnu-objdump", "-d", "--no-show-raw-insn", obj], capture_output=True,
                         text=True, check=True).stdout
    body, cur = [], None
    for line in out.splitlines():
        m = re.match(r"^[0-9a-f]+ <(\S+)>:", line)
        if m:
            cur = m.group(1)
            continue
        m = re.match(r"^\s+([0-9a-f]+):\s+(\S+)\s*(.*)$", line)
        if m and cur == func:
            body.append((int(m.group(1), 16), m.group(2), m.group(3)))
    addrs = [a for a, _, _ in body]
    found = []
    for i, (a, op, args) in enumerate(body):
        m = re.search(r"\b([0-9a-f]+) <", args)
        if m and (op in ("b", "cbz", "cbnz", "tbz", "tbnz") or op.startswith("b.")):
            target = int(m.group(1), 16)
            if target <= a and target in addrs:
                ops = [o for _, o, _ in body[addrs.index(target):i + 1]]
                mults = {o: ops.count(o) for o in PRODUCTS if ops.count(o)}
                if mults:
                    found.append((target, a, len(ops), mults))
    # the innermost ones: loops that hold no other loop with multiplies
    for start, end, n, mults in found:
        if not any(s0 >= start and e0 <= end and (s0, e0) != (start, end) for s0, e0, _, _ in found):
            yield n, mults


def per_64_weights(obj: str, func: str, batch: bool) -> str:
    found = list(loops(obj, func))
    if not found:
        return "-"
    if batch:
        n, mults = max(found, key=lambda f: (sum(f[1].values()), -f[0]))
    else:
        n, mults = min(found, key=lambda f: f[0])
    products = sum(PRODUCTS[o] * c for o, c in mults.items())
    return f"{64 * n / products:.1f} ({n} instructions, {', '.join(f'{c} {o}' for o, c in sorted(mults.items()))})"


def main() -> None:
    rows = [("neon", "kernels_neon.o", "kernels_neon.o"),
            ("neon-dotprod", "kernels_neon_dotprod.o", "kernels_neon_dotprod.o"),
            ("neon-i8mm", "kernels_neon_dotprod.o", "kernels_neon_i8mm.o")]   # i8mm decodes one token with sdot
    print("| path | ternary decode (1 token) | ternary batch | int8 head decode | int8 head batch |")
    print("|---|---|---|---|---|")
    for name, one, batch in rows:
        cells = [per_64_weights(f"{OBJ}/{one}", "ternary_matmul", False),
                 per_64_weights(f"{OBJ}/{batch}", "ternary_matmul", True),
                 per_64_weights(f"{OBJ}/{one}", "int8_matmul", False),
                 per_64_weights(f"{OBJ}/{batch}", "int8_matmul", True)]
        print(f"| {name} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
