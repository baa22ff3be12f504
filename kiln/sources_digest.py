"""Digests of kiln's own source text, which the on-disk caches put in their keys: an entry made by
other kiln code (another capture, lowering or codegen) is never reused.

Reading and hashing every source costs a fresh process tens of milliseconds (more on a busy
machine), so the digests are kept on disk (`sources/<stat key>.json` in the cache directory) under
a key made of each source file's path, size, mtime, ctime and inode. Writing, replacing, adding or
removing a file changes that key (a write updates ctime, which no tool sets back), so a memo is
never read for sources that changed since it was written; a copy of kiln elsewhere (another
checkout, another machine) misses the memo and hashes its sources once.
"""
import hashlib
import json
import os
import pathlib

ROOT = pathlib.Path(__file__).resolve().parent
_PARTS = {"kiln": "", "compiler": "compiler"}  # digest name -> the subtree of kiln it covers
_digests = {}


def digest(name):
    """The digest of kiln's sources ("kiln") or of its compiler's ("compiler")."""
    if not _digests:
        _digests.update(_memoized())
    return _digests[name]


def _memoized():
    files = _source_files()
    stat_key = hashlib.sha256(json.dumps(files).encode()).hexdigest()
    from kiln.compiler import build  # (the cache directory and its rules for files in it)
    try:
        path = build.cache_subdir("sources") / f"{stat_key[:32]}.json"
    except OSError:
        return _hashed(files)
    found = build.read_sealed(path, lambda body: body.get("stat_key") == stat_key and set(_PARTS) <= set(body))
    if found is not None:
        return {name: found[name] for name in _PARTS}
    digests = _hashed(files)
    try:
        build._write_atomically(path, build.seal({"stat_key": stat_key, **digests}))
    except OSError:
        pass  # the next process hashes again
    return digests


def _source_files():
    """[relative path, size, mtime_ns, ctime_ns, inode] of every .py file under kiln/, sorted."""
    found, folders = [], [str(ROOT)]
    prefix = len(str(ROOT)) + 1  # (entry paths begin with ROOT/: cut, where os.path.relpath costs ~0.1 ms a file)
    while folders:
        with os.scandir(folders.pop()) as entries:
            for entry in entries:
                if entry.is_dir(follow_symlinks=False):
                    if entry.name != "__pycache__":
                        folders.append(entry.path)
                elif entry.name.endswith(".py"):
                    st = entry.stat()
                    found.append([entry.path[prefix:], st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino])
    return sorted(found)


def _hashed(files):
    hashes = {name: hashlib.sha256() for name in _PARTS}
    for rel, *_ in files:
        data = (ROOT / rel).read_bytes()
        for name, subtree in _PARTS.items():
            if not subtree or rel.startswith(subtree + os.sep):
                inner = os.path.relpath(rel, subtree) if subtree else rel
                hashes[name].update(inner.encode() + b"\0" + data + b"\0")
    return {name: h.hexdigest() for name, h in hashes.items()}
