"""A loaded model: the engine file, the engine (KV cache), the tokenizer and the chat template.

    m = Model.open("model.bitnet", lm_head="int8", threads=None)
    ids = m.chat_ids([{"role": "user", "content": "Hi"}])
    for ev in m.generate(ids, max_new_tokens=64, temperature=0.7, seed=1): ...   # Token ... Done
    m.complete(ids, max_new_tokens=16)        # -> generated ids (stop id excluded)
    p = m.decode_params(mode="diffusion")     # the one checked DecodeParams, the checkpoint's values filled in
    m.generate(ids, p); m.complete(ids, p)    # the same, from a DecodeParams
    m.logits(ids)                             # -> (len(ids), V) float32, fresh causal forward from 0

One Model drives one engine, so one generation at a time: starting a generation or calling logits()
invalidates an unfinished generator (its next step raises RuntimeError instead of corrupting the
cache); for concurrent use from several threads, hold a lock around each whole reply. Between replies the KV cache is reused for the longest common prefix of the
previous sequence and the new prompt (a chat that grows by one turn re-runs only the new turn).
"""
import numbers
import os

import numpy as np

from .decode.ar import generate_ar
from .decode.context import ContextOverflow, check_prompt_fits
from .decode.diffusion import generate_diffusion
from .decode.events import Done
from .engine.file import PLAIN_ATTENTION, TRAINED_BLOCK_SIZE, EngineFile
from .engine.kernel_paths import BY_NAME as KERNEL_PATHS
from .engine.runtime import Engine
from .engine.sizes import parameter_count
from .machine import process_rss, total_ram
from .params import KNOBS, DecodeParams, ParameterTypeError, default_sub_block
from .text import chat
from .text.tokenizer import Tokenizer


class Model:
    def __init__(self, ef: EngineFile, engine: Engine):
        self.file = ef
        self.engine = engine
        self.meta = ef.meta
        self.tokenizer = Tokenizer.from_meta(ef.meta)
        # a base model without a chat template runs as completion (text/chat.py COMPLETION_TEMPLATE)
        self.completion = ef.meta.get("prompt_format") == "completion"
        self.chat_template = chat.COMPLETION_TEMPLATE if self.completion else (
            ef.meta.get("chat_template") or None)  # None: the BitNet default template
        # ids whose K/V fill the engine's committed positions [0, len); kept exact by the decoders
        self._kv_ids: list[int] = []
        self._owner = None  # the generation that may use the engine now (see _exclusive)

    @classmethod
    def open(cls, path: str, *, lm_head: str = "int8", threads: int | None = None,
             isa: str | None = None, kv: str | None = None) -> "Model":
        ef = EngineFile(path)
        return cls(ef, Engine(ef, lm_head=lm_head, threads=threads, isa=isa, kv=kv))

    # ---- facts about the model -------------------------------------------------------------
    @property
    def config(self) -> dict:
        return self.file.config

    @property
    def vocab_size(self) -> int:
        return self.engine.vocab_size

    @property
    def context_length(self) -> int:
        return self.engine.ctx

    @property
    def stop_ids(self) -> list[int]:
        return [int(i) for i in self.meta.get("stop_ids") or []]

    @property
    def bos_id(self) -> int | None:
        return self.meta.get("bos_id")

    @property
    def mask_id(self) -> int | None:
        mid = self.meta.get("mask_id")
        return None if mid is None else int(mid)

    def spare_mask_id(self) -> int | None:
        """A stand-in mask for diffusion on a checkpoint without one (it then runs causal, with the
        leftmost-slot floor): the first reserved special token (Llama-3: 128002), else an embedding row
        beyond the tokenizer's ids, else the highest id that is not BOS or a stop id."""
        used = {self.bos_id, *self.stop_ids}
        specials = self.tokenizer.special_tokens()
        reserved = sorted(i for i, c in specials.items() if "reserved" in c and i < self.vocab_size and i not in used)
        if reserved:
            return reserved[0]
        if self.vocab_size > self.tokenizer.vocab_size:
            return self.vocab_size - 1
        free = [i for i in range(self.vocab_size - 1, -1, -1) if i not in used and i not in specials]
        return free[0] if free else None

    @property
    def trained_for_diffusion(self) -> bool:
        return bool((self.meta.get("diffusion") or {}).get("trained", False))

    @property
    def diffusion_defaults(self) -> dict:
        """The block-diffusion knobs this checkpoint starts from (block size, attention and mask from
        its metadata; sub-block size from its dlm_config.json when it suggests one, else the largest divisor of the
        block size up to params.SUB_BLOCK, so that the defaults always fit the block; the threshold it suggests, or
        None: DecodeParams.resolve uses it for the threshold rule only)."""
        d = self.meta.get("diffusion") or {}
        block = int(d.get("block_size") or TRAINED_BLOCK_SIZE)
        return {"block_size": block,
                "sub_block_size": default_sub_block(block, d.get("sub_block_size")),
                "threshold": float(d["threshold"]) if d.get("threshold") else None,  # for the threshold rule
                "attention": d.get("attention") or PLAIN_ATTENTION,
                "mask_id": self.mask_id if self.mask_id is not None else self.spare_mask_id()}

    @property
    def generation_defaults(self) -> dict:
        """Sampling settings the checkpoint suggests (generation_config.json), for a UI to start from."""
        g = self.meta.get("generation_config") or {}
        ours = {name: KNOBS[name].default for name in ("temperature", "top_p", "top_k", "repetition_penalty")}
        if not g.get("do_sample", False):  # greedy: our defaults, and the checkpoint's repetition penalty
            return dict(ours, repetition_penalty=float(g.get("repetition_penalty") or ours["repetition_penalty"]))
        # sampling: the checkpoint's values; transformers' temperature 1.0 where it names none
        return {"temperature": float(g.get("temperature", 1.0)), "top_p": float(g.get("top_p") or ours["top_p"]),
                "top_k": int(g.get("top_k") or ours["top_k"]),
                "repetition_penalty": float(g.get("repetition_penalty") or ours["repetition_penalty"])}

    def suggested_params(self) -> DecodeParams:
        """Where a UI starts for this checkpoint: its sampling settings (generation_defaults) and its diffusion
        knobs (diffusion_defaults, the suggested sub-block size included; the threshold of the checkpoint's fill
        rule), resolved."""
        d = self.diffusion_defaults
        start = DecodeParams.from_kwargs(**self.generation_defaults, sub_block_size=d["sub_block_size"])
        return start.resolve(d, vocab_size=self.vocab_size)

    def info(self) -> dict:
        cfg = self.config
        return {"path": os.path.abspath(self.file.path), "file_bytes": self.file.nbytes,
                "parameters": self.parameter_count(), "isa": self.engine.isa, "threads": self.engine.threads,
                "isa_label": KERNEL_PATHS[self.engine.isa].label, "isa_simd": KERNEL_PATHS[self.engine.isa].simd,
                "rss_bytes": process_rss(), "ram_bytes": total_ram(),  # this process's memory, and the machine's
                "lm_head": self.engine.lm_head, "kv": self.engine.kv, "context": self.engine.ctx,
                "vocab_size": self.vocab_size, "layers": cfg.get("num_hidden_layers"),
                "hidden_size": cfg.get("hidden_size"), "trained_for_diffusion": self.trained_for_diffusion,
                "completion": self.completion,
                "source": self.meta.get("source")}

    def parameter_count(self) -> int:
        """Logical parameters of the checkpoint (a tied head counted once), from the config shapes."""
        return parameter_count(self.config, self.vocab_size)

    # ---- text ------------------------------------------------------------------------------
    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=add_special_tokens)

    def decode(self, ids, skip_special_tokens: bool = False) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)

    def chat_ids(self, messages, add_generation_prompt: bool = True) -> list[int]:
        return chat.chat_prompt_ids(self.tokenizer, messages, template=self.chat_template,
                                    add_generation_prompt=add_generation_prompt)

    def trim_history(self, messages, max_new_tokens: int) -> tuple[list[dict], int]:
        """Drop the oldest turns (system prompt kept) so the prompt + max_new_tokens fits the context."""
        return chat.trim_history(messages, lambda m: len(self.chat_ids(m)), self.engine.ctx, max_new_tokens)

    # ---- logits: one fresh causal forward of the engine ------------------------------------
    def _check_ids(self, ids) -> list[int]:
        """ids as a list of ints; a fraction, a bool or a string is refused, never truncated or coerced."""
        if isinstance(ids, (str, bytes)):
            raise ValueError("token ids must be a list of whole numbers, not text; encode the text first")
        odd = [i for i in ids if not isinstance(i, numbers.Integral) or isinstance(i, (bool, np.bool_))]
        if odd:
            raise ValueError(f"token id {odd[0]!r} is not a whole number; token ids are integers")
        ids = [int(i) for i in ids]
        bad = [i for i in ids if not 0 <= i < self.vocab_size]
        if bad:
            raise ValueError(f"token id {bad[0]} is out of range for this model (vocabulary {self.vocab_size})")
        return ids

    def logits(self, ids) -> np.ndarray:
        """(len(ids), V) float32: a fresh causal forward of ids from position 0, every row."""
        ids = self._check_ids(ids)
        if not ids:
            raise ValueError("logits needs at least one token")
        if len(ids) > self.engine.ctx:
            raise ContextOverflow(len(ids), self.engine.ctx)
        self._owner = None  # an unfinished generator must not continue on top of this forward
        self._kv_ids.clear()
        self.engine.reset()
        out = self.engine.forward(ids, start=0, commit=True, rows=range(len(ids)))
        self._kv_ids.extend(ids)
        return out

    # ---- decoding --------------------------------------------------------------------------
    def decode_params(self, params: DecodeParams | None = None, /, **keywords) -> DecodeParams:
        """The one checked DecodeParams a reply runs with (the API's edge; the page builds its own here too):
        `params` as given, or the keywords (DecodeParams' names; None means the default), with the knobs left
        None set from this checkpoint (block size, attention and mask id; AR bans only a real mask token).
        ValueError on a bad value; params.ParameterTypeError (a TypeError and a ValueError) on an unknown keyword
        (naming it and listing the known ones) or settings given both ways."""
        if params is None:
            params = DecodeParams.from_kwargs(**keywords)
        elif keywords:
            raise ParameterTypeError("give a DecodeParams or keywords, not both (got also "
                                     f"{', '.join(sorted(keywords))})")
        elif not isinstance(params, DecodeParams):
            raise ParameterTypeError("decode parameters must be a DecodeParams (bitnet_app.params), not "
                                     f"{type(params).__name__}")
        checkpoint = self.diffusion_defaults if params.mode == "diffusion" else {"mask_id": self.mask_id}
        return params.resolve(checkpoint, vocab_size=self.vocab_size)

    def generate(self, ids, params: DecodeParams | None = None, /, **keywords):
        """Events for a reply to the prompt ids: Token(id, text)... (Step... in diffusion), then Done.
        The settings: a DecodeParams, or its fields as keywords (see decode_params), checked before anything runs."""
        p = self.decode_params(params, **keywords)
        ids = self._check_ids(ids)
        check_prompt_fits(len(ids), self.engine.ctx)  # raise here, at the call, not at the first next()
        decoder = generate_diffusion if p.mode == "diffusion" else generate_ar
        return self._exclusive(decoder(self.engine, ids, p, stop_ids=self.stop_ids,
                                       detokenizer=self.tokenizer.detokenizer(), kv_ids=self._kv_ids))

    def _exclusive(self, gen):
        """Run `gen` as the engine's only user: a later generate()/logits() takes the engine over, and
        this one then stops with a clear error rather than writing into a cache it no longer owns."""
        me = object()
        self._owner = me
        try:
            for ev in gen:
                yield ev
                if self._owner is not me:
                    raise RuntimeError("this reply was interrupted: another generation (or a logits call) "
                                       "used the model's engine in the meantime; generate it again")
        finally:
            gen.close()
            if self._owner is me:
                self._owner = None

    def forget_cache(self, keep: int = 0) -> None:
        """Keep only the first `keep` cached positions (0: none), so that the next reply prefills the rest of its
        prompt: to time a reply again doing the same work (a reply's stats["reused_tokens"] says how much it found
        cached), or to start from a cold cache as a freshly loaded model does. Ends an unfinished generator."""
        self._owner = None
        keep = max(0, min(int(keep), len(self._kv_ids)))
        self.engine.truncate(keep)
        del self._kv_ids[keep:]

    def close(self) -> None:
        """Drop the engine (its weights mapping and KV cache are freed once nothing else holds them)."""
        self._owner = None
        self._kv_ids.clear()
        self.engine = None

    def complete(self, ids, params: DecodeParams | None = None, /, **keywords) -> list[int]:
        """The generated ids (stop id excluded) of one reply; the settings as for generate."""
        for ev in self.generate(ids, params, **keywords):
            if isinstance(ev, Done):
                return list(ev.ids)
        raise RuntimeError("the decoder ended without a Done event")
