"""Reading a checkpoint's small files safely: each must be a regular file (a FIFO would block forever, a
link to /dev/zero would never end) and has a size limit, checked before it is read.

    text = read_text(path, JSON_LIMIT)        # str, or CheckpointFileError (a ValueError) saying what to do
    check_regular(path)                       # before opening a large file (safetensors) by other means
    check_inside(path, folder)                # a file whose text goes into the engine file: the checkpoint's own
"""
import os
import stat

JSON_LIMIT = 16 << 20          # config.json, tokenizer_config.json, ... (Llama-3's largest is ~50 kB)
TOKENIZER_LIMIT = 128 << 20    # tokenizer.json (Llama-3: 9 MB)
TEMPLATE_LIMIT = 1 << 20       # chat_template.jinja (a few kB), the sandbox's own limit


class CheckpointFileError(ValueError):
    """A checkpoint file that is not a regular file, or too large; the message says what to do."""
    kind = "bad_checkpoint"


def check_regular(path: str) -> os.stat_result:
    """os.stat(path) (symlinks followed, as the Hub cache uses them), once it is a regular file."""
    st = os.stat(path)
    if not stat.S_ISREG(st.st_mode):
        raise CheckpointFileError(f"{path} is not a regular file (a device, pipe or folder). Replace it with the "
                                  "checkpoint's real file: download the checkpoint again.")
    return st


def check_inside(path: str, folder: str) -> None:
    """A file the checkpoint names must be its own: the path, links followed, must lie inside the folder, or, for a
    Hub cache snapshot (<repo>/snapshots/<commit>/, whose files link to <repo>/blobs/), inside its blobs folder. A
    link to /etc/passwd would otherwise be read and embedded in the engine file."""
    real, home = os.path.realpath(path), os.path.realpath(folder)
    homes = [home]
    if os.path.basename(os.path.dirname(home)) == "snapshots":
        homes.append(os.path.join(os.path.dirname(os.path.dirname(home)), "blobs"))
    if not any(os.path.commonpath([real, h]) == h for h in homes):
        raise CheckpointFileError(f"{path} links to {real}, outside the checkpoint folder. A checkpoint's files must "
                                  "be its own: replace the link with the real file, or download the checkpoint again.")


def read_bytes(path: str, limit: int) -> bytes:
    """The bytes of a regular file of at most `limit` bytes."""
    check_regular(path)
    with open(path, "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):  # swapped between the stat and the open
            raise CheckpointFileError(f"{path} is not a regular file. Download the checkpoint again.")
        data = f.read(limit + 1)
    if len(data) > limit:
        raise CheckpointFileError(f"{path} is larger than {limit >> 20} MB, far more than such a file holds. It "
                                  "is corrupt or not what its name says: download the checkpoint again.")
    return data


def read_text(path: str, limit: int) -> str:
    """read_bytes decoded as UTF-8 (UnicodeDecodeError, a ValueError, when it is not)."""
    return read_bytes(path, limit).decode("utf-8")
