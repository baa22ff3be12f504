"""Build generated C++ into a shared library, through a hash-keyed disk cache.

One call, `load_library(source)`, turns a translation unit into a loaded `ctypes.CDLL`:

- the key is sha256(source, flags, compiler version), so a changed kernel, flag or compiler
  never reuses a stale library;
- the cache lives in `cache_dir()` (KILN_CACHE_DIR, default ~/.cache/kiln), which must be private
  to the user: kiln refuses to load native code from a directory other users can write;
- the directory and every directory above it must be safe: no one else may rename or replace
  them (owned by you or root; writable by others only with the sticky bit, as /tmp);
- files are written atomically (a temp file in the same directory, then `os.replace`), and a
  per-key lock keeps two processes from compiling the same source twice;
- each library has a sidecar digest over its key and its bytes, so a library is only ever loaded
  for the key it was built for (two entries' files swapped, checksums and all, do not load); a
  cached file that is missing, damaged, unreadable or does not match is a miss (rebuilt, with one
  warning), never an error and never trusted;
- libraries loaded in this process are kept in memory by key.
"""
import ctypes
import dataclasses
import fcntl
import functools
import grp
import hashlib
import json
import os
import pathlib
import pwd
import re
import shutil
import stat
import subprocess
import tempfile
import warnings

from kiln.debug.logs import log
from kiln.exc import KilnError

# No -ffast-math: kernels must keep eager's NaN/inf semantics. -mprefer-vector-width=512: on an
# AVX-512 machine gcc's -march=native otherwise picks 256-bit vectors, and the compute-bound loops
# (exp/sigmoid/silu, softmax rows) ran 20-30% slower than in 512-bit ones, which ATen's own kernels
# use (bench.model_speed: EfficientNet-B0's batch norm + SiLU kernels 13.7 -> 9.8 ms a call); a
# machine without AVX-512 ignores it
BASE_FLAGS = ("-O3", "-march=native", "-mprefer-vector-width=512", "-fopenmp", "-shared", "-fPIC", "-std=c++17")


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
    or writable by group or others, or when a directory above it lets another user swap it (see
    `_check_ancestors`). Returned with symbolic links resolved: the path that was checked is the
    path files are opened through.
    """
    path = _cache_root()
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    real = pathlib.Path(os.path.realpath(path))
    _check_ancestors(real)
    return _private_dir(real)


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


def cache_subdir(*names):
    """A private directory inside the cache (made if need be); a file in its place is damage, removed."""
    path = cache_dir()
    for name in names:
        path = path / name
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            st = None
        if st is not None and not stat.S_ISDIR(st.st_mode):
            damaged(path, "a file where a directory should be")
        path = _private_dir(path)
    return path


def _check_ancestors(path):
    """Every directory above `path`, up to /, must keep other users from renaming or replacing what
    is in it: owned by you or root, and writable by others only with the sticky bit (as /tmp is).
    Otherwise another user could swap the cache directory between kiln's check and its load."""
    for parent in path.parents:
        st = os.lstat(parent)
        if st.st_uid not in (0, os.getuid()):
            raise UnsafeCacheDir(f"kiln cache directory {path}: the directory above it, {parent}, is owned by "
                                 f"uid {st.st_uid}, who could replace it; refusing to load native code from "
                                 "it. Set KILN_CACHE_DIR to a directory whose parents only you (or root) control.")
        if _others_may_rename_in(st):
            raise UnsafeCacheDir(f"kiln cache directory {path}: the directory above it, {parent}, is writable "
                                 f"by others without the sticky bit (mode {stat.S_IMODE(st.st_mode):o}), so "
                                 "another user could swap the cache directory; refusing to load native code "
                                 f"from it. Run `chmod +t {parent}` or set KILN_CACHE_DIR elsewhere.")


def _others_may_rename_in(st):
    """Another user may rename or delete entries of this directory (not those of theirs only)."""
    if st.st_mode & stat.S_ISVTX:
        return False
    if st.st_mode & stat.S_IWOTH:
        return True
    return bool(st.st_mode & stat.S_IWGRP) and not _group_is_yours_alone(st.st_gid)


def _group_is_yours_alone(gid):
    """A user-private group (the usual primary group): no other user is in it."""
    try:
        members = set(grp.getgrgid(gid).gr_mem)
        others = {p.pw_name for p in pwd.getpwall() if p.pw_gid == gid} | members
    except KeyError:
        return False
    return others <= {pwd.getpwuid(os.getuid()).pw_name}


@functools.lru_cache(maxsize=None)
def compiler_identity(compiler):
    """The compiler's path and version banner: part of the cache key."""
    resolved = shutil.which(compiler)
    if resolved is None:
        raise KilnError(f"C++ compiler {compiler!r} not found (set CXX or install g++)")
    return f"{resolved}\n{_version_banner(resolved)}"


def _version_banner(resolved):
    """The first line of `compiler --version`, kept on disk per compiler binary (its inode, size and
    mtime): a warm process loading cached libraries needs no subprocess."""
    st = os.stat(resolved)
    binary = f"{resolved}\0{st.st_ino}\0{st.st_size}\0{st.st_mtime_ns}"
    memo = cache_subdir("compilers") / f"{hashlib.sha256(binary.encode()).hexdigest()[:32]}.txt"
    try:
        return memo.read_text()
    except (OSError, UnicodeDecodeError):
        pass
    banner = subprocess.run([resolved, "--version"], capture_output=True, text=True, check=True).stdout
    line = banner.splitlines()[0] if banner else ""
    try:
        _write_atomically(memo, line.encode())
    except OSError:
        pass
    return line


def load_library(source: str, *, name_hint: str = "kernel", extra_flags=(), build=True) -> ctypes.CDLL:
    """Compile `source` (a C++ translation unit) to a shared library, or reuse the cached one, and load it.
    `build=False`: only a library already built (in this process or on disk), else None."""
    compiler = os.environ.get("CXX", "g++")
    flags = BASE_FLAGS + tuple(extra_flags)
    key = _cache_key(source, flags, compiler_identity(compiler))
    stem = f"{_safe_name(name_hint)}_{key[:32]}"
    memo_key = (_cache_root(), stem)
    lib = _loaded.get(memo_key)
    if lib is not None:  # checked before any file system call: this is the per-compile hot path
        stats.memory_hits += 1
        return lib
    directory = cache_subdir("cpp", key[:2])
    so_path = directory / f"{stem}.so"
    with _key_lock(directory / f"{stem}.lock"):
        lib = _load_verified(so_path, key)
        if lib is not None:
            stats.disk_hits += 1
        elif not build:
            return None
        else:
            _build(source, directory / f"{stem}.cpp", so_path, compiler, flags, key)
            lib = _load_verified(so_path, key)
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


_DIGEST_FORMAT = "kiln-library-2"  # the first word of a sidecar: digests of older formats are stale, not damaged


def _library_digest(key, data):
    """The sidecar's text for a library: bound to the key it was built for, not just its bytes."""
    h = hashlib.sha256()
    h.update(f"{_DIGEST_FORMAT}\0{key}\0".encode())
    h.update(data)
    return f"{_DIGEST_FORMAT} {h.hexdigest()}"


def _load_verified(so_path, key):
    """The library at `so_path` if it exists, is the one built for `key` and loads; else None.

    Any failure to read or check a cached file is a miss, with one warning when a file is there
    but damaged (never an exception: the caller rebuilds)."""
    try:
        data = so_path.read_bytes()
    except FileNotFoundError:
        return None
    except Exception as e:  # a directory, no permission, an I/O error
        return damaged(so_path, f"unreadable: {type(e).__name__}: {e}")
    try:
        recorded = _digest_path(so_path).read_bytes().decode("ascii").strip()
    except FileNotFoundError:
        return damaged(so_path, "its digest is missing")
    except Exception as e:
        return damaged(_digest_path(so_path), f"unreadable: {type(e).__name__}: {e}")
    if re.fullmatch(r"[0-9a-f]{64}", recorded):  # kiln's first format: the bytes' digest alone
        log("perf_hints", "cached library %s has a digest of an older format: rebuilding", so_path)
        return None
    if recorded != _library_digest(key, data):
        return damaged(so_path, "it does not match its digest or was built for another key")
    try:
        return ctypes.CDLL(str(so_path))
    except OSError as e:  # dlopen refused it
        return damaged(so_path, f"it failed to load ({e})")


def damaged(path, why):
    warnings.warn(f"kiln: cached file {path} is damaged ({why}); rebuilding it", RuntimeWarning, stacklevel=2)
    log("perf_hints", "cached file %s is damaged (%s): rebuilding", path, why)
    _remove(path)
    return None


def _remove(path):
    """Take a damaged file (or a directory in a file's place) out of the way of the rebuild."""
    try:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink()
    except OSError:
        pass


def _build(source, cpp_path, so_path, compiler, flags, key):
    for path in (cpp_path, so_path, _digest_path(so_path)):
        if path.is_dir() and not path.is_symlink():  # something in a file's place: os.replace cannot overwrite it
            _remove(path)
    _write_atomically(cpp_path, source.encode())
    fd, tmp_so = tempfile.mkstemp(dir=so_path.parent, prefix=so_path.stem, suffix=".so.tmp")
    os.close(fd)
    command = [compiler, *flags, str(cpp_path), "-o", tmp_so]
    try:
        result = subprocess.run(command, capture_output=True, text=True, errors="replace")
        if result.returncode != 0:
            raise CompileError(cpp_path, command, result.stderr)
        os.chmod(tmp_so, 0o700)
        # The digest goes first: a reader that sees the new .so always finds its digest.
        _write_atomically(_digest_path(so_path), _library_digest(key, pathlib.Path(tmp_so).read_bytes()).encode())
        os.replace(tmp_so, so_path)
    finally:
        if os.path.exists(tmp_so):
            os.unlink(tmp_so)
    stats.builds += 1
    log("output_code", "built %s from %s", so_path, cpp_path)


def seal(entry):
    """A JSON-able dict as bytes, a sha256 line in front (read_sealed checks it)."""
    body = json.dumps(entry).encode()
    return hashlib.sha256(body).hexdigest().encode() + b"\n" + body


def read_sealed(path, fits):
    """The dict `seal` wrote at `path` if `fits(dict)`, else None: a missing file is a miss; one that
    is unreadable, damaged or does not fit warns once and is removed, never trusted and never an error."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    except Exception as e:  # a directory in its place, no permission, an I/O error
        return damaged(path, f"unreadable: {type(e).__name__}: {e}")
    digest, _, body = data.partition(b"\n")
    try:
        if hashlib.sha256(body).hexdigest().encode() != digest:
            raise ValueError("digest mismatch")
        entry = json.loads(body)
        if not isinstance(entry, dict) or not fits(entry):
            raise ValueError("format or key mismatch")
        return entry
    except Exception as e:
        return damaged(path, str(e))


def _write_atomically(path, data):
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise
