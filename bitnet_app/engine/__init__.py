"""Stage 2: the engine file and the engine that runs it.

The engine itself is C, in _kernels/ at the top of the repository; Python reaches it through one Cython module
(the tests reach single kernels through a second):

    _kernels/*.c, *.h   bitnet.h       the C API and the shape letters (D, I, L, H, G, hd, V, T, C)
                        engine_api.c   create, free and bn_forward, which calls (each file only those below it)
                        schedule.c     which items of each stage run on which thread (pool.c: the threads)
                        layer.c        the layer maths of each step; forward.c: the whole forward serially, in
                                       the order of the maths (read it beside reference.py)
                        dispatch.c     the kernel path for this CPU; kernels_<isa>*.c: its files, one per concern
                        greedy.c, sample.c, rows_job.c   the sampler's rows; roof.c: the machine's read roof
                        tiles5.c       1.6-bit tiles for a batch; thread_buffer.c: the kernels' per-thread scratch
    _kernels/engine.pyx  --setup.py-->  bitnet_app._engine: CEngine (one C call per forward, the GIL released),
                        kernel_paths(), kernel_name(), read_roof_gb_s(), int8_tile_rowsums() (values.py)
    runtime.py          Engine wraps CEngine (the KV-cache bookkeeping, argument checks, resident weights);
                        bitnet_app/model.py's Model wraps Engine with the tokenizer and the chat template
    _kernels/engine_testing.pyx  -->  bitnet_app._engine_testing: single kernels on numpy arrays, for tests/ only

file.py       the engine file format (magic BITNETAP, version, checksummed JSON metadata, aligned tensors with
              data sums): EngineFile, write_engine_file, remove_stale_partials
validate.py   what its metadata must hold (tensor table, config, text metadata) before anything trusts it
values.py     what its tensors must hold (the set the config implies, finite small tensors, the head's row sums,
              no unused ternary code): for a file whose checksums were recomputed after an edit
packing.py    the tile layouts of its ternary and int8 tensors, with their numpy unpackers
cache.py      where converted engine files live (cache_dir(), one file per checkpoint folder)
runtime.py    Engine: an engine file plus a KV cache, one call into the compiled C code per forward
              (bitnet_app._engine, built from _kernels/ by setup.py; its class is CEngine)
resident.py   the streamed weights copied into huge pages, shared by the engines of one file
rope.py       the RoPE frequencies (llama3 rope scaling) handed to the C engine
reference.py  the plain numpy forward of an engine file: the slow, independent reference of the C forward
kernel_paths.py  the kernel paths' names and labels: the one list on the Python side (dispatch.c holds C's)
sizes.py      a model's projection shapes, ternary weight count and parameter count, from its normalized config
"""
from .file import EngineFile, EngineFileError
from .runtime import Engine

__all__ = ["Engine", "EngineFile", "EngineFileError"]
