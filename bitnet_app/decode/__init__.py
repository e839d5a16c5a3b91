"""Decoders: generators of small events (decode/events.py) driven by an Engine.

ar.py        autoregressive: prefill, then one token per forward
diffusion.py block diffusion (Fast-dLLM v2 style), see shared/reference/block-diffusion.md
"""
