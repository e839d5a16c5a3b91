"""The named shapes of synthetic engine files (`python -m bitnet_app bench --synthetic NAME`, tests).

    SHAPES   name -> dict(hidden_size, intermediate_size, num_hidden_layers, num_attention_heads,
                          num_key_value_heads, head_dim, vocab_size, max_position_embeddings,
                          family, bos, eos, eot, rope_theta)

The public checkpoints' shapes are catalog.py's entries under short names; the tiny ones are test shapes of
each family. Everything a shape does not say comes from its family's record (checkpoint/families.py):
activation, sub-norms, tied head, the weight-scale rule, rope_theta. Every dimension is a multiple of 16, so
no tile needs padding. Plain data, apart from the writer (synthetic.py), so the command line lists the names
without loading the writer's imports.
"""
from .. import catalog
from .families import FAMILIES


def _catalog_shape(repo: str, **ids) -> dict:
    """The dimensions catalog.py records for `repo` (one table for both), its family, plus the token ids."""
    e = catalog.ENTRIES[repo]
    return _shape(e.family, hidden_size=e.hidden, intermediate_size=e.intermediate, num_hidden_layers=e.layers,
                  num_attention_heads=e.heads, num_key_value_heads=e.kv_heads, head_dim=e.head_dim,
                  vocab_size=e.vocab, max_position_embeddings=e.context, **ids)


def _shape(family: str, rope_theta: float | None = None, **dims_and_ids) -> dict:
    """One shape: rope_theta is the family's default unless the model has its own."""
    return dict(dims_and_ids, family=family, rope_theta=FAMILIES[family].rope_theta if rope_theta is None else rope_theta)


FALCON3 = dict(bos=11, eos=11, eot=11, rope_theta=1000042.0)
LLAMA3 = dict(bos=128000, eos=128001, eot=128009)
SHAPES = {
    "2b4t": _catalog_shape("microsoft/bitnet-b1.58-2B-4T", **LLAMA3),
    # tiiuae Falcon3-*-1.58bit (Base configs): head_dim 256, untied 131072-row head
    "falcon3-1b": _catalog_shape("tiiuae/Falcon3-1B-Instruct-1.58bit", **FALCON3),
    "falcon3-3b": _catalog_shape("tiiuae/Falcon3-3B-Instruct-1.58bit", **FALCON3),
    "falcon3-7b": _catalog_shape("tiiuae/Falcon3-7B-Instruct-1.58bit", **FALCON3),
    "falcon3-10b": _catalog_shape("tiiuae/Falcon3-10B-Instruct-1.58bit", **FALCON3),
    # HF1BitLLM/Llama3-8B-1.58-100B-tokens (Meta-Llama-3-8B's shape)
    "llama3-8b": _catalog_shape("HF1BitLLM/Llama3-8B-1.58-100B-tokens", **LLAMA3, rope_theta=500000.0),
    # 1bitLLM/bitnet_b1_58-3B (26 layers: the shared reference's estimate): multi-head attention, head_dim 100
    "bitnet-3b": _catalog_shape("1bitLLM/bitnet_b1_58-3B", bos=1, eos=2, eot=2),
    "tiny": _shape("bitnet", hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                   num_key_value_heads=2, head_dim=16, vocab_size=272, max_position_embeddings=256,
                   bos=256, eos=257, eot=258),
    # a small Llama-family shape for tests: head_dim 32 with 3 query heads per KV head, eos below 256 as Falcon3's
    "tiny-llama": _shape("llama", hidden_size=96, intermediate_size=160, num_hidden_layers=2, num_attention_heads=3,
                         num_key_value_heads=1, head_dim=32, vocab_size=300, max_position_embeddings=256,
                         bos=11, eos=11, eot=11, rope_theta=1000042.0),
    # a small 1bitLLM-large-like shape for tests: head_dim 96, multi-head attention
    "tiny-1bitllm": _shape("1bitllm", hidden_size=192, intermediate_size=256, num_hidden_layers=2,
                           num_attention_heads=2, num_key_value_heads=2, head_dim=96, vocab_size=300,
                           max_position_embeddings=256, bos=1, eos=2, eot=2),
}
