"""BitNet b1.58 chat on the CPU: a packed-weight C engine, AR and block-diffusion decoding.

    import bitnet_app
    model = bitnet_app.load_model("microsoft/bitnet-b1.58-2B-4T")   # or an HF folder, or a .bitnet file
    ids = model.chat_ids([{"role": "user", "content": "Hello"}])
    print(model.decode(model.complete(ids, max_new_tokens=32)))

Imports stay lazy so `import bitnet_app` is quick (the app starts before any model is loaded).
"""
import os

from .cache import cache_dir

__all__ = ["load_model", "resolve_model_file", "cache_dir", "ModelNotFound"]


class ModelNotFound(FileNotFoundError):
    """`src` names no engine file, checkpoint folder or Hub repository."""


def resolve_model_file(src, *, download_progress=None, convert_progress=None) -> str:
    """The path of a converted engine file for src, converting (and downloading) when needed.

    src: a converted engine file; an HF checkpoint folder (converted once into cache_dir()/converted/,
    reused while the folder is unchanged); or a Hub repo id "owner/name" (downloaded via bitnet_app.hub).
    download_progress: callback(hub.DownloadProgress); convert_progress: callback(fraction, message).
    """
    src = os.fspath(src)
    path = os.path.expanduser(src)
    if os.path.isfile(path):
        return path
    if os.path.isdir(path):
        if not os.path.isfile(os.path.join(path, "config.json")):
            raise ModelNotFound(f"{src} is a folder but not a model checkpoint (it has no config.json); "
                                "give an HF checkpoint folder, a converted .bitnet file or a Hub repo id")
        return _convert_cached(path, convert_progress)
    from . import hub  # only now: it imports huggingface_hub
    if hub.is_repo_id(src):
        return _convert_cached(hub.download_checkpoint(src, progress=download_progress), convert_progress)
    raise ModelNotFound(f"{src} does not exist: give a converted .bitnet file, an HF checkpoint folder, "
                        "or a Hub repo id such as microsoft/bitnet-b1.58-2B-4T")


def _convert_cached(folder: str, progress) -> str:
    from .cache import converted_path
    from .convert import convert_checkpoint
    from .engine_file import EngineFile, EngineFileError

    out = converted_path(folder)
    if os.path.isfile(out):
        try:
            EngineFile(out)  # cheap: header, metadata and sizes; a damaged file is converted again
            return out
        except EngineFileError:
            pass
    convert_checkpoint(folder, out, progress=progress)  # writes a temporary file, then renames
    return out


def load_model(src, *, lm_head: str = "int8", threads: int | None = None, isa: str | None = None,
               kv: str | None = None, download_progress=None, convert_progress=None):
    """A ready Model (bitnet_app.model.Model) from an engine file, an HF checkpoint folder or a Hub repo id.

    lm_head "int8" (default) or "exact" (bf16); kv "f16" or "f32" (default: f32 with the exact head, so
    that lm_head="exact" reproduces the fp32 reference, else f16)."""
    from .model import Model

    path = resolve_model_file(src, download_progress=download_progress, convert_progress=convert_progress)
    return Model.open(path, lm_head=lm_head, threads=threads, isa=isa, kv=kv)
