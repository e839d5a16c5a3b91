"""Stage 4: decoders, generators of small events (events.py) driven by an Engine.

ar.py        autoregressive: prefill, then one token per forward
diffusion.py block diffusion (Fast-dLLM v2 style): several slots of a block per forward
threshold.py its threshold fill rule (Fast-dLLM v2's): a filled slot is final at once; the fill rules' face
exact.py     its exact fill rule: a filled slot stands only if it is what AR would have written there
sampling.py  the next token from logits (temperature, top-k, top-p, repetition penalty, seed)
context.py   does the prompt fit, and how much of it is already in the KV cache
stopwatch.py the decoders' clock: work time summed over timed spans, never across a yield
The knobs arrive as one DecodeParams (bitnet_app/params.py), resolved for the model by Model.decode_params;
Model.generate picks the decoder and hands it the object whole.
"""
