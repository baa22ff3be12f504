"""How generated C++ touches memory, and the checks that keep it inside its tensors.

Every load and store of a buffer element, and every index a kernel reads from a tensor (gather,
embedding, indexing), is printed by a `Memory`, so one place decides what is checked:

- an index read from a tensor is always checked against the size of the dim it indexes (eager
  raises there too); out of range, the kernel reads element 0 instead and sets a bit of its
  `kiln_bad` (branch-free, OR-reduced by its OpenMP loops, so loops still vectorize) and reports
  it after its loops;
- with `debug_bounds_checks` (env KILN_BOUNDS_CHECK=1), every load and store is checked against
  the extent of its buffer; an access outside is recorded and skipped (a kiln bug, never a read
  of foreign memory).

The C++ helpers they call are in cpp_prelude. A failed check stores its site's code, the index
(-1 when not kept) and the bound in the entry's `int64_t kiln_err[3]` (its last argument); after
the entry returns, the wrapper raises the site's error with its message (`CheckSite`), naming the
kernel and the buffer or op.
"""
import dataclasses
import re

import sympy

from kiln.compiler.codegen.cpp_exprs import cindex

ERROR_FLAG = "kiln_err"  # the entry parameter (int64_t[3]: code, index, bound) a failed check fills
BAD_BITS = "kiln_bad"    # per kernel: bit k set when its k-th index check failed somewhere
_OMP_LOOP = re.compile(r"#pragma omp (parallel for|parallel|simd)\b")


def _with_bad_bits_reduction(line):
    """An OpenMP loop (or parallel region) line that also OR-reduces kiln_bad; other lines as they are."""
    return line + f" reduction(|:{BAD_BITS})" if _OMP_LOOP.search(line) else line


class KernelIndexError(IndexError, RuntimeError):
    """An index read from a tensor is out of range (eager raises IndexError for indexing,
    index_select, embedding and index_put, RuntimeError for gather and scatter)."""


class KernelBoundsError(RuntimeError):
    """Under debug_bounds_checks, a kernel reached outside a buffer: a kiln bug."""


@dataclasses.dataclass(frozen=True)
class CheckSite:
    code: int
    error: type
    message: str  # formatted with index= and bound= from the failed check


class Checks:
    """The check sites of one translation unit; codes start at 1 (0: nothing failed)."""

    def __init__(self, bounds_checks=False):
        self.bounds_checks = bounds_checks
        self.sites = []

    def site(self, error, message):
        self.sites.append(CheckSite(len(self.sites) + 1, error, message))
        return self.sites[-1].code


class Memory:
    """The buffers one kernel reaches: name -> C++ pointer and, with bounds checks, the C++
    expression of how many elements lie at and after that pointer."""

    def __init__(self, checks, kernel_name, pointers, extents=None):
        self.checks, self.kernel_name = checks, kernel_name
        self.pointers = pointers
        self.extents = extents if checks.bounds_checks else None
        self.index_sites = []  # (code, C++ bound) of the kernel's index checks: bit k of kiln_bad

    def load(self, name, index):
        """C++ for the element of buffer `name` at `index` (C++ text)."""
        pointer = self.pointers[name]
        if self.extents is None:
            return f"{pointer}[{index}]"
        code = self._bounds_site(name, "read")
        return f"kiln_checked_load({pointer}, {index}, {self.extents[name]}, {ERROR_FLAG}, {code})"

    def store(self, name, index, value):
        """A C++ statement setting the element of buffer `name` at `index`; `value` is C++ text, or
        a function of the element's C++ lvalue (read-modify-write)."""
        pointer = self.pointers[name]
        if self.extents is None:
            element = f"{pointer}[{index}]"
            return f"{element} = {value(element) if callable(value) else value};"
        code = self._bounds_site(name, "wrote")
        element = f"{pointer}[kiln_i]"
        return (f"{{ const int64_t kiln_i = {index}; if (kiln_in_bounds(kiln_i, {self.extents[name]}, {ERROR_FLAG}, "
                f"{code})) {element} = {value(element) if callable(value) else value}; }}")

    def checked_index(self, value, bound, what, wraps):
        """(C++ for the index `value` read from a tensor, or 0 when it is out of range, and the C++
        statement that records that in the kernel's `kiln_bad` bits). `bound` is the C++ of the
        dim's size (>= 1, in scope for the whole kernel); with `wraps`, -bound <= value < bound and
        negative values count from the end. Both are branch-free, so the loop still vectorizes."""
        code = self.index_site(what)
        bit = min(len(self.index_sites), 63)  # past 63 sites, the last bit names the last site
        self.index_sites.append((code, bound))
        fn = "kiln_wrapped_index" if wraps else "kiln_index"
        return (f"{fn}_or_zero({value}, {bound})",
                f"{BAD_BITS} |= (uint64_t){fn}_is_bad({value}, {bound}) << {bit};")

    def index_site(self, what):
        """The code of a check site for an index read from a tensor, out of range for `what`."""
        return self.checks.site(KernelIndexError, f"an index is out of bounds for {what} with size {{bound}} "
                                                  f"(kiln kernel {self.kernel_name})")

    def finish(self, lines):
        """The kernel's `lines` with its index checks wired in: `kiln_bad` declared before its loops,
        OR-reduced by every OpenMP loop of the kernel, and reported after them."""
        if not self.index_sites:
            return lines
        lines = [_with_bad_bits_reduction(line) for line in lines]
        report = [f"    if ({BAD_BITS}) {{"]
        for bit, (code, bound) in enumerate(self.index_sites[:64]):
            report.append(f"      if (({BAD_BITS} >> {min(bit, 63)}) & 1) "
                          f"kiln_fail(-1, {bound}, {ERROR_FLAG}, {code});")
        report.append("    }")
        return lines[:2] + [f"    uint64_t {BAD_BITS} = 0;"] + lines[2:-1] + report + lines[-1:]

    def _bounds_site(self, name, verb):
        return self.checks.site(KernelBoundsError, f"kiln kernel {self.kernel_name} {verb} buffer {name} out of "
                                                   f"bounds: element {{index}} of {{bound}} (a kiln bug: please report "
                                                   f"it with the program)")


def extent(layout):
    """C++ for how many elements a buffer of `layout` spans from its first (its pointer): 0 when
    it is empty (a symbolic size may be 0 when it runs)."""
    if any(s == 0 for s in layout.sizes):
        return "0"
    span = cindex(sympy.expand(1 + sum(((s - 1) * st for s, st in zip(layout.sizes, layout.strides)),
                                       sympy.Integer(0))))
    symbolic = [cindex(s) for s in layout.sizes if not s.is_number]
    return f"(({' || '.join(f'{s} == 0' for s in symbolic)}) ? (int64_t)0 : (int64_t){span})" if symbolic else span
