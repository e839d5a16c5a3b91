"""The public 1.58-bit checkpoints the app knows by name, and what each needs on this machine.

    ENTRIES                        repo id -> Entry (shapes from the published config.json files, collected in
                                   the team's shared reference on model families, not part of this repository)
    needs(entry, roof_gb_s, packing) -> Needs: download, engine file, memory to run, bytes per token, expected tok/s
                                      (packing: the engine's ternary tiles, "2bit" or "1.6bit": body / 4 or / 5)
    read_roof_gb_s(threads)        -> GB/s the engine's threads reach reading memory (measured, ~1 s)
    available_ram()                -> bytes the OS can still give (MemAvailable), 0 if unknown
                                      (these two are machine.py's: the page reads the machine through the catalog)

The arithmetic, per model (body = the seven ternary projections of every layer):
    download     packed: body / 4 bytes (2 bits a weight) + bf16 embedding (+ bf16 lm_head when untied);
                 latent: 2 bytes a weight for body and embedding (fp16 / bf16 uploads)
    memory       what a decode keeps resident: the engine's ternary tiles (Entry.tile_bytes: body / 4 at 2 bits,
                 about body / 5 at 1.6 bits) + the int8 head (V x D)
                 + the bf16 embedding (V x D x 2, only its used rows are read) + the fp16 KV cache of a
                 4096-token conversation (or the model's context if shorter): 2 x L x ctx x G x hd x 2 bytes
    per token    the bytes one decode step streams: the ternary tiles + the int8 head (V x D); the KV cache read is
                 extra and grows with the conversation (not counted)
    expected     read roof / bytes per token: the ceiling a decode step can reach (the engine reaches 86..94% of
                 it on AVX2 for 2B-4T and the Llama-family shapes, benchmarks/BENCHMARKS.md)
Every figure is an estimate from the published shapes, not a measurement of the model; shapes marked
`verified=False` are that reference's best estimate (no config.json was seen). A model's family (its rules,
among them whether its head is tied) is its record in checkpoint/families.py.
"""
from dataclasses import dataclass

from .checkpoint.families import FAMILIES
from .machine import available_ram, read_roof_gb_s  # noqa: F401  (for the page: see above)

KV_CONTEXT = 4096   # conversation length the memory figure assumes


@dataclass(frozen=True)
class Entry:
    repo: str
    name: str        # for people
    family: str      # a name of checkpoint/families.py FAMILIES: "bitnet" | "llama" | "1bitllm"
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    context: int
    weights: str     # "packed" (U8 + weight_scale) | "latent" (bf16 / fp16 master weights)
    chat: bool       # has a chat template (else: completion)
    verified: bool = True

    def __post_init__(self):
        if self.family not in FAMILIES:
            raise ValueError(f"{self.repo}: unknown family {self.family!r} (checkpoint/families.py)")

    @property
    def tied(self) -> bool:
        """The head is the embedding (its family's rule)."""
        return FAMILIES[self.family].tied_head

    @property
    def body(self) -> int:
        """Ternary weights: q, k, v, o, gate, up, down of every layer."""
        q, kv = self.heads * self.head_dim, self.kv_heads * self.head_dim
        return self.layers * (2 * self.hidden * q + 2 * self.hidden * kv + 3 * self.hidden * self.intermediate)

    def tile_bytes(self, packing: str = "2bit") -> int:
        """The engine's ternary tiles of every layer (qkv, o, gate_up, down; engine/packing.py): 4 codes a byte
        ("2bit") or 5 ("1.6bit"), rows padded to 16, columns to 16 (2 bits) or each row to groups of 20 columns."""
        q, kv = self.heads * self.head_dim, self.kv_heads * self.head_dim

        def tiles(n, k):
            cols = -(-k // 16) * 16
            return -(-n // 16) * 16 * (cols // 4 if packing == "2bit" else -(-cols // 20) * 4)
        D, I = self.hidden, self.intermediate
        return self.layers * (tiles(q + 2 * kv, D) + tiles(D, q) + tiles(2 * I, D) + tiles(D, I))


@dataclass(frozen=True)
class Needs:
    download_bytes: int
    engine_bytes: int
    memory_bytes: int
    bytes_per_token: int
    expected_tok_s: float | None   # None when the read roof is unknown


# One row a checkpoint, Entry's fields in order: repo, name, family, hidden, intermediate, layers, heads, kv_heads,
# head_dim, vocab, context, weights, chat[, verified]
ENTRIES = {e.repo: e for e in (Entry(*row) for row in (
    ("microsoft/bitnet-b1.58-2B-4T", "BitNet b1.58 2B-4T (Microsoft)", "bitnet", 2560, 6912, 30, 20, 5, 128, 128256, 4096, "packed", True),
    ("microsoft/bitnet-b1.58-2B-4T-bf16", "BitNet b1.58 2B-4T, bf16 master weights", "bitnet", 2560, 6912, 30, 20, 5, 128, 128256, 4096, "latent", True),
    ("tiiuae/Falcon3-1B-Instruct-1.58bit", "Falcon3 1B Instruct 1.58-bit (TII)", "llama", 2048, 8192, 18, 8, 4, 256, 131072, 8192, "packed", True),
    ("tiiuae/Falcon3-3B-Instruct-1.58bit", "Falcon3 3B Instruct 1.58-bit (TII)", "llama", 3072, 9216, 22, 12, 4, 256, 131072, 4096, "packed", True, False),
    ("tiiuae/Falcon3-7B-Instruct-1.58bit", "Falcon3 7B Instruct 1.58-bit (TII)", "llama", 3072, 23040, 28, 12, 4, 256, 131072, 8192, "packed", True),
    ("tiiuae/Falcon3-10B-Instruct-1.58bit", "Falcon3 10B Instruct 1.58-bit (TII)", "llama", 3072, 23040, 40, 12, 4, 256, 131072, 32768, "packed", True, False),
    ("HF1BitLLM/Llama3-8B-1.58-100B-tokens", "Llama3 8B 1.58-bit, 100B tokens (HF1BitLLM)", "llama", 4096, 14336, 32, 32, 8, 128, 128256, 8192, "packed", True, False),
    ("1bitLLM/bitnet_b1_58-large", "bitnet_b1_58-large, the 2024 paper's reproduction (base model)", "1bitllm", 1536, 4096, 24, 16, 16, 96, 32002, 2048, "latent", False),
    ("1bitLLM/bitnet_b1_58-3B", "bitnet_b1_58-3B, the 2024 paper's reproduction (base model)", "1bitllm", 3200, 8640, 26, 32, 32, 100, 32002, 2048, "latent", False, False),
))}


def needs(e: Entry, roof_gb_s: float | None = None, packing: str = "2bit") -> Needs:
    vd = e.vocab * e.hidden
    tiles = e.tile_bytes(packing)
    heads = 1 if e.tied else 2
    body_bytes = e.body // 4 if e.weights == "packed" else 2 * e.body
    download = body_bytes + 2 * vd * heads
    engine = tiles + 3 * vd + (0 if e.tied else 2 * vd)
    ctx = min(e.context, KV_CONTEXT)
    kv = 2 * e.layers * ctx * e.kv_heads * e.head_dim * 2
    per_token = tiles + vd
    memory = tiles + vd + 2 * vd + kv
    speed = roof_gb_s * 1e9 / per_token if roof_gb_s else None
    return Needs(download, engine, memory, per_token, speed)
