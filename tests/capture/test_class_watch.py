"""A class guarded whole (class_watch): watches of classes sharing a base share that base's snapshot
(nn.Module's 80-odd attributes are remembered once, not per module class), and sharing never hides a
change: a base changed after capture recompiles every frame that read through it, a base patched
and put back (make_fx does that to nn.Module) does not, and a watch taken after a change snapshots
the class as it is then. Fingerprints for the capture cache (portable.class_fingerprint) are
remembered per class the same way and change with any class in the MRO. Eager is the oracle. (Where
version tags cannot be read, Python 3.13, nothing is shared and every check compares the dicts.)"""
import torch
from torch import nn

import kiln
from kiln.capture import class_watch, portable
from kiln.capture.class_watch import ClassWatch
from tests.utils import CompileCounter


def _classes():
    """Fresh classes per test: Base (its method read by forward) and two subclasses."""
    class Base(nn.Module):
        def scale(self, x):
            return x * 2

        def forward(self, x):
            return self.scale(x) + 1

    class A(Base):
        pass

    class B(Base):
        def forward(self, x):
            return self.scale(x) - 1
    return Base, A, B


def _base_snapshot(watch):
    return watch.snapshot[2][1]  # (the snapshots of A or B, Base, nn.Module, in MRO order)


def test_watches_share_a_base_snapshot_and_see_its_changes():
    Base, A, B = _classes()
    wa, wb = ClassWatch(A), ClassWatch(B)
    if class_watch.current_tag(Base) is not None:  # (shared under a version tag: where CPython's can be read)
        assert _base_snapshot(wa) is _base_snapshot(wb)
        assert wa.snapshot[2][2] is wb.snapshot[2][2]  # nn.Module's
    scale = Base.scale
    Base.scale = scale  # patched and put back: the tag moved, the dict is the same
    assert wa.unchanged_since_tag_moved() and wb.unchanged_since_tag_moved()
    Base.scale = lambda self, x: x * 3
    assert not wa.unchanged_since_tag_moved() and not wb.unchanged_since_tag_moved()
    later = ClassWatch(A)  # taken after the change: the class as it is now, not the shared older snapshot
    assert _base_snapshot(later) is not _base_snapshot(wa) and later.unchanged_since_tag_moved()


def test_a_changed_shared_base_recompiles_every_module_class():
    Base, A, B = _classes()
    counter = CompileCounter()
    a, b = A(), B()
    ca, cb = kiln.compile(a, backend=counter), kiln.compile(b, backend=counter)
    x = torch.randn(3)
    for _ in range(2):
        torch.testing.assert_close(ca(x), a(x))
        torch.testing.assert_close(cb(x), b(x))
    assert counter.frame_count == 2
    Base.scale = lambda self, x: x * 3
    torch.testing.assert_close(ca(x), a(x))
    torch.testing.assert_close(cb(x), b(x))
    assert counter.frame_count == 4


def test_a_class_fingerprint_follows_every_class_in_its_mro():
    Base, A, B = _classes()
    before = portable.class_fingerprint(A)
    portable.class_fingerprint(B)  # Base's part remembered
    assert portable.class_fingerprint(A) == before
    Base.scale = lambda self, x: x * 3
    assert portable.class_fingerprint(A) != before and portable.class_fingerprint(B) != before
    changed = portable.class_fingerprint(A)
    A.extra = 1
    assert portable.class_fingerprint(A) != changed


def test_a_class_fingerprint_ignores_the_caches_python_keeps_on_it():
    """copy.copy of an instance makes copyreg cache `__slotnames__` on its class (fake tensors do it to
    torch.Tensor during capture): the class does the same, so a stored entry that names it still loads
    in a process that never copied one."""
    import copy

    class Slotted:
        __slots__ = ("a",)

    before = portable.class_fingerprint(Slotted)
    obj = Slotted()
    obj.a = 1
    copy.copy(obj)
    assert "__slotnames__" in vars(Slotted)
    assert portable.class_fingerprint(Slotted) == before
