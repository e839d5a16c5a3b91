"""Stage 1: a Hugging Face BitNet checkpoint, from the Hub to a converted engine file.

download.py           fetch a repo's needed files into the Hugging Face cache (resume, offline mode, HubError)
progress.py           download progress as plain numbers (DownloadProgress, the byte counter)
disk.py               free disk space, checked before writing gigabytes
files.py              reading its small files safely (regular files only, size limits)
families.py           one record per model family (how config.json names it, its rules); the "is this BitNet?" rule
config.py             config.json, tokenizer, chat template, DLM settings, checked and normalized
safetensors_reader.py the weights, read lazily from *.safetensors
convert.py            checkpoint folder -> one packed engine file (engine/file.py)
weight_range.py       every float it reads or writes finite and in real weights' range (the tensor, the index named)
presets.py            the named shapes of synthetic engine files (catalog models and tiny test shapes)
synthetic.py          a random engine file of a named shape, for benchmarks and tests

Callers outside the package use bitnet_app.source (model source -> engine file), not these modules.
"""
