"""BitNet b1.58 chat on the CPU: a packed-weight C engine, AR and block-diffusion decoding.

    import bitnet_app
    model = bitnet_app.load_model("microsoft/bitnet-b1.58-2B-4T")   # or an HF folder, a .bitnet file, "demo"
    ids = model.chat_ids([{"role": "user", "content": "Hello"}])
    print(model.decode(model.complete(ids, max_new_tokens=32)))

The package follows the data, in order:
    checkpoint/  Hub download, config checks, safetensors, conversion into an engine file
    engine/      the engine file format, its cache folder, the C engine's Python face, the numpy reference
                 (the C engine is _kernels/ at the top level: engine/__init__.py maps how Python wraps it)
    machine.py   this computer: free and total memory, the read roof, this process's memory
    platform.py  everything that depends on the OS (Linux, macOS, other POSIX): machine.py's and the engine's readings
    catalog.py   the checkpoints known by name and what each needs on this machine
    source.py    a model source (repo id, folder, engine file, "demo") -> a converted engine file
    model.py     Model: engine + tokenizer + chat template; generate/complete/logits
    params.py    DecodeParams: every decode knob's name, default, range, help and validation
    decode/      the decoders (AR, block diffusion), their events and the sampler
    text/        tokenizer and chat template
    ui/          the Streamlit page (app.py); it calls source, model, params, catalog, demo, units and decode
                 events, never checkpoint/, engine/ or machine.py directly
Imports stay lazy so `import bitnet_app` is quick (the app starts before any model is loaded).
"""
from .engine.cache import cache_dir
from .source import ModelNotFound  # huggingface_hub and the converter are imported only when used

__all__ = ["load_model", "resolve_model_file", "cache_dir", "ModelNotFound"]


def resolve_model_file(src, *, download_progress=None, convert_progress=None) -> str:
    """The path of a converted engine file for src, converting (and downloading) when needed
    (bitnet_app.source.prepare). download_progress: callback(DownloadProgress); convert_progress:
    callback(fraction, message)."""
    from .source import engine_file_for
    return engine_file_for(src, download_progress=download_progress, convert_progress=convert_progress)


def load_model(src, *, lm_head: str = "int8", threads: int | None = None, isa: str | None = None,
               kv: str | None = None, download_progress=None, convert_progress=None):
    """A ready Model (bitnet_app.model.Model) from an engine file, an HF checkpoint folder, a Hub repo id,
    or "demo" (the bundled demo model).

    lm_head "int8" (default) or "exact" (bf16); kv "f16", "f32" or "i8" (the KV cache; default: f32 with the exact
    head, so that lm_head="exact" reproduces the fp32 reference, else f16; i8: int8 with a scale per head and
    position, half fp16's bytes)."""
    from .model import Model

    path = resolve_model_file(src, download_progress=download_progress, convert_progress=convert_progress)
    return Model.open(path, lm_head=lm_head, threads=threads, isa=isa, kv=kv)
