"""Stage 2: the engine file and the engine that runs it.

file.py       the engine file format (magic BITNETAP, version, checksummed JSON metadata, aligned tensors with
              data sums): EngineFile, write_engine_file, remove_stale_partials
validate.py   what its metadata must hold (tensor table, config, text metadata) before anything trusts it
packing.py    the tile layouts of its ternary and int8 tensors, with their numpy unpackers
cache.py      where converted engine files live (cache_dir(), one file per checkpoint folder)
runtime.py    Engine: an engine file plus a KV cache, one call into the compiled C code per forward
              (bitnet_app._engine, built from _kernels/ by setup.py; its class is CEngine)
reference.py  the plain numpy forward of an engine file: the slow, independent reference of the C forward
"""
from .file import EngineFile, EngineFileError
from .runtime import Engine

__all__ = ["Engine", "EngineFile", "EngineFileError"]
