"""Known failures of the OpInfo sweep (tests/compiler/test_opinfo.py).

Key: the op's name as the sweep shows it ("name" or "name.variant"), optionally with "[dtype]"
("nn.functional.conv2d[int64]") to mark one dtype only. Value: the exact reason. Each entry runs
as xfail(strict=True), so a fix turns it into an XPASS failure: then delete the entry.
"""

KNOWN_FAILURES = {
}
