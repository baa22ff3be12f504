"""What kiln reads from torch that changed between the torch versions it supports, in one place.

Tested: torch 2.13 (Python 3.11), 2.11 (Python 3.12) and 2.14.1 (Python 3.13). Each name below is the
current torch's, with the older spelling as the fallback.
"""
from torch.amp import autocast_mode
from torch.fx.experimental import symbolic_shapes

# A concrete value for a (maybe symbolic) int, for estimates only (adds no guard): optimization_hint
# in torch 2.13+ (torch 2.11 has size_hint instead; 2.13 no longer does).
optimization_hint = getattr(symbolic_shapes, "optimization_hint", None) or symbolic_shapes.size_hint

# The autocast context that _enter_autocast (the graph's autocast node) enters: a plain subclass of
# torch.amp.autocast in torch 2.13+; torch 2.11 enters torch.amp.autocast itself.
UnmanagedAutocast = getattr(autocast_mode, "_UnmanagedAutocast", autocast_mode.autocast)
