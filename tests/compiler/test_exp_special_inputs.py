"""kiln's own float exp (cpp_prelude.kiln_exp: NaN flows through its arithmetic, with no select of its
own) gives eager's answer at every special input: NaN of either sign and any payload, +-inf, the
edges where the result overflows to inf or underflows through denormals to 0, and +-0, in the
vectorized loop and in its scalar remainder, and in what is built from it (sigmoid, silu, tanh,
softmax, log-softmax)."""
import math
import struct

import pytest
import torch
import torch.nn.functional as F

import kiln


def _float_from_bits(bits):
    return struct.unpack("<f", struct.pack("<I", bits))[0]


# NaNs whose bits, read as an int, sit at both ends of int32 (the exp's integer steps must not care)
NAN_BITS = (0x7FC00000, 0x7FFFFFFF, 0x7F800001, 0xFFC00000, 0xFFFFFFFF, 0xFF800001)
EDGES = (88.72283905206835, 88.7228, 88.72284, 88.8, 89.0, 1e10, -87.33654, -87.4, -100.0, -103.97207708,
         -103.972, -104.0, -1e10, 0.0, -0.0, 1e-30, -1e-30, 0.5, -0.5, 20.0, -20.0)


def special_values():
    nans = torch.tensor(NAN_BITS, dtype=torch.int64).to(torch.int32).view(torch.float32)
    edges = torch.tensor(EDGES + (math.inf, -math.inf), dtype=torch.float32)
    # 3 x 37: the vectorized loop and a remainder; each special value meets each lane position
    return torch.cat([nans, edges, edges.flip(0), nans])


FUNCTIONS = {
    "exp": torch.exp,
    "sigmoid": torch.sigmoid,
    "silu": F.silu,
    "tanh": torch.tanh,
    "softmax": lambda x: torch.softmax(x.view(-1, x.shape[-1]), -1),
    "log_softmax": lambda x: torch.log_softmax(x.view(-1, x.shape[-1]), -1),
}


@pytest.mark.parametrize("name", sorted(FUNCTIONS))
@pytest.mark.parametrize("length", (111, 1))
def test_exp_and_what_uses_it_give_eager_answers_at_special_inputs(name, length):
    fn = FUNCTIONS[name]
    values = special_values()
    if length == 1:  # one element at a time: the scalar code
        inputs = [values[k:k + 1] for k in range(len(values))]
    else:  # whole rows (softmax: rows of 37, each special value in rows with and without NaN/inf)
        inputs = [values.repeat(3)[:length], values[6:6 + 37].repeat(3)[:length]]
    compiled = kiln.compile(fn, options={"graph_cache": False}, dynamic=False)
    for x in inputs:
        x = x.view(3, -1) if name.endswith("softmax") and x.numel() % 3 == 0 and x.numel() > 1 else x
        got, want = compiled(x), fn(x)
        assert torch.equal(got.isnan(), want.isnan()), f"{name}: NaN where eager has none, or the reverse, at {x}"
        torch.testing.assert_close(got, want, equal_nan=True, rtol=1e-6, atol=0)
