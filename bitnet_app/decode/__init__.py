"""Stage 4: decoders, generators of small events (events.py) driven by an Engine.

ar.py        autoregressive: prefill, then one token per forward
diffusion.py block diffusion (Fast-dLLM v2 style): several slots of a block per forward
sampling.py  the next token from logits (temperature, top-k, top-p, repetition penalty, seed)
context.py   does the prompt fit, and how much of it is already in the KV cache
The knobs arrive checked (bitnet_app/params.py, DecodeParams); Model.generate picks the decoder.
"""
