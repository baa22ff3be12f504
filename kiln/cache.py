"""Shipping a warm cache: `kiln.cache.save(path)` copies what this user's kiln cache holds (captured
frames, compiled graphs, training graphs and their C++ libraries) into a folder; `kiln.cache.load(path)`
copies such a folder into the cache of the machine that runs the application, so its first calls
load instead of compiling.

What travels is only what another machine can check: every entry is keyed by what it depended on
(kiln's sources, torch's and Python's versions, the C++ compiler, the thread count, ...) and checked
again when used, so an entry that does not fit the target is a miss (a compile), never a wrong
answer. Memos about this machine (the C++ compiler's identity, kiln's source files' stat) stay.
A saved folder holds native code: load only folders you would run code from.
"""
import os
import pathlib

_SHIPPED = ("capture", "graphs", "training", "cpp")  # the cache's folders of entries
_SKIPPED_SUFFIXES = (".lock", ".tmp")


def save(path):
    """Copy the kiln cache's entries into folder `path` (made if need be); returns how many files."""
    from kiln.compiler import build
    folder = pathlib.Path(path)
    return _copy(build.cache_dir(), lambda relative: _private_folder(folder / relative))


def load(path):
    """Copy a folder `save` wrote into the kiln cache (KILN_CACHE_DIR, default ~/.cache/kiln);
    files the cache already has are kept. Returns how many files were added."""
    from kiln.compiler import build
    return _copy(pathlib.Path(path), lambda relative: build.cache_subdir(*relative.parts))


def _private_folder(path):
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    return path


def _copy(source, folder_for):
    """Copy the shipped folders' files under `source` to `folder_for(their folder relative to
    source)`, each written atomically (private to the user) and never over an existing file."""
    from kiln.compiler import build
    copied = 0
    for top in _SHIPPED:
        for folder, _, files in os.walk(source / top):
            wanted = [name for name in files if not name.endswith(_SKIPPED_SUFFIXES)]
            if not wanted:
                continue
            destination = folder_for(pathlib.Path(folder).relative_to(source))
            for name in wanted:
                if not (destination / name).exists():
                    build._write_atomically(destination / name, (pathlib.Path(folder) / name).read_bytes())
                    copied += 1
    return copied
