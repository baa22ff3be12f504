"""Build generated C++ into a shared library, through a hash-keyed disk cache.

One call, `load_library(source)`, turns a translation unit into a loaded `ctypes.CDLL`:

- the key is sha256(source, flags, compiler version), so a changed kernel, flag or compiler
  never reuses a stale library;
- the cache lives in `cache_dir()` (KILN_CACHE_DIR, default ~/.cache/kiln), which must be private
  to the user: kiln refuses to load native code from a directory other users can write;
- files are written atomically (a temp file in the same directory, then `os.replace`), and a
  per-key lock keeps two processes from compiling the same source twice;
- each library has a sidecar digest; a cached library that is missing it, does not match it or
  fails to load is rebuilt, never trusted;
- libraries loaded in this process are kept in memory by key.
"""
import ctypes
import dataclasses
import fcntl
import functools
import hashlib
import os
import pathlib
import re
import shutil
import stat
import subprocess
import tempfile

from kiln.debug.logs import log
from kiln.exc import KilnError

# No -ffast-math: kernels must keep eager's NaN/inf semantics.
BASE_FLAGS = ("-O3", "-march=native", "-fopenmp", "-shared", "-fPIC", "-std=c++17")


class CompileError(KilnError):
    """The C++ compiler rejected generated code; the message names the source file to look at."""

    def __init__(self, source_path, command, stderr):
        self.source_path = pathlib.Path(source_path)
        self.command = list(command)
        self.stderr = stderr
        super().__init__(f"C++ compilation of {self.source_path} failed\n"
                         f"command: {' '.join(self.command)}\n{stderr.strip()}")


class UnsafeCacheDir(KilnError):
    """The cache directory is not private to this user, so native code in it cannot be trusted."""


@dataclasses.dataclass
class CacheStats:
    """How `load_library` calls were answered in this process (for tests and compile-time bench)."""
    memory_hits: int = 0   # library already loaded in this process
    disk_hits: int = 0     # a valid cached .so was loaded from disk
    builds: int = 0        # the compiler ran


stats = CacheStats()
_loaded = {}  # (cache root, library stem) -> CDLL, for libraries loaded in this process
_recipes = {}  # (cache root, library stem) -> (source, name_hint, extra_flags) it was loaded from


def cache_dir() -> pathlib.Path:
    """The kiln cache directory: KILN_CACHE_DIR, else $XDG_CACHE_HOME/kiln or ~/.cache/kiln.

    Created with mode 0o700; raises UnsafeCacheDir when it exists but is owned by another user
    or writable by group or others.
    """
    return _private_dir(_cache_root())


def _cache_root():
    configured = os.environ.get("KILN_CACHE_DIR")
    if configured:
        return pathlib.Path(configured).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (pathlib.Path(xdg) if xdg else pathlib.Path.home() / ".cache") / "kiln"


def _private_dir(path):
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    st = path.stat()  # follows a symlink: what matters is the directory files land in
    if st.st_uid != os.getuid():
        raise UnsafeCacheDir(f"kiln cache directory {path} is owned by uid {st.st_uid}, not by you "
                             f"(uid {os.getuid()}); refusing to load native code from it. "
                             "Set KILN_CACHE_DIR to a directory of your own.")
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise UnsafeCacheDir(f"kiln cache directory {path} is writable by group or others "
                             f"(mode {stat.S_IMODE(st.st_mode):o}); refusing to load native code from "
                             f"it. Run `chmod go-w {path}` or set KILN_CACHE_DIR elsewhere.")
    return path


@functools.lru_cache(maxsize=None)
def compiler_identity(compiler):
    """The compiler's path and version banner: part of the cache key."""
    resolved = shutil.which(compiler)
    if resolved is None:
        raise KilnError(f"C++ compiler {compiler!r} not found (set CXX or install g++)")
    banner = subprocess.run([resolved, "--version"], capture_output=True, text=True, check=True).stdout
    return f"{resolved}\n{banner.splitlines()[0] if banner else ''}"


def load_library(source: str, *, name_hint: str = "kernel", extra_flags=()) -> ctypes.CDLL:
    """Compile `source` (a C++ translation unit) to a shared library, or reuse the cached one, and load it."""
    compiler = os.environ.get("CXX", "g++")
    flags = BASE_FLAGS + tuple(extra_flags)
    key = _cache_key(source, flags, compiler_identity(compiler))
    stem = f"{_safe_name(name_hint)}_{key[:32]}"
    memo_key = (_cache_root(), stem)
    lib = _loaded.get(memo_key)
    if lib is not None:  # checked before any file system call: this is the per-compile hot path
        stats.memory_hits += 1
        return lib
    directory = _private_dir(_private_dir(cache_dir() / "cpp") / key[:2])
    so_path = directory / f"{stem}.so"
    with _key_lock(directory / f"{stem}.lock"):
        lib = _load_verified(so_path)
        if lib is not None:
            stats.disk_hits += 1
        else:
            _build(source, directory / f"{stem}.cpp", so_path, compiler, flags)
            lib = _load_verified(so_path)
            if lib is None:
                raise KilnError(f"kiln built {so_path} but could not load it")
    _loaded[memo_key] = lib
    _recipes[memo_key] = (source, name_hint, tuple(extra_flags))
    return lib


def library_recipe(fn):
    """(source, name_hint, extra_flags) of the library loaded here that ctypes function `fn` was
    taken from (`getattr(lib, name)` keeps it in the library's __dict__), or None."""
    for memo_key, lib in _loaded.items():
        if lib.__dict__.get(getattr(fn, "__name__", None)) is fn:
            return _recipes[memo_key]
    return None


def _cache_key(source, flags, compiler_id):
    h = hashlib.sha256()
    for part in (source, "\0".join(flags), compiler_id):
        h.update(part.encode())
        h.update(b"\0\0")
    return h.hexdigest()


def _safe_name(name_hint):
    return re.sub(r"[^A-Za-z0-9_]", "_", name_hint)[:40] or "kernel"


class _key_lock:
    """An exclusive advisory lock on one cache key: a second process building the same source
    waits, then finds the finished library instead of compiling it again."""

    def __init__(self, path):
        self.path = path

    def __enter__(self):
        self.fd = os.open(self.path, os.O_CREAT | os.O_RDWR, 0o600)
        fcntl.flock(self.fd, fcntl.LOCK_EX)

    def __exit__(self, *exc):
        fcntl.flock(self.fd, fcntl.LOCK_UN)
        os.close(self.fd)


def _digest_path(so_path):
    return so_path.with_suffix(".sha256")


def _file_digest(path):
    return hashlib.sha256(pathlib.Path(path).read_bytes()).hexdigest()


def _load_verified(so_path):
    """The library at `so_path` if it exists, matches its recorded digest and loads; else None."""
    try:
        expected = _digest_path(so_path).read_text().strip()
        if _file_digest(so_path) != expected:
            log("perf_hints", "cached library %s does not match its digest: rebuilding", so_path)
            return None
        return ctypes.CDLL(str(so_path))
    except FileNotFoundError:
        return None
    except OSError as e:  # dlopen refused it (truncated, not ELF, ...)
        log("perf_hints", "cached library %s failed to load (%s): rebuilding", so_path, e)
        return None


def _build(source, cpp_path, so_path, compiler, flags):
    _write_atomically(cpp_path, source.encode())
    fd, tmp_so = tempfile.mkstemp(dir=so_path.parent, prefix=so_path.stem, suffix=".so.tmp")
    os.close(fd)
    command = [compiler, *flags, str(cpp_path), "-o", tmp_so]
    try:
        result = subprocess.run(command, capture_output=True, text=True)
        if result.returncode != 0:
            raise CompileError(cpp_path, command, result.stderr)
        os.chmod(tmp_so, 0o700)
        # The digest goes first: a reader that sees the new .so always finds its digest.
        _write_atomically(_digest_path(so_path), _file_digest(tmp_so).encode())
        os.replace(tmp_so, so_path)
    finally:
        if os.path.exists(tmp_so):
            os.unlink(tmp_so)
    stats.builds += 1
    log("output_code", "built %s from %s", so_path, cpp_path)


def _write_atomically(path, data):
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise
